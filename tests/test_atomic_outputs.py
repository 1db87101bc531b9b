"""Issue 12 items 1-2 and Deliver 3: outputs appear whole or not at all; a refused or failed command (disk full
simulated with RLIMIT_FSIZE in a subprocess) leaves what was on disk byte-identical and no temporaries behind."""
import hashlib
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ulacache_cli.main import main

ROOT = Path(__file__).resolve().parent.parent
TINY = {"system": "sglang", "attention": "dp", "hardware": {"num_gpus": 2}, "model": {"weight_bytes": 100e9},
        "workload": {"profile": "small", "num_requests": 2, "max_steps": 3}}


def snapshot(root: Path) -> dict:
    """Every file under root (hidden ones included) -> sha256; dirs -> None."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def cli(*argv, fsize: int | None = None, timeout: float = 120):
    """Run the real `ulacache` in a subprocess (optionally with a file-size limit: writes past it fail EFBIG)."""
    def limit():
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "ulacache_cli", *map(str, argv)], capture_output=True, text=True,
                          preexec_fn=limit, cwd=ROOT, env=env, timeout=timeout)


def assert_refused(proc, needle=""):
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert err.startswith("ulacache: error:") and "\n" not in err and "Traceback" not in err, err
    assert needle in err, err


def assert_one_line(capsys, code, needle=""):
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("ulacache: error:") and "\n" not in err and needle in err, (code, err)


@pytest.fixture(scope="module")
def old_run(tmp_path_factory):
    """A finished replay run (the results a failed later command must not damage)."""
    root = tmp_path_factory.mktemp("run")
    cfg = root / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    assert main(["replay", str(cfg), "--out", str(root / "o"), "--quiet"]) == 0
    return root


def _copy_tree(src: Path, dst: Path) -> None:
    import shutil

    shutil.copytree(src, dst)


def test_replay_refuses_existing_run_without_force(old_run, tmp_path, capsys):
    _copy_tree(old_run, tmp_path / "w")
    before = snapshot(tmp_path)
    code = main(["replay", str(tmp_path / "w" / "c.yaml"), "--out", str(tmp_path / "w" / "o"), "--quiet"])
    assert_one_line(capsys, code, "pass --force to replace it")
    assert snapshot(tmp_path) == before


def test_replay_force_replaces_whole_run(old_run, tmp_path, capsys):
    _copy_tree(old_run, tmp_path / "w")
    out = tmp_path / "w" / "o"
    (out / "stale.txt").write_text("not written by ulacache")
    before = snapshot(tmp_path)
    code = main(["replay", str(tmp_path / "w" / "c.yaml"), "--out", str(out), "--quiet", "--force"])
    assert_one_line(capsys, code, "it holds stale.txt, which ulacache did not write")  # issue 27: never deleted
    assert snapshot(tmp_path) == before
    (out / "stale.txt").unlink()
    code = main(["replay", str(tmp_path / "w" / "c.yaml"), "--out", str(out), "--quiet", "--force",
                 "--set", "workload.max_steps=2"])
    assert code == 0, capsys.readouterr().err
    assert json.loads((out / "metrics.json").read_text())["decode_steps"] == 2
    assert sorted(p.name for p in out.iterdir()) == [".ulacache-manifest.json", "config.yaml", "metrics.json",
                                                    "timeline.parquet"]  # the run dir is replaced whole
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["c.yaml", "o"]  # no temporaries left


def test_replay_force_refuses_a_dir_that_is_not_a_run(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    code = main(["replay", str(cfg), "--out", str(tmp_path / "home"), "--force", "--quiet"])
    assert_one_line(capsys, code, "not written by ulacache")
    assert snapshot(tmp_path) == before


def test_replay_checks_out_before_simulating(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY, "workload": {**TINY["workload"], "num_requests": 200000}}))
    (tmp_path / "file").write_text("x")
    before = snapshot(tmp_path)
    # a 200,000-request replay would take minutes: the unwritable --out must be found first
    code = main(["replay", str(cfg), "--out", str(tmp_path / "file" / "o"), "--quiet"])
    assert_one_line(capsys, code, "is not a directory")
    assert snapshot(tmp_path) == before


def test_replay_disk_full_keeps_old_run(old_run, tmp_path):
    _copy_tree(old_run, tmp_path / "w")
    before = snapshot(tmp_path)
    proc = cli("replay", tmp_path / "w" / "c.yaml", "--out", tmp_path / "w" / "o", "--quiet", "--force",
               "--trace-events", tmp_path / "w" / "ev.json", fsize=64)
    assert_refused(proc, "File too large")
    assert snapshot(tmp_path) == before  # old timeline/metrics intact, no .tmp dirs, no ev.json


def test_replay_failed_write_removes_created_parents(old_run, tmp_path):
    cfg = old_run / "c.yaml"
    proc = cli("replay", cfg, "--out", tmp_path / "a" / "b" / "o", "--quiet", fsize=64)
    assert_refused(proc, "File too large")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------------ traces
@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    root = tmp_path_factory.mktemp("cap")
    good = root / "good.jsonl"
    good.write_text("\n".join(json.dumps({"request": 1, "step": s, "group": g, "positions": [s, 5 + g, 9],
                                          "history_len": 20}) for s in range(3) for g in range(2)) + "\n")
    bad = root / "bad.jsonl"
    bad.write_text(good.read_text() + '{"request": 1, "step": "x"\n')
    return good, bad


def test_convert_bad_capture_force_keeps_existing_trace(tmp_path, capture, capsys):
    good, bad = capture
    out = tmp_path / "t"
    assert main(["trace", "convert", str(good), "--out", str(out)]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert_one_line(capsys, main(["trace", "convert", str(bad), "--out", str(out), "--force"]), "not valid JSON")
    assert snapshot(tmp_path) == before
    assert_one_line(capsys, main(["trace", "convert", str(bad), "--out", str(tmp_path / "new")]), "not valid JSON")
    assert snapshot(tmp_path) == before  # no half-written directory blocks the next convert
    assert main(["trace", "convert", str(good), "--out", str(tmp_path / "new")]) == 0


def test_trace_gen_disk_full_keeps_existing_trace(tmp_path):
    out = tmp_path / "t"
    assert cli("trace", "gen", "--profile", "small", "--num-requests", "4", "--out", out).returncode == 0
    before = snapshot(tmp_path)
    proc = cli("trace", "gen", "--profile", "small", "--num-requests", "50", "--out", out, "--force",
               "--capture-steps", "2", fsize=1500)
    assert_refused(proc, "File too large")
    assert snapshot(tmp_path) == before


def test_trace_gen_refusals_leave_nothing(tmp_path, capsys):
    before = snapshot(tmp_path)
    for argv, needle in [
        (["--num-requests", "0"], "--num-requests must be in [1, 1,000,000]"),
        (["--num-requests", "1000000000"], "--num-requests must be in [1, 1,000,000]"),
        (["--num-requests", "4", "--seed", str(2**70)], "seed must be an integer in [0, 2^32 - 1]"),
        (["--num-requests", "4", "--seed", "-1"], "seed must be an integer in [0, 2^32 - 1]"),
    ]:
        code = main(["trace", "gen", "--profile", "small", "--out", str(tmp_path / "t"), *argv])
        assert_one_line(capsys, code, needle)
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------------------------ report, plan
def _results_dir(root: Path) -> Path:
    import pandas as pd

    sweep = root / "res" / "s"
    sweep.mkdir(parents=True)
    df = pd.DataFrame({"point_id": ["a", "b"], "status": ["ok", "ok"], "system": ["sglang", "ulacache"],
                       "workload.max_concurrency": [1, 1], "decode_throughput_tok_s": [10.0, 20.0],
                       "max_admitted_concurrency": [1, 1], "tpot_ms_p50": [5.0, 4.0], "tpot_ms_mean": [5.0, 4.0]})
    df.to_csv(sweep / "results.csv", index=False)
    (sweep / "results.parquet").write_bytes(b"PAR1 this is not parquet")
    return root / "res"


def test_report_reads_the_csv_beside_a_corrupt_parquet(tmp_path, capsys):
    res = _results_dir(tmp_path)
    assert main(["report", str(res), "--out", str(tmp_path / "rep")]) == 0, capsys.readouterr().err
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "2 replay runs" in page and "s/results.csv" in page and "unreadable results table" in page


def test_report_refuses_an_earlier_report_without_force(tmp_path, capsys):
    res = _results_dir(tmp_path)
    assert main(["report", str(res), "--out", str(tmp_path / "rep")]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    assert_one_line(capsys, main(["report", str(res), "--out", str(tmp_path / "rep")]), "pass --force")
    assert snapshot(tmp_path) == before
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "a.txt").write_text("keep")
    before = snapshot(tmp_path)
    assert_one_line(capsys, main(["report", str(res), "--out", str(tmp_path / "mine"), "--force"]),
                    "not written by ulacache")
    assert snapshot(tmp_path) == before
    assert main(["report", str(res), "--out", str(tmp_path / "rep"), "--force"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "rep", "res"]


def test_plan_refuses_an_earlier_plan_without_force(tmp_path, capsys):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "plan.json").write_text("{}")
    before = snapshot(tmp_path)
    code = main(["plan", "--model", "glm-5.2", "--hardware", "h200", "--slo-tpot-ms", "50", "--out",
                 str(tmp_path / "p")])
    assert_one_line(capsys, code, "pass --force to replace it")
    assert snapshot(tmp_path) == before


def test_report_disk_full_keeps_old_report(tmp_path):
    res = _results_dir(tmp_path)
    assert cli("report", res, "--out", tmp_path / "rep").returncode == 0
    before = snapshot(tmp_path)
    proc = cli("report", res, "--out", tmp_path / "rep", "--force", fsize=2000)
    assert_refused(proc, "File too large")
    assert snapshot(tmp_path) == before


def test_staged_dir_never_replaces_what_appeared_meanwhile(tmp_path):
    from traces.atomic import StagedDir

    out = tmp_path / "o"
    with pytest.raises(OSError, match="appeared while this command ran"):
        with StagedDir(out, command="replay") as stage:
            (stage.path / "metrics.json").write_text("new")
            out.mkdir()
            (out / "metrics.json").write_text("theirs")  # another command finished first
            stage.publish()
    assert (out / "metrics.json").read_text() == "theirs" and sorted(tmp_path.iterdir()) == [out]
    with pytest.raises(ValueError, match="not written by ulacache"):  # --force, but not our output
        with StagedDir(out, command="replay", replace=True) as stage:
            (stage.path / "metrics.json").write_text("new")
            stage.publish()
    assert (out / "metrics.json").read_text() == "theirs" and sorted(tmp_path.iterdir()) == [out]
    (out / "metrics.json").unlink()
    for text in ("ours", "new"):  # --force over our own earlier output
        with StagedDir(out, command="replay", replace=True) as stage:
            (stage.path / "metrics.json").write_text(text)
            stage.publish()
    assert (out / "metrics.json").read_text() == "new" and sorted(tmp_path.iterdir()) == [out]
