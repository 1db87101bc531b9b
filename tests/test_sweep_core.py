"""Sweep machinery: grid parsing, results table, failure isolation, kill + resume (nothing lost or redone).

The replay and config-resolve functions are injected fakes here (deterministic, with a call log) so the tests check
the sweep machinery itself; tests/test_sweep_e2e.py runs the real simulator.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sim.studies.sweep import expand_grid, parse_grid, parse_sets, point_id, run_sweep

TESTS = Path(__file__).resolve().parent


# ---------------------------------------------------------------------------------------------- fakes
def fake_resolve(config_path: Path, overrides: list) -> dict:
    """Base YAML + dotted overrides; keys absent from the base are unknown (like the real loader)."""
    config = yaml.safe_load(Path(config_path).read_text())
    for item in overrides:
        key, _, text = item.partition("=")
        node, parts = config, key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"unknown config key {key!r}")
            node = node[part]
        if parts[-1] not in node:
            raise ValueError(f"unknown config key {key!r}")
        node[parts[-1]] = yaml.safe_load(text)
    return config


def fake_replay(config: dict, out_dir: Path) -> dict:
    """Deterministic metrics; logs each call; env FAKE_DIE_AT=n kills the process hard at call n."""
    log = os.environ.get("FAKE_CALL_LOG")
    calls = 0
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps([config["system"], config["workload"]]) + "\n")
        calls = len(Path(log).read_text().splitlines())
    die_at = int(os.environ.get("FAKE_DIE_AT", "0"))
    c = config["workload"]["max_concurrency"]
    if config["system"] == "broken" and c == 2:
        raise RuntimeError("simulated failure\nsecond line")
    metrics = {"system": config["system"], "decode_throughput_tok_s": 100.0 * c, "tpot_ms_p50": 10.0 + c,
               "max_admitted_concurrency": c, "sizes": [1, 2]}
    if die_at and calls == die_at:
        if os.environ.get("FAKE_DIE_MODE") == "after_metrics":
            (out_dir / "metrics.json").write_text(json.dumps(metrics))
        os._exit(9)
    (out_dir / "metrics.json").write_text(json.dumps(metrics))
    return metrics


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({"system": "sglang", "policy": "pb-lru",
                                    "workload": {"max_concurrency": 1, "seed": 0}}))
    return path


def sweep(base, out, grid, **kw):
    return run_sweep(base, parse_grid(grid), out, replay_fn=fake_replay, resolve=fake_resolve, **kw)


# ---------------------------------------------------------------------------------------------- parsing
def test_parse_grid_types_and_order():
    grid = parse_grid(["system=sglang,ulacache", "workload.max_concurrency=1,8", "cpu_storage=true,false",
                       "x.y=0.5"])
    assert grid == {"system": ["sglang", "ulacache"], "workload.max_concurrency": [1, 8],
                    "cpu_storage": [True, False], "x.y": [0.5]}
    assert len(expand_grid(grid)) == 8
    assert expand_grid(grid)[2]["workload.max_concurrency"] == 8 and expand_grid(grid)[1]["cpu_storage"] is False


@pytest.mark.parametrize("item", ["system", "=a,b", "system=", "system=a,,b", "a..b=1", "9x=1", "s=a,a"])
def test_parse_grid_rejects(item):
    with pytest.raises(ValueError, match="bad --grid"):
        parse_grid([item])


def test_parse_grid_rejects_duplicate_key():
    with pytest.raises(ValueError, match="given twice"):
        parse_grid(["a=1", "a=2"])
    with pytest.raises(ValueError, match="bad --set"):
        parse_sets(["novalue"])


def test_point_id_stable_and_order_free():
    a = {"system": "x", "workload": {"seed": 1, "max_concurrency": 4}}
    b = {"workload": {"max_concurrency": 4, "seed": 1}, "system": "x"}
    assert point_id(a) == point_id(b) and len(point_id(a)) == 16
    assert point_id(a) != point_id({**a, "system": "y"})


# ---------------------------------------------------------------------------------------------- table
def test_results_table_schema(base, tmp_path):
    df = sweep(base, tmp_path / "s", ["system=sglang,ulacache", "workload.max_concurrency=1,4"])
    assert list(df.columns[:5]) == ["point_id", "status", "error", "system", "workload.max_concurrency"]
    assert {"decode_throughput_tok_s", "tpot_ms_p50", "sizes", "point_dir", "policy", "point_wall_s",
            "point_cpu_s"} <= set(df.columns)
    assert (df["status"] == "ok").all() and len(df) == 4 and df["point_id"].is_unique
    pq = pd.read_parquet(tmp_path / "s" / "results.parquet")
    csv = pd.read_csv(tmp_path / "s" / "results.csv")
    assert list(pq.columns) == list(csv.columns) == list(df.columns)
    assert sorted(pq["decode_throughput_tok_s"]) == [100.0, 100.0, 400.0, 400.0]
    for rel in pq["point_dir"]:
        assert json.loads((tmp_path / "s" / rel / "metrics.json").read_text())["tpot_ms_p50"] > 10
    meta = yaml.safe_load((tmp_path / "s" / "sweep.yaml").read_text())
    assert len(meta["points"]) == 4 and meta["grid_keys"] == ["system", "workload.max_concurrency"]
    assert not list((tmp_path / "s").glob(".*tmp*"))


def test_failure_isolated(base, tmp_path):
    df = sweep(base, tmp_path / "s", ["system=broken,sglang", "workload.max_concurrency=1,2,3"])
    bad = df[df["status"] == "error"]
    assert len(df) == 6 and len(bad) == 1
    assert bad.iloc[0]["error"] == "RuntimeError: simulated failure second line"
    assert "\n" not in bad.iloc[0]["error"]
    assert (df[df["status"] == "ok"]["decode_throughput_tok_s"] > 0).all()


def test_refuses_existing_dir_and_bad_input(base, tmp_path):
    out = tmp_path / "s"
    sweep(base, out, ["workload.max_concurrency=1"])
    with pytest.raises(ValueError, match="--resume"):
        sweep(base, out, ["workload.max_concurrency=1"])
    with pytest.raises(ValueError, match="no sweep to resume"):
        sweep(base, tmp_path / "none", ["workload.max_concurrency=1"], resume=True)
    with pytest.raises(ValueError, match="unknown config key 'nope'"):
        sweep(base, tmp_path / "s2", ["nope=1,2"])
    with pytest.raises(ValueError, match="not found"):
        sweep(tmp_path / "missing.yaml", tmp_path / "s3", ["system=a"])
    assert not (tmp_path / "s2").exists()


# ---------------------------------------------------------------------------------------------- kill + resume
KILL_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from test_sweep_core import sweep
from pathlib import Path
sweep(Path({base!r}), Path({out!r}), {grid!r})
"""
GRID = ["system=sglang,ulacache", "workload.max_concurrency=1,2,3,4"]


@pytest.mark.parametrize("mode", ["before_metrics", "after_metrics"])
def test_kill_then_resume_loses_and_redoes_nothing(base, tmp_path, mode):
    out, log = tmp_path / "s", tmp_path / "calls.log"
    env = {**os.environ, "FAKE_CALL_LOG": str(log), "FAKE_DIE_AT": "4", "FAKE_DIE_MODE": mode}
    script = KILL_SCRIPT.format(tests=str(TESTS), base=str(base), out=str(out), grid=GRID)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    before = pd.read_parquet(out / "results.parquet")
    assert len(before) == 3 and (before["status"] == "ok").all()
    calls_before = log.read_text().splitlines()
    assert len(calls_before) == 4

    os.environ["FAKE_CALL_LOG"] = str(log)
    try:
        after = sweep(base, out, GRID, resume=True)
    finally:
        del os.environ["FAKE_CALL_LOG"]
    calls = log.read_text().splitlines()
    resumed_calls = calls[len(calls_before):]
    # after_metrics: point 4 wrote metrics.json before dying, so resume recovers it without running it again
    assert len(resumed_calls) == (8 - 3 if mode == "before_metrics" else 8 - 4)
    assert len(calls) == len(set(calls)) + (1 if mode == "before_metrics" else 0)
    assert len(after) == 8 and (after["status"] == "ok").all() and after["point_id"].is_unique
    merged = before.merge(after, on="point_id", suffixes=("_b", "_a"))
    assert (merged["decode_throughput_tok_s_b"] == merged["decode_throughput_tok_s_a"]).all()
    assert len(merged) == 3
    assert len(pd.read_csv(out / "results.csv")) == 8


def test_resume_reruns_only_errors_and_new_points(base, tmp_path, monkeypatch):
    out, log = tmp_path / "s", tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_CALL_LOG", str(log))
    sweep(base, out, ["system=broken", "workload.max_concurrency=1,2"])
    assert len(log.read_text().splitlines()) == 2
    df = sweep(base, out, ["system=broken", "workload.max_concurrency=1,2,3"], resume=True)
    assert len(log.read_text().splitlines()) == 4  # the error point again + the new point, not the ok one
    assert sorted(df["workload.max_concurrency"]) == [1, 2, 3]
    assert list(df.sort_values("workload.max_concurrency")["status"]) == ["ok", "error", "ok"]


@pytest.mark.slow
def test_ray_two_workers(base, tmp_path, monkeypatch):
    """The one test that starts Ray: a local 2-CPU Ray runs the points, one fails, all are recorded."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    df = sweep(base, tmp_path / "s", ["system=broken,sglang", "workload.max_concurrency=1,2,3"], workers=2)
    assert len(df) == 6 and (df["status"] == "error").sum() == 1
    assert "simulated failure" in df[df["status"] == "error"].iloc[0]["error"]
    assert len(pd.read_parquet(tmp_path / "s" / "results.parquet")) == 6
