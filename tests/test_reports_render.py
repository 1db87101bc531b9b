"""`ulacache report` renders every figure from result files, and skips (with a note) those whose data is absent.

Fixture: a sweep dir written by the real sweep machinery with a documented synthetic replay function
(`synthetic_replay` below: closed-form metrics shaped like the simulator's, NOT simulator output), a plan.json
written by the real plan search over the same function, and a validate.json with predicted/measured pairs.
tests/test_sweep_e2e.py renders a report from real replays.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from reports import build_report
from reports.collect import collect
from sim.studies.plan import Evaluation, _add_speedups, search_peak
from sim.studies.sweep import parse_grid, run_sweep

CAPACITY = {"sglang": 12, "hisparse": 24, "ulacache": 48}  # requests each system can admit (fixture numbers)


def synthetic_replay(config: dict, out_dir: Path) -> dict:
    """Closed-form fixture metrics: throughput grows with admitted concurrency, TPOT grows with batch."""
    system, c = config["system"], config["workload"]["max_concurrency"]
    cap = CAPACITY[system] * (2 if config["hardware"]["preset"] == "b300" else 1)
    if system == "ulacache" and not config["cpu_storage"]:
        cap //= 2
    n = min(c, cap)
    spec = config["spec"]["draft_tokens"] > 0
    tpot = (20.0 + 0.8 * n + (6.0 if system == "hisparse" else 0.0)) / (2.5 if spec else 1.0)
    pool = config["ulacache"]["gpu_pool_slots"] or 8192
    hit = 1.0 - 0.5 * math.exp(-pool / 4000) - (0.004 if config["policy"] == "pb-lru" else 0.0)
    metrics = {"system": system, "attention": config["attention"], "num_requests": 64, "completed_requests": 64,
               "max_admitted_concurrency": n, "decode_throughput_tok_s": 1000.0 * n / tpot, "tpot_ms_p50": tpot,
               "tpot_ms_mean": tpot * 1.05, "gpu_hit_rate": hit if system != "sglang" else 1.0,
               "pcie_bytes_per_token": 1e5 * (1 - hit), "nvlink_bytes_per_token": 0.0,
               "physical_kv_slots": n * 70_000 * (8 if system == "sglang" and config["attention"] == "tp" else 1),
               "unique_history_positions": n * 65_000, "sim_wall_s": 0.01}
    (out_dir / "metrics.json").write_text(json.dumps(metrics))
    return metrics


def fixture_resolve(config_path: Path, overrides: list) -> dict:
    config = yaml.safe_load(Path(config_path).read_text())
    for item in overrides:
        key, _, text = item.partition("=")
        node, parts = config, key.split(".")
        for part in parts[:-1]:
            node = node[part]
        if parts[-1] not in node:
            raise ValueError(f"unknown config key {key!r}")
        node[parts[-1]] = yaml.safe_load(text)
    return config


BASE = {"system": "ulacache", "attention": "dp", "policy": "pb-lru", "cpu_storage": True,
        "hardware": {"preset": "h200", "num_gpus": 8}, "spec": {"draft_tokens": 0},
        "workload": {"max_concurrency": 1, "num_requests": 64}, "ulacache": {"gpu_pool_slots": None}}


def make_results(root: Path, with_extras: bool = True) -> Path:
    base = root / "base.yaml"
    base.write_text(yaml.safe_dump(BASE))
    run_sweep(base, parse_grid(["system=sglang,hisparse,ulacache", "attention=dp,tp",
                                "workload.max_concurrency=1,4,16,64"]),
              root / "main", replay_fn=synthetic_replay, resolve=fixture_resolve)
    if not with_extras:
        return root
    run_sweep(base, parse_grid(["system=ulacache", "policy=pb-lru,lru", "workload.max_concurrency=4,16",
                                "ulacache.gpu_pool_slots=2048,4096,8192,16384"]),
              root / "policy", replay_fn=synthetic_replay, resolve=fixture_resolve)
    run_sweep(base, parse_grid(["system=sglang,hisparse,ulacache", "hardware.preset=b300", "spec.draft_tokens=4",
                                "workload.max_concurrency=1,16"]),
              root / "b300", replay_fn=synthetic_replay, resolve=fixture_resolve)
    plan = {"model": "glm-5.2", "hardware": "h200", "num_gpus": 8, "attention": "dp", "slo_tpot_ms": 40.0,
            "slo_metric": "tpot_ms_p50", "systems": {}}
    for system in CAPACITY:
        def evaluate(c, system=system):
            cfg = fixture_resolve(base, [f"system={system}", f"workload.max_concurrency={c}"])
            m = synthetic_replay(cfg, root)
            return Evaluation(c, m["decode_throughput_tok_s"], m["tpot_ms_p50"], m["max_admitted_concurrency"])
        r = search_peak(evaluate, 40.0, 64)
        plan["systems"][system] = {"best": dataclasses.asdict(r.best), "slo_edge": r.slo_edge,
                                   "ceiling": r.ceiling, "reason": r.reason, "num_replays": len(r.evaluations),
                                   "evaluations": [dataclasses.asdict(e) for e in r.evaluations]}
    (root / "metrics.json").unlink()
    _add_speedups(plan)
    (root / "plan").mkdir()
    (root / "plan" / "plan.json").write_text(json.dumps(plan))
    (root / "hw").mkdir()
    (root / "hw" / "validate.json").write_text(json.dumps({"mode": "tp", "ranks": 8, "per_step": [
        {"step": i, "predicted_s": 40e-6 * (i + 1) * 1.1, "measured_s": 40e-6 * (i + 1)} for i in range(6)]}))
    return root


@pytest.fixture(scope="module")
def full_report(tmp_path_factory):
    root = make_results(tmp_path_factory.mktemp("results"))
    return root, build_report(root)


def test_every_figure_rendered(full_report):
    root, index = full_report
    page = index.read_text()
    assert index == root / "report" / "index.html"
    for png in ("throughput_vs_concurrency.png", "peak_speedups.png", "capacity.png", "batch1_tpot.png",
                "transfer_bytes.png", "policy_hit_rate.png", "miss_ratio_curve.png", "sim_vs_hw.png", "plan_0.png"):
        assert (index.parent / png).stat().st_size > 10_000, png
        assert f'src="{png}"' in page
    assert "Skipped" not in page
    assert "speedup_vs_hisparse" in page and "Result files read" in page


def test_speedup_table_numbers_come_from_results(full_report):
    root, _ = full_report
    res = collect(root)
    main = res.runs[(res.runs["source"] == "main") & (res.runs["attention"] == "dp")]
    peaks = main.groupby("system")["decode_throughput_tok_s"].max()
    from reports.figures import peak_speedups
    from reports.frame import prepare

    fig = peak_speedups(prepare(res.runs), res, root / "report")
    t = fig.table
    row = t[(t["system"] == "ulacache (GPU+CPU)") & t["setting"].str.startswith("dp, h200, spec off")]
    assert len(row) == 1
    assert row["speedup_vs_hisparse"].iloc[0] == pytest.approx(peaks["ulacache"] / peaks["hisparse"])


def test_absent_data_is_skipped_with_a_note(tmp_path):
    make_results(tmp_path, with_extras=False)
    page = build_report(tmp_path, tmp_path / "out").read_text()
    assert page.count("Skipped:") == 4  # policy, miss-ratio curve, sim vs hw, plan
    assert "needs ulacache runs with both policy=pb-lru and policy=lru" in page
    assert "no hw validate.json" in page
    assert not (tmp_path / "out" / "miss_ratio_curve.png").exists()
    assert (tmp_path / "out" / "throughput_vs_concurrency.png").exists()


def test_bad_dirs(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        build_report(tmp_path / "nope")
    with pytest.raises(ValueError, match="no result files"):
        build_report(tmp_path)


def test_reports_imports_only_pandas_matplotlib_stdlib():
    import ast

    allowed = {"pandas", "matplotlib", "reports", "__future__"}
    for path in (Path(__file__).parents[1] / "reports").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                import sys

                assert top in allowed or top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_sim_vs_hw_errors_from_validate_json(full_report):
    root, _ = full_report
    from reports.figures import sim_vs_hw

    fig = sim_vs_hw(None, collect(root), root / "report")
    row = fig.table.iloc[0]
    assert row["steps"] == 6 and row["setting"] == "tp, 8 ranks"
    assert row["median_signed_error_pct"] == pytest.approx(10.0)
    assert row["measured_median_us"] == pytest.approx(140.0)


@pytest.fixture(scope="module")
def compare_dirs(tmp_path_factory):
    """Real `ulacache policy-compare` outputs on a tiny trace: with peers (when libcachesim is installed) and
    without (--no-peers, the note a missing extra leaves)."""
    from traces import generate_trace
    from ulacache_cli.main import main

    root = tmp_path_factory.mktemp("compare")
    trace = generate_trace(root / "trace", profile="small", num_requests=3, seed=5, num_groups=2)
    args = ["policy-compare", str(trace), "--gpu-slots", "7000,12000,20000", "--warmup-steps", "2", "--max-steps",
            "6", "--concurrency", "3"]
    assert main([*args, "--out", str(root / "with")]) == 0
    assert main([*args, "--out", str(root / "without"), "--no-peers"]) == 0
    return root


def test_policy_compare_curves_in_miss_ratio_figure(tmp_path, full_report, compare_dirs):
    import shutil

    from sim.studies import peers

    root = tmp_path / "r"
    shutil.copytree(full_report[0], root, ignore=shutil.ignore_patterns("report"))  # replays, plan, validation
    shutil.copytree(compare_dirs / "with", root / "peers")
    index = build_report(root)
    page = index.read_text()
    assert (index.parent / "miss_ratio_curve.png").stat().st_size > 10_000
    assert "peers/policy_compare.parquet" in page and "policy-compare panels" in page
    if peers.available() is not None:
        assert "belady" in page and "lcs-s3fifo" in page and "no libCacheSim curves" not in page
        assert "our exact lru minus libCacheSim LRU" in page


def test_policy_compare_without_peers_shows_a_note(tmp_path, compare_dirs):
    import shutil

    shutil.copytree(compare_dirs / "without", tmp_path / "ours")  # a dir holding only a policy_compare table
    page = build_report(tmp_path).read_text()
    assert "no libCacheSim curves" in page and "--no-peers" in page
    assert page.count("Skipped:") >= 7  # the other figures need replay results
    assert 'src="miss_ratio_curve.png"' in page


def test_policy_compare_corrupt_parquet_falls_back_to_csv_and_hidden_dirs_are_skipped(tmp_path, compare_dirs):
    import shutil

    from reports.policy_compare import find

    shutil.copytree(compare_dirs / "with", tmp_path / "a")
    (tmp_path / "a" / "policy_compare.parquet").write_bytes(b"not parquet")
    shutil.copytree(compare_dirs / "with", tmp_path / ".b.tmp-1")
    comps, notes = find(tmp_path)
    assert [c.path for c in comps] == ["a/policy_compare.csv"] and "unreadable" in notes[0]
    assert set(comps[0].table["policy"]) >= {"pb-lru", "lru"}
