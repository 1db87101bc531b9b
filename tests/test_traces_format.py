"""On-disk format: round trips (requests, captured selections, converters) and refusal of corrupt input."""
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from traces import (
    CapturedSelections,
    SelectionSpec,
    SelectionWriter,
    SyntheticSelections,
    TraceError,
    capture_from_source,
    convert_capture,
    generate_requests,
    generate_trace,
    load_profile,
    open_trace,
    varint,
)
from traces.captured import INDEX_FILE, encode_record


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("tr") / "t"
    generate_trace(out, profile="small", num_requests=6, seed=4, num_groups=3, capture_steps=3,
                   capture_query_tokens=2)
    return out


def test_varint_round_trip():
    v = np.array([0, 1, 127, 128, 300, 16383, 16384, 2**35, 2**63 - 1], dtype=np.uint64)
    assert np.array_equal(varint.decode(varint.encode(v)), v)
    with pytest.raises(TraceError, match="truncated"):
        varint.decode(varint.encode(v)[:-1])


def test_requests_round_trip_and_regenerable(tmp_path):
    path = generate_trace(tmp_path / "t", profile="multi-lexsum", num_requests=50, seed=9, model="glm-5",
                          arrival="poisson", rate_per_s=2.0)
    tr = open_trace(path)
    again = generate_requests(tr.meta["profile_spec"], tr.meta["num_requests"], tr.meta["seed"],
                              arrival=tr.meta["arrival"]["process"], rate_per_s=tr.meta["arrival"]["rate_per_s"])
    pd.testing.assert_frame_equal(tr.requests, again)
    assert tr.num_groups == 78 and tr.top_k == 2048 and tr.selections.kind == "synthetic"
    assert list(tr.requests.columns) == ["request_id", "arrival_s", "input_tokens", "output_tokens"]
    # the synthetic source reopened is the same function
    src = SyntheticSelections(SelectionSpec.from_dict(tr.meta["selections"]["spec"]), tr.meta["selections"]["seed"])
    args = ([1, 2], [70_000, 90_000], [3, 4], 40, 2)
    assert np.array_equal(src.select(*args), tr.selections.select(*args))


def test_captured_equals_the_synthetic_source(small_trace):
    tr = open_trace(small_trace)
    assert tr.selections.kind == "captured"
    m = tr.meta["selections"]
    syn = SyntheticSelections(SelectionSpec.from_dict(m["source"]["spec"]), m["source"]["seed"])
    rid = tr.requests["request_id"].to_numpy()
    for step in (0, 2):
        hist = tr.requests["input_tokens"].to_numpy() + step
        for g in range(3):
            a = tr.selections.select(rid, hist, np.full(rid.size, step), g, 2)
            b = syn.select(rid, hist, np.full(rid.size, step), g, 2)
            assert np.array_equal(a, np.sort(b, -1))
    # shorter replay history masks the newest positions; missing steps and extra query tokens are errors
    a = tr.selections.select(rid[:1], hist[:1] - 10, [2], 1, 1)
    assert (a[a >= 0] < hist[0] - 10).all() and (a[0, 0, -10:] == -1).all()
    with pytest.raises(TraceError, match="no captured selections for request"):
        tr.selections.select(rid[:1], hist[:1], [7], 0, 1)
    with pytest.raises(TraceError, match="query tokens"):
        tr.selections.select(rid[:1], hist[:1], [0], 0, 3)
    n = sum(1 for _ in tr.selections.iter_records())
    assert n == m["num_records"] == 6 * 3 * 3


def test_bytes_per_selection_below_one(tmp_path):
    req = generate_requests("multi-lexsum", 4, seed=2)
    src = SyntheticSelections(SelectionSpec(num_groups=4), seed=1)
    meta = capture_from_source(src, req, tmp_path, num_steps=4, num_query_tokens=4)
    size = (tmp_path / "selections.bin").stat().st_size
    assert size / meta["num_selections"] < 1.0


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_convert_jsonl_and_npz_round_trip(tmp_path):
    rows = [{"request": r, "step": s, "layer": g, "positions": [[s, 10 + g, 50], [s, 11, 50]], "history_len": 60}
            for r in (3, 5) for s in range(2) for g in range(2)]
    meta = convert_capture(_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "j")
    src = CapturedSelections(tmp_path / "j" / "selections.bin", tmp_path / "j" / INDEX_FILE, top_k=4)
    out = src.select([5], [60], [1], 1, 2)
    assert out.tolist() == [[[1, 11, 50, -1], [1, 11, 50, -1]]]
    assert meta["num_records"] == 8 and meta["num_groups"] == 2
    npz = tmp_path / "c.npz"
    pos = np.array([[[4, 1, -1]], [[0, 2, 3]]])
    np.savez(npz, request=np.array([1, 1]), step=np.array([0, 1]), group=np.array([0, 0]), positions=pos)
    convert_capture(npz, tmp_path / "n")
    src = CapturedSelections(tmp_path / "n" / "selections.bin", tmp_path / "n" / INDEX_FILE, top_k=3)
    assert src.select([1, 1], [5, 4], [0, 1], 0, 1).tolist() == [[[1, 4, -1]], [[0, 2, 3]]]


@pytest.mark.parametrize("row, msg", [
    ({"request": 1, "step": 0, "group": 0, "positions": [1, 99], "history_len": 50}, "line 2: position 99 beyond"),
    ({"request": 1, "step": 0, "group": 0, "positions": [-3, 4]}, "line 2: negative position -3"),
    ({"request": 1, "step": 0, "group": 0, "positions": [4, 4]}, "line 2: duplicate position 4"),
    ({"request": 1, "step": 0, "positions": [4]}, "line 2: 'group/layer' must be"),
    ({"request": 0, "step": 0, "group": 0, "positions": [2]}, "line 2: duplicate \\(request 0, step 0, group 0\\)"),
])
def test_convert_rejects_bad_records(tmp_path, row, msg):
    path = _jsonl(tmp_path / "bad.jsonl", [{"request": 0, "step": 0, "group": 0, "positions": [1]}, row])
    with pytest.raises(TraceError, match=msg) as exc:
        convert_capture(path, tmp_path / "o")
    assert "bad.jsonl" in str(exc.value) and "\n" not in str(exc.value)


def test_convert_rejects_broken_json_and_npz(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"request": 0, "step": 0, "group": 0, "positions": [1]}\n{"request": 0,\n')
    with pytest.raises(TraceError, match="x.jsonl: line 2: not valid JSON"):
        convert_capture(p, tmp_path / "o1")
    z = tmp_path / "x.npz"
    z.write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(TraceError, match="x.npz: not a readable NPZ"):
        convert_capture(z, tmp_path / "o2")


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_truncated_and_corrupt_selection_files(small_trace, tmp_path):
    t1 = _copy(small_trace, tmp_path / "t1")
    data = (t1 / "selections.bin").read_bytes()
    (t1 / "selections.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=r"selections.bin: truncated: record \d+ \(request"):
        open_trace(t1)
    t2 = _copy(small_trace, tmp_path / "t2")
    b = bytearray(data)
    b[len(b) // 2] ^= 0xFF
    (t2 / "selections.bin").write_bytes(bytes(b))
    tr = open_trace(t2)
    with pytest.raises(TraceError, match="checksum mismatch"):
        list(tr.selections.iter_records())
    t3 = _copy(small_trace, tmp_path / "t3")
    (t3 / "selections.bin").write_bytes(data[:8] + (7).to_bytes(8, "little") + data[16:])
    with pytest.raises(TraceError, match="unknown selections schema version 7"):
        open_trace(t3)
    t4 = _copy(small_trace, tmp_path / "t4")
    (t4 / INDEX_FILE).write_bytes(b"PAR1 not parquet")
    with pytest.raises(TraceError, match="selections.index.parquet: unreadable index"):
        open_trace(t4)


def test_bad_trace_yaml_and_requests(small_trace, tmp_path):
    t = _copy(small_trace, tmp_path / "t")
    meta = yaml.safe_load((t / "trace.yaml").read_text())
    meta["schema_version"] = 99
    (t / "trace.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(TraceError, match="trace.yaml: unknown schema_version 99"):
        open_trace(t)
    meta["schema_version"] = 1
    meta["selections"]["bogus"] = 1
    (t / "trace.yaml").write_text(yaml.safe_dump(meta))
    with pytest.raises(TraceError, match="unknown key 'bogus'"):
        open_trace(t)
    del meta["selections"]["bogus"]
    (t / "trace.yaml").write_text(yaml.safe_dump(meta))
    (t / "requests.parquet").write_bytes((t / "requests.parquet").read_bytes()[:100])
    with pytest.raises(TraceError, match="requests.parquet: unreadable"):
        open_trace(t)
    with pytest.raises(TraceError, match="no such trace directory"):
        open_trace(tmp_path / "nope")


def test_writer_rejects_positions_outside_history(tmp_path):
    w = SelectionWriter(tmp_path)
    with pytest.raises(TraceError, match="record 0: position 10 beyond the history \\(history_len 10\\)"):
        w.add([0], [0], [0], [10], np.array([[[1, 10]]]))
    assert len(encode_record(np.array([[3, 1, -1]]))) == 3  # count 2, gaps 1 and 1


def test_profiles_load_and_reject_unknown_keys(tmp_path):
    assert load_profile("multi-lexsum").input_tokens.cap_tokens == 131072
    p = tmp_path / "p.yaml"
    p.write_text("input_tokens: {median_tokens: 10, sigma: 1, colour: red}\noutput_tokens: {median_tokens: 5, sigma: 1}\n")
    with pytest.raises(TraceError, match="p.yaml: input_tokens: unknown key 'colour'"):
        load_profile(p)
    with pytest.raises(TraceError, match="unknown profile 'nope'"):
        load_profile("nope")
