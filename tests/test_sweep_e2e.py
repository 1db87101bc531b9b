"""End to end with the real simulator: a small sweep (in-process), its resume, a report from it, and `plan`."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from reports import build_report
from sim.studies.sweep import parse_grid, run_sweep
from ulacache_cli.main import main

# small and fast: 4 short requests, 2 of the 21 indexer groups through the policy, policy every 4th step
FAST = {"system": "ulacache", "attention": "dp", "hardware": {"preset": "h200", "num_gpus": 8},
        "model": {"preset": "glm-5.2"},
        "workload": {"profile": "small", "num_requests": 4, "max_concurrency": 2, "seed": 0},
        "memory": {"gpu_kv_bytes_per_gpu": 4e9, "cpu_kv_bytes_per_gpu": 4e9},
        "fidelity": {"policy_groups": 2, "step_stride": 4}}


@pytest.fixture(scope="module")
def fast_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "fast.yaml"
    path.write_text(yaml.safe_dump(FAST))
    return path


@pytest.fixture(scope="module")
def real_sweep(fast_config, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "s"
    df = run_sweep(fast_config, parse_grid(["system=sglang,hisparse,ulacache", "workload.max_concurrency=1,2"]),
                   out, workers=1)
    return out, df


def test_real_sweep_table(real_sweep):
    out, df = real_sweep
    assert len(df) == 6 and (df["status"] == "ok").all(), df["error"].tolist()
    for col in ("decode_throughput_tok_s", "tpot_ms_p50", "gpu_hit_rate", "physical_kv_slots",
                "unique_history_positions", "max_admitted_concurrency", "hardware.preset", "memory.gpu_kv_bytes_per_gpu"):
        assert col in df.columns, col
    assert (df["decode_throughput_tok_s"] > 0).all()
    for rel in df["point_dir"]:
        for name in ("metrics.json", "config.yaml", "timeline.parquet"):
            assert (out / rel / name).exists()
        m = json.loads((out / rel / "metrics.json").read_text())
        row = df[df["point_dir"] == rel].iloc[0]
        assert m["decode_throughput_tok_s"] == pytest.approx(row["decode_throughput_tok_s"])
        assert m["system"] == row["system"]


def test_real_resume_redoes_nothing(real_sweep, fast_config):
    out, df = real_sweep
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("metrics.json")}
    again = run_sweep(fast_config, parse_grid(["system=sglang,hisparse,ulacache", "workload.max_concurrency=1,2"]),
                      out, workers=1, resume=True)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("metrics.json")} == stamps
    pd.testing.assert_frame_equal(again.sort_values("point_id").reset_index(drop=True),
                                  df.sort_values("point_id").reset_index(drop=True), check_dtype=False)


def test_report_from_real_sweep(real_sweep, tmp_path):
    out, _ = real_sweep
    index = build_report(out, tmp_path / "rep")
    page = index.read_text()
    for png in ("throughput_vs_concurrency.png", "peak_speedups.png", "capacity.png", "batch1_tpot.png"):
        assert (tmp_path / "rep" / png).exists() and f'src="{png}"' in page
    assert "Skipped: needs ulacache runs with both policy" in page


def test_unknown_key_exit_2(fast_config, tmp_path, capsys):
    status = main(["sweep", str(fast_config), "--grid", "workload.nope=1,2", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert status == 2 and "unknown config key" in err and err.count("\n") == 1
    assert not (tmp_path / "s").exists()


def test_plan_cli_real(fast_config, tmp_path, capsys):
    out = tmp_path / "plan"
    status = main(["plan", "--model", "glm-5.2", "--hardware", "h200", "--num-gpus", "8", "--gpu-kv-gb", "4",
                   "--cpu-kv-gb", "4", "--slo-tpot-ms", "1000", "--config", str(fast_config),
                   "--max-concurrency", "4", "--requests-per-cap", "1", "--workers", "2", "--out", str(out)])
    assert status == 0
    plan = json.loads((out / "plan.json").read_text())
    assert set(plan["systems"]) == {"sglang", "hisparse", "ulacache"}
    for name, entry in plan["systems"].items():
        best = entry["best"]
        assert best is not None and best["tpot_ms"] <= 1000, name
        evals = {e["concurrency"]: e for e in entry["evaluations"]}
        assert best["throughput_tok_s"] == max(e["throughput_tok_s"] for e in evals.values() if e["ok"])
        for c in evals:  # each evaluation is a real replay on disk
            m = json.loads((out / "runs" / name / f"c{c}" / "metrics.json").read_text())
            assert m["decode_throughput_tok_s"] == pytest.approx(evals[c]["throughput_tok_s"])
    assert (out / "plan.png").stat().st_size > 10_000
    assert "peak decode throughput" in capsys.readouterr().out


def test_sigkill_mid_sweep_then_resume(fast_config, tmp_path):
    """A real `ulacache sweep` killed with SIGKILL once some points are in the table; --resume finishes the rest
    without rerunning or losing the finished ones."""
    import io
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "s"
    grid = ["--grid", "system=sglang,ulacache", "--grid", "workload.max_concurrency=1,2,3"]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-m", "ulacache_cli", "sweep", str(fast_config), *grid, "--out", str(out),
                             "--workers", "1", "--no-progress"], cwd=root, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    table = out / "results.parquet"

    def rows_written() -> int:
        """Rows in the table now: read from one open of the file (pyarrow opens a path more than once, and a
        rewrite's os.replace between two opens tore a read: 'Couldn't deserialize thrift')."""
        return len(pd.read_parquet(io.BytesIO(table.read_bytes()))) if table.exists() else 0

    while proc.poll() is None and rows_written() < 2:
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = pd.read_parquet(table)
    assert 2 <= len(before) < 6 and (before["status"] == "ok").all()
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("metrics.json")}
    done = subprocess.run([sys.executable, "-m", "ulacache_cli", "sweep", str(fast_config), *grid, "--out",
                           str(out), "--workers", "1", "--no-progress", "--resume"], cwd=root, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    after = pd.read_parquet(table)
    assert len(after) == 6 and (after["status"] == "ok").all() and after["point_id"].is_unique
    for path, stamp in stamps.items():  # finished points were not replayed again
        assert path.stat().st_mtime_ns == stamp
    merged = before.merge(after, on="point_id", suffixes=("_b", "_a"))
    assert len(merged) == len(before)
    assert (merged["decode_throughput_tok_s_b"] == merged["decode_throughput_tok_s_a"]).all()


def test_run_demo_sweeps_layout(fast_config, tmp_path):
    from sim.studies.sweep import DEMO_SWEEPS, run_demo_sweeps

    assert set(DEMO_SWEEPS) == {"compare", "policy"}
    tiny = {"a": (["system=sglang", "workload.max_concurrency=1,2"], []),
            "b": (["system=sglang"], ["workload.max_concurrency=2", "workload.num_requests=2"])}
    out = run_demo_sweeps(fast_config, tmp_path, workers=1, progress=False, sweeps=tiny)
    assert [len(out["a"]), len(out["b"])] == [2, 1]
    assert (tmp_path / "a" / "results.parquet").exists() and (tmp_path / "b" / "results.csv").exists()
