"""Issue 27, the cases that must work (the refusals are in test_corpus_bad_inputs.py): --force over our own output,
the README's --trace-events inside --out, 4e-6 read as a number, a UTF-8 BOM CSV, policy-compare beside planted
links, sensitivity's sibling dirs, hw outputs replaced only with their manifest, one sweep per dir at a time, and a
local Ray on 127.0.0.1. Tiny configs: the file runs in well under a minute on 2 cores."""
from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ulacache_cli.main import main

ROOT = Path(__file__).resolve().parent.parent
TINY = {"system": "sglang", "attention": "dp", "hardware": {"num_gpus": 2}, "model": {"weight_bytes": 100e9},
        "workload": {"profile": "small", "num_requests": 2, "max_steps": 3}}


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*"))}


def refused(capsys, code: int, needle: str) -> None:
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("ulacache: error:") and "\n" not in err and needle in err, (code, err)


@pytest.fixture
def cfg(tmp_path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


def test_readme_trace_events_inside_out_and_force_over_our_own_run(tmp_path, cfg, capsys):
    out = tmp_path / "runs" / "x"
    argv = ["replay", str(cfg), "--out", str(out), "--trace-events", str(out / "perfetto.json"), "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads((out / "perfetto.json").read_text())["traceEvents"]
    manifest = json.loads((out / ".ulacache-manifest.json").read_text())
    assert manifest["command"] == "replay" and set(manifest["files"]) == {"metrics.json", "config.yaml",
                                                                         "timeline.parquet", "perfetto.json"}
    refused(capsys, main(argv), "pass --force")
    assert main(argv + ["--force", "--set", "workload.max_steps=2"]) == 0  # ours: replaced whole
    assert json.loads((out / "metrics.json").read_text())["decode_steps"] == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["x"]  # no temporaries left
    (out / "perfetto.json").write_text("edited by hand")  # changed since we wrote it: no longer replaced
    before = snapshot(tmp_path)
    refused(capsys, main(argv + ["--force"]), "perfetto.json changed since ulacache wrote it")
    assert snapshot(tmp_path) == before


def test_trace_events_file_outside_out_gets_a_manifest(tmp_path, cfg, capsys):
    ev = tmp_path / "ev.json"
    argv = ["replay", str(cfg), "--out", str(tmp_path / "o"), "--trace-events", str(ev), "--quiet"]
    assert main(argv) == 0
    assert json.loads((tmp_path / ".ev.json.ulacache-manifest.json").read_text())["files"]["ev.json"]["sha256"] == \
        hashlib.sha256(ev.read_bytes()).hexdigest()
    assert main(argv[:3] + [str(tmp_path / "o2")] + argv[4:] + ["--force"]) == 0  # our own file: replaced


@pytest.mark.parametrize("text", ["4e-6", "4.0e-6", "4E-6", "0.000004"])
def test_small_exponents_are_numbers_as_2_5e9_is(tmp_path, cfg, capsys, text):
    """YAML 1.1 reads 4e-6 as a string; the strict reader reads it as YAML 1.2 and JSON do."""
    out = tmp_path / "o"
    assert main(["replay", str(cfg), "--out", str(out), "--quiet", "--set", f"costs.launch_s={text}",
                 "--set", "memory.gpu_kv_bytes_per_gpu=2.5e9"]) == 0, capsys.readouterr().err
    tree = yaml.safe_load((out / "config.yaml").read_text())
    assert tree["costs"]["launch_s"] == pytest.approx(4e-6) and tree["memory"]["gpu_kv_bytes_per_gpu"] == 2.5e9


def test_exponent_in_a_config_file(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(TINY) + "costs: {graph_launch_s: 4e-6, step_overhead_s: 2e-4}\n")
    assert main(["replay", str(path), "--out", str(tmp_path / "o"), "--quiet"]) == 0, capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())["costs"]["step_overhead_s"] == 2e-4


def test_bom_csv_is_accepted(tmp_path, capsys):
    csv = tmp_path / "r.csv"
    csv.write_bytes("\ufeffinput_tokens,output_tokens\n100,10\n200,20\n".encode())
    assert main(["trace", "gen", "--from-csv", str(csv), "--out", str(tmp_path / "t")]) == 0, capsys.readouterr().err
    import pandas as pd

    assert pd.read_parquet(tmp_path / "t" / "requests.parquet")["input_tokens"].tolist() == [100, 200]


def test_policy_compare_ignores_planted_links_at_temp_names(tmp_path, capsys):
    from traces import generate_trace

    trace = generate_trace(tmp_path / "t", profile="small", num_requests=3, seed=3, num_groups=2)
    out, victim = tmp_path / "pc", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("keep me")
    for name in ("policy_compare.parquet", "policy_compare.csv", "policy_compare.json"):
        for tmp in (f".{name}.tmp", f".{name}.tmp-0"):  # the old fixed temp names and a guess at new ones
            (out / tmp).symlink_to(victim)
    args = ["policy-compare", str(trace), "--out", str(out), "--gpu-slots", "7000", "--warmup-steps", "2",
            "--max-steps", "4", "--concurrency", "3", "--no-peers"]
    assert main(args) == 0, capsys.readouterr().err
    assert main(args + ["--force"]) == 0  # ours, with their manifests
    assert victim.read_text() == "keep me"
    assert all((out / f".{n}.tmp").is_symlink() for n in ("policy_compare.csv", "policy_compare.json"))
    assert (out / ".policy_compare.csv.ulacache-manifest.json").is_file()


def test_sensitivity_force_keeps_sibling_dirs(tmp_path):
    from ulacache_cli.sensitivity import write

    out = tmp_path / "sens"
    sibling = tmp_path / ".sens.old"
    sibling.mkdir()
    (sibling / "precious.txt").write_text("not ours")
    result = {"rows": [{"constant": "launch_s", "factor": 0.5, "d_throughput_tok_s_pct": 1.0}]}
    write(result, out)
    with pytest.raises(ValueError, match="pass --force"):
        write(result, out)
    write(result, out, force=True)
    assert (sibling / "precious.txt").read_text() == "not ours"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".sens.old", "sens"]


def test_hw_calibrate_and_validate_outputs_are_staged_and_owned(tmp_path, capsys):
    cal = tmp_path / "cal" / "h200.yaml"
    argv = ["hw", "calibrate", "--from-json", str(ROOT / "hw/results/calibration.json"), "--hisparse-json",
            str(ROOT / "hw/results/hisparse_swapin.json"), "--out", str(cal), "--json", str(tmp_path / "raw.json")]
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in cal.parent.iterdir()) == [".h200.yaml.ulacache-manifest.json",
                                                            ".h200_single_gpu.yaml.ulacache-manifest.json",
                                                            "h200.yaml", "h200_single_gpu.yaml"]
    assert (tmp_path / ".raw.json.ulacache-manifest.json").is_file()
    refused(capsys, main(argv), "exists; pass --force")
    assert main(argv + ["--force"]) == 0
    capsys.readouterr()
    run = str(ROOT / "hw/results/validate_tp2.json")
    val = ["hw", "validate", "--from-json", run, "--calibration", str(cal), "--out", str(tmp_path / "v.json")]
    assert main(val) == 0 and main(val + ["--force"]) == 0
    refused(capsys, main(["hw", "validate", "--from-json", run, "--out", str(cal), "--force"]),
            "it is the output of `ulacache hw calibrate`, not of `ulacache hw validate`")


def test_second_sweep_into_a_dir_in_use_is_refused(tmp_path, cfg, capsys):
    """A sweep holds DIR/.ulacache-lock; another into the same new dir exits 2 instead of writing half the points."""
    out = tmp_path / "s"
    out.mkdir()
    with open(out / ".ulacache-lock", "w") as held:  # what a running sweep holds
        fcntl.flock(held, fcntl.LOCK_EX)
        before = snapshot(tmp_path)
        code = main(["sweep", str(cfg), "--grid", "workload.seed=1,2", "--out", str(out), "--workers", "1",
                     "--no-progress"])
        refused(capsys, code, "another `ulacache sweep` is writing this sweep dir now")
        assert snapshot(tmp_path) == before
    assert main(["sweep", str(cfg), "--grid", "workload.seed=1,2", "--out", str(out), "--workers", "1",
                 "--no-progress"]) == 0  # the lock file alone does not make the dir "not empty"
    assert json.loads((out / ".ulacache-manifest.json").read_text())["command"] == "sweep"


def test_two_sweep_processes_into_one_new_dir(tmp_path, cfg):
    """The race of issue 27: two real `ulacache sweep` processes; exactly one runs, the other is refused."""
    out = tmp_path / "s"
    argv = [sys.executable, "-m", "ulacache_cli", "sweep", str(cfg), "--grid", "workload.seed=1,2,3,4",
            "--out", str(out), "--workers", "1", "--no-progress"]
    first = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and first.poll() is None:  # wait until the first holds the lock
        try:
            fd = open(out / ".ulacache-lock")
        except OSError:
            time.sleep(0.05)
            continue
        with fd:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                time.sleep(0.05)
            except OSError:
                break
    second = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1[-2000:]
    assert second.returncode == 2 and second.stderr.startswith("ulacache: error:"), second.stderr[-2000:]
    import pandas as pd

    assert len(pd.read_parquet(out / "results.parquet")) == 4  # all the first sweep's points, none lost


def test_local_ray_binds_loopback(monkeypatch, tmp_path, cfg):
    ray = pytest.importorskip("ray")
    seen = {}

    class Stop(Exception):
        pass

    def fake_init(*args, **kwargs):
        seen.update(kwargs)
        raise Stop("stop here")

    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    assert main(["sweep", str(cfg), "--grid", "workload.seed=1,2", "--workers", "2", "--out",
                 str(tmp_path / "s"), "--no-progress"]) == 2
    assert seen["address"] == "local" and seen["_node_ip_address"] == "127.0.0.1"
    assert ray_constants.ENABLE_RAY_CLUSTER is False  # the node IP resolves to loopback, not the host's address
    import os

    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # and so in the processes Ray spawns


def _cli(*argv, fsize: int | None = None):
    """The real `ulacache` in a subprocess, optionally under a file-size limit (writes past it fail: disk full)."""
    import os
    import resource
    import signal

    def limit():
        if fsize is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run([sys.executable, "-m", "ulacache_cli", *map(str, argv)], capture_output=True, text=True,
                          preexec_fn=limit, cwd=ROOT, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, timeout=300)


@pytest.mark.parametrize("command", ["validate", "calibrate"])
def test_hw_output_disk_full_keeps_the_old_file(tmp_path, command):
    """Issue 27: `hw validate/calibrate --out` wrote in place (a truncated file on a full disk); now staged."""
    out = tmp_path / ("v.json" if command == "validate" else "h200.yaml")
    argv = (["hw", "validate", "--from-json", ROOT / "hw/results/validate_tp2.json", "--out", out]
            if command == "validate" else
            ["hw", "calibrate", "--from-json", ROOT / "hw/results/calibration.json", "--out", out])
    first = _cli(*argv)
    assert first.returncode == 0, first.stderr[-2000:]
    before = snapshot(tmp_path)
    proc = _cli(*argv, "--force", fsize=2000)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.startswith("ulacache: error:") and "\n" not in err, err
    assert "File too large" in err, err
    assert snapshot(tmp_path) == before  # the old output and its manifest intact, no temporaries
