"""`ulacache trace ...` through the front door: outputs, exit codes, one-line errors without tracebacks."""
import json

import pytest

from ulacache_cli.main import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_gen_inspect_json(tmp_path, capsys):
    out = tmp_path / "t"
    code, o, e = run(capsys, "trace", "gen", "--profile", "multi-lexsum", "--num-requests", "32", "--out", str(out),
                     "--seed", "7", "--model", "glm-5.2")
    assert code == 0 and "wrote trace" in o
    code, o, e = run(capsys, "trace", "inspect", str(out), "--json", "--sample-requests", "16", "--sample-steps", "4")
    assert code == 0
    info = json.loads(o)
    st = info["stats"]
    assert info["lengths"]["num_requests"] == 32 and info["selections"]["num_groups"] == 21
    assert 0.38 <= st["step_overlap_deep_mean"] <= 0.50 and st["step_overlap_early_mean"] < 0.03
    assert st["spec_overlap_deep_mean"] > 0.6 and st["adjacent_overlap_deep_mean"] > 0.6
    assert info["bytes_on_disk"]["total"] > 0
    code, o, e = run(capsys, "trace", "inspect", str(out), "--sample-requests", "4", "--sample-steps", "2")
    assert code == 0 and "step-to-step overlap" in o and "bytes on disk" in o


def test_gen_from_csv_poisson_and_convert(tmp_path, capsys):
    csv = tmp_path / "r.csv"
    csv.write_text("input_tokens,output_tokens\n5000,40\n6000,30\n")
    code, o, e = run(capsys, "trace", "gen", "--from-csv", str(csv), "--out", str(tmp_path / "a"), "--num-groups", "3",
                     "--arrival", "poisson", "--rate", "2")
    assert code == 0, e
    cap = tmp_path / "c.jsonl"
    cap.write_text("\n".join(json.dumps({"request": 1, "step": s, "group": g, "positions": [[s, 5 + g], [s, 6]],
                                         "history_len": 20}) for s in range(3) for g in range(2)) + "\n")
    code, o, e = run(capsys, "trace", "convert", str(cap), "--out", str(tmp_path / "b"))
    assert code == 0, e
    code, o, e = run(capsys, "trace", "inspect", str(tmp_path / "b"), "--json")
    info = json.loads(o)
    assert code == 0 and info["selections"]["kind"] == "captured"
    assert info["bytes_on_disk"]["bytes_per_selection"] > 0


@pytest.mark.parametrize("argv, needle", [
    (["trace", "inspect", "{tmp}/missing"], "no such trace directory"),
    (["trace", "gen", "--out", "{tmp}/g"], "--num-requests is required"),
    (["trace", "gen", "--num-requests", "2", "--profile", "nope", "--out", "{tmp}/g"], "unknown profile 'nope'"),
    (["trace", "gen", "--num-requests", "2", "--num-groups", "0", "--out", "{tmp}/g"], "num_groups"),
    (["trace", "gen", "--num-requests", "2", "--arrival", "poisson", "--rate", "0", "--out", "{tmp}/g"], "rate_per_s"),
    (["trace", "convert", "{tmp}/bad.jsonl", "--out", "{tmp}/c"], "bad.jsonl: line 1: position 70 beyond"),
    (["trace", "gen", "--from-csv", "{tmp}/bad.csv", "--out", "{tmp}/g"], "bad.csv: line 2"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, needle):
    (tmp_path / "bad.jsonl").write_text('{"request": 0, "step": 0, "group": 0, "positions": [70], "history_len": 9}\n')
    (tmp_path / "bad.csv").write_text("input_tokens,output_tokens\nfoo,1\n")
    code, o, e = run(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2
    assert e.startswith("ulacache: error:") and needle in e
    assert e.count("\n") == 1 and "Traceback" not in e


def test_corrupt_trace_exits_2(tmp_path, capsys):
    out = tmp_path / "t"
    assert run(capsys, "trace", "gen", "--profile", "small", "--num-requests", "3", "--out", str(out),
               "--num-groups", "2", "--capture-steps", "2")[0] == 0
    data = (out / "selections.bin").read_bytes()
    (out / "selections.bin").write_bytes(data[:-50])
    code, o, e = run(capsys, "trace", "inspect", str(out))
    assert code == 2 and "selections.bin: truncated: record" in e and e.count("\n") == 1
    (out / "trace.yaml").write_text("schema_version: 2\n")
    code, o, e = run(capsys, "trace", "inspect", str(out))
    assert code == 2 and "unknown schema_version 2" in e
    # refusing to overwrite without --force
    code, o, e = run(capsys, "trace", "gen", "--num-requests", "2", "--out", str(out))
    assert code == 2 and "--force" in e
