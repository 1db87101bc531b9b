"""Issue 10 item 3 (last sentence) and issue 12 item 7: a replay killed by a signal in a sweep is an error row naming
the signal, nothing else is lost; a failed results write leaves no temporary file behind."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pandas as pd
import pytest
import yaml

import sim
from sim.studies.sweep import ResultsTable, death_message, parse_grid, run_point, run_sweep, sim_replay


def resolve(config_path: Path, overrides: list) -> dict:
    config = yaml.safe_load(Path(config_path).read_text())
    for item in overrides:
        key, _, text = item.partition("=")
        config[key] = yaml.safe_load(text)
    return config


def replay_or_die(config: dict, out_dir: Path) -> dict:
    """Module-level (forkable) fake: `die` names a signal to kill itself with."""
    if config.get("die") not in (None, "", "none"):
        os.kill(os.getpid(), getattr(signal, config["die"]))
    metrics = {"system": config["system"], "decode_throughput_tok_s": 1.0}
    (out_dir / "metrics.json").write_text('{"system": "%s"}' % config["system"])
    return metrics


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({"system": "sglang", "die": ""}))
    return path


def test_death_message_names_the_signal():
    assert death_message(-signal.SIGKILL) == "killed by SIGKILL (out of memory? the kernel's OOM killer sends SIGKILL)"
    assert death_message(-signal.SIGTERM) == "killed by SIGTERM"
    assert "status 3" in death_message(3)


def test_killed_point_is_an_error_row_and_the_sweep_goes_on(base, tmp_path):
    grid = parse_grid(["system=sglang,hisparse,ulacache", "die=none,SIGKILL"])
    df = run_sweep(base, grid, tmp_path / "s", replay_fn=replay_or_die, resolve=resolve, isolate=True)
    assert len(df) == 6
    dead = df[df["die"] == "SIGKILL"]
    assert set(dead["status"]) == {"error"}
    assert all("killed by SIGKILL (out of memory?" in e for e in dead["error"])
    alive = df[df["die"] != "SIGKILL"]
    assert set(alive["status"]) == {"ok"} and sorted(alive["system"]) == ["hisparse", "sglang", "ulacache"]
    on_disk = pd.read_csv(tmp_path / "s" / "results.csv")
    assert len(on_disk) == 6 and (on_disk["status"] == "error").sum() == 3


def test_other_signals_are_named(tmp_path):
    out = run_point(replay_or_die, {"system": "x", "die": "SIGTERM"}, str(tmp_path / "p"), isolate=True)
    assert out["status"] == "error" and "killed by SIGTERM" in out["error"]
    out = run_point(replay_or_die, {"system": "x", "die": ""}, str(tmp_path / "q"), isolate=True)
    assert out["status"] == "ok" and out["metrics"]["system"] == "x" and out["point_wall_s"] > 0


def test_the_real_replay_is_isolated_by_default(monkeypatch, tmp_path):
    """sim_replay (the default) runs in a child: a replay the kernel kills does not take the sweep with it."""
    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(sim, "replay", killed)  # inherited by the forked child
    out = run_point(sim_replay, {"system": "x"}, str(tmp_path / "points" / "p"))
    assert out["status"] == "error" and "killed by SIGKILL" in out["error"]
    assert [p.name for p in (tmp_path / "points").iterdir()] == ["p"]  # no staged temporaries left behind


def test_failed_results_write_leaves_no_tmp(tmp_path, monkeypatch):
    table = ResultsTable(tmp_path, ["system"])

    def full(self, path, *a, **k):
        Path(path).write_bytes(b"PAR1 partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full)
    from sim.studies.sweep import Point

    with pytest.raises(OSError):
        table.add(Point("abc", {"system": "x"}, {"system": "x"}), {"status": "ok", "metrics": {}})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_killed_point_on_ray_is_named_too(base, tmp_path, monkeypatch):
    """With Ray workers (the default for workers > 1) the replay runs in a child of the worker, so the worker
    survives and reports the signal."""
    pytest.importorskip("ray")
    tests = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    grid = parse_grid(["system=sglang,hisparse", "die=none,SIGKILL"])
    df = run_sweep(base, grid, tmp_path / "s", replay_fn=replay_or_die, resolve=resolve, isolate=True, workers=2)
    dead = df[df["die"] == "SIGKILL"]
    assert len(df) == 4 and set(dead["status"]) == {"error"}
    assert all("killed by SIGKILL" in e for e in dead["error"]), list(dead["error"])
    assert set(df[df["die"] != "SIGKILL"]["status"]) == {"ok"}


def test_resume_reads_the_csv_when_the_parquet_is_damaged(base, tmp_path):
    grid = parse_grid(["system=sglang,hisparse"])
    run_sweep(base, grid, tmp_path / "s", replay_fn=replay_or_die, resolve=resolve)
    (tmp_path / "s" / "results.parquet").write_bytes(b"PAR1 damaged")
    calls = []

    def counting(config, out_dir):
        calls.append(config["system"])
        return replay_or_die(config, out_dir)

    grid = parse_grid(["system=sglang,hisparse,ulacache"])
    df = run_sweep(base, grid, tmp_path / "s", replay_fn=counting, resolve=resolve, resume=True)
    assert calls == ["ulacache"] and len(df) == 3 and set(df["status"]) == {"ok"}
    (tmp_path / "s" / "results.parquet").write_bytes(b"PAR1 damaged")
    (tmp_path / "s" / "results.csv").write_bytes(b"\x00\x01")
    before = {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir() if p.is_file()}
    with pytest.raises(ValueError, match="results table unreadable"):
        run_sweep(base, grid, tmp_path / "s", replay_fn=counting, resolve=resolve, resume=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "s").iterdir() if p.is_file()} == before


def test_memory_error_in_a_point_names_the_knobs(tmp_path):
    def oom(config, out_dir):
        raise MemoryError()

    out = run_point(oom, {"system": "x"}, str(tmp_path / "p"))
    assert out["status"] == "error" and "out of memory" in out["error"] and "workload.num_requests" in out["error"]
