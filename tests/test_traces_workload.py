"""Request traces: the multi-lexsum shape, seeding, arrivals, user CSV/JSONL import."""
import numpy as np
import pytest

from traces import TraceError, generate_requests, import_requests


def test_multi_lexsum_shape():
    df = generate_requests("multi-lexsum", 4000, seed=0)
    inp, out = df["input_tokens"].to_numpy(), df["output_tokens"].to_numpy()
    assert inp.min() >= 65536 and inp.max() == 131072
    at_cap = np.mean(inp == 131072)
    assert 0.42 <= at_cap <= 0.58  # "about half of the kept cases sit at the cap"
    below = inp[inp < 131072]
    assert np.median(below) < 100_000  # the lognormal tail spreads below the cap
    assert out.min() >= 200 and out.max() <= 6000 and 600 <= np.median(out) <= 1500
    assert (df["arrival_s"] == 0).all() and df["request_id"].tolist() == list(range(4000))


def test_seeded_and_poisson():
    a = generate_requests("multi-lexsum", 100, seed=1)
    assert a.equals(generate_requests("multi-lexsum", 100, seed=1))
    assert not a.equals(generate_requests("multi-lexsum", 100, seed=2))
    p = generate_requests("small", 2000, seed=1, arrival="poisson", rate_per_s=4.0)
    gaps = np.diff(np.concatenate([[0.0], p["arrival_s"].to_numpy()]))
    assert (gaps >= 0).all() and abs(gaps.mean() - 0.25) < 0.03
    s = generate_requests("small", 500, seed=3)["input_tokens"]
    assert s.min() >= 8192 and s.max() <= 16384


def test_import_csv_and_jsonl(tmp_path):
    c = tmp_path / "r.csv"
    c.write_text("input_tokens,output_tokens,arrival_s\n1000,10,0.5\n2000,20,0.1\n")
    df = import_requests(c)
    assert df["input_tokens"].tolist() == [2000, 1000] and df["arrival_s"].tolist() == [0.1, 0.5]
    j = tmp_path / "r.jsonl"
    j.write_text('{"input_tokens": 5, "output_tokens": 6}\n\n{"input_tokens": 7, "output_tokens": 8}\n')
    df = import_requests(j, arrival="poisson", rate_per_s=1.0)
    assert df["input_tokens"].tolist() == [5, 7] and (df["arrival_s"] > 0).all()


@pytest.mark.parametrize("text, msg", [
    ("input_tokens,output_tokens\n10,x\n", "line 2: output_tokens must be an integer"),
    ("input_tokens,output_tokens\n10,5\n0,5\n", "line 3: input_tokens must be an integer >= 1"),
    ("input_tokens,output_tokens,colour\n10,5,red\n", "line 2: unknown column 'colour'"),
    ("input_tokens,output_tokens,arrival_s\n10,5,-1\n", "line 2: arrival_s must be a number >= 0"),
    ("input_tokens\n10\n", "line 2: missing 'output_tokens'"),
    ("", "empty file"),
])
def test_import_errors_name_file_and_line(tmp_path, text, msg):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(TraceError, match=msg) as exc:
        import_requests(p)
    assert "bad.csv" in str(exc.value)


def test_request_columns_match_the_dataframe():
    """The numpy columns a replay reads are the DataFrame's values, and sort as DataFrame.sort_values does."""
    from traces.workload import RequestColumns, generate_request_columns

    df = generate_requests("small", 300, seed=5, arrival="poisson", rate_per_s=50.0)
    cols = generate_request_columns("small", 300, seed=5, arrival="poisson", rate_per_s=50.0)
    assert len(cols) == 300 and tuple(cols.columns) == tuple(df.columns)
    for c in df.columns:
        assert cols[c].dtype == df[c].dtype and np.array_equal(cols[c], df[c].to_numpy())
    shuffled = df.sample(frac=1.0, random_state=0)
    shuffled.loc[shuffled.index[:50], "arrival_s"] = 1.0  # ties on arrival: the request id orders them
    want = shuffled.sort_values(["arrival_s", "request_id"], kind="stable")
    got = RequestColumns.of(shuffled).by_arrival()
    for c in df.columns:
        assert np.array_equal(got[c], want[c].to_numpy())
    with pytest.raises(KeyError):
        cols["nope"]
