"""Sweep scaling: the same >= 50-point sweep of small real replays with 1 worker (in-process) and 2 workers (Ray).

Prints points per minute for both and the speed-up; writes bench/results/sweep.json. The Ray run is timed end to
end (Ray start included) and without Ray's start-up (Ray started first, then the sweep timed).

    .venv/bin/python bench/sweep_bench.py [--config BASE.yaml] [--seeds 6]

Without --config the points use the built-in BENCH_CONFIG below (demo-sized: 4 short requests of the `small`
profile, 4 GB GPU / CPU KV budgets per GPU, 2 of 21 indexer groups through the policy, the policy every 4th step).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.studies.sweep import parse_grid, run_sweep  # noqa: E402

BENCH_CONFIG = {"system": "ulacache", "attention": "dp", "hardware": {"preset": "h200", "num_gpus": 8},
                "model": {"preset": "glm-5.2"},
                "workload": {"profile": "small", "num_requests": 4, "max_concurrency": 2, "seed": 0},
                "memory": {"gpu_kv_bytes_per_gpu": 4e9, "cpu_kv_bytes_per_gpu": 4e9},
                "fidelity": {"policy_groups": 2, "step_stride": 4}}
SETS: list[str] = []


def grid(seeds: int) -> list[str]:
    return ["system=sglang,hisparse,ulacache", "workload.max_concurrency=1,2,4",
            f"workload.seed={','.join(str(s) for s in range(seeds))}"]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def timed_sweep(config: Path, items: list[str], sets: list[str], workers: int, pre_start_ray: bool) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"sweep_bench_w{workers}_")) / "sweep"
    ray_start_s = 0.0
    if pre_start_ray:
        import ray

        t = time.perf_counter()
        ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level=logging.ERROR,
                 log_to_driver=False)
        ray_start_s = time.perf_counter() - t
    try:
        t = time.perf_counter()
        df = run_sweep(config, parse_grid(items), out, sets=sets, workers=workers)
        wall = time.perf_counter() - t
    finally:
        if pre_start_ray:
            import ray

            ray.shutdown()
        shutil.rmtree(out.parent, ignore_errors=True)
    n = len(df)
    ok = int((df["status"] == "ok").sum())
    return {"workers": workers, "executor": "in-process" if workers == 1 and not pre_start_ray else "ray",
            "num_points": n, "num_ok": ok, "wall_s": round(wall, 3), "ray_start_s": round(ray_start_s, 3),
            "points_per_min": round(60 * n / wall, 2),
            "points_per_min_incl_ray_start": round(60 * n / (wall + ray_start_s), 2),
            "mean_point_wall_s": round(float(df["point_wall_s"].mean()), 4),
            "mean_point_cpu_s": round(float(df["point_cpu_s"].mean()), 4),
            "errors": sorted(set(df.loc[df["status"] != "ok", "error"]))[:3]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=None, help="base config (default: the built-in BENCH_CONFIG)")
    ap.add_argument("--seeds", type=int, default=6, help="seeds per (system, cap): points = 9 x seeds")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "sweep.json")
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {args.seeds}")
    if args.config is not None and not args.config.is_file():
        ap.error(f"--config {args.config}: no such file")
    items = grid(args.seeds)
    load_before = os.getloadavg()
    if args.config is None:
        import yaml

        args.config = Path(tempfile.mkdtemp(prefix="sweep_bench_cfg_")) / "bench.yaml"
        args.config.write_text(yaml.safe_dump(BENCH_CONFIG))
        config_desc = {"builtin": BENCH_CONFIG}
    else:
        config_desc = str(args.config)
    runs = [timed_sweep(args.config, items, SETS, 1, pre_start_ray=False),
            timed_sweep(args.config, items, SETS, 2, pre_start_ray=True)]
    one, two = runs
    # Ray end to end (it starts and stops its own local Ray inside run_sweep)
    t = time.perf_counter()
    e2e = timed_sweep(args.config, items, SETS, 2, pre_start_ray=False)
    e2e["wall_incl_ray_start_s"] = round(time.perf_counter() - t, 3)
    result = {
        "bench": "sweep", "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "platform": platform.platform(),
                    "python": platform.python_version(),
                    "load_avg_1_5_15_before": [round(x, 2) for x in load_before],
                    "load_avg_1_5_15_after": [round(x, 2) for x in os.getloadavg()],
                    "note": "shared machine: other jobs may have run during the measurement (see load averages)"},
        "config": config_desc,
        "grid": items, "set": SETS, "runs": [one, two, e2e],
        "speedup_2_vs_1_workers": round(two["points_per_min"] / one["points_per_min"], 3),
        "speedup_2_vs_1_workers_incl_ray_start": round(e2e["points_per_min"] / one["points_per_min"], 3),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"sweep bench: {one['num_points']} points ({one['num_ok']} ok) on {os.cpu_count()} CPUs")
    print(f"  1 worker  (in-process): {one['points_per_min']:8.1f} points/min  ({one['wall_s']:.1f} s)")
    print(f"  2 workers (Ray)       : {two['points_per_min']:8.1f} points/min  ({two['wall_s']:.1f} s, "
          f"Ray start {two['ray_start_s']:.1f} s not counted)")
    print(f"  2 workers (Ray, e2e)  : {e2e['points_per_min']:8.1f} points/min  ({e2e['wall_s']:.1f} s incl. start)")
    print(f"  speed-up 2 vs 1: {result['speedup_2_vs_1_workers']:.2f}x "
          f"({result['speedup_2_vs_1_workers_incl_ray_start']:.2f}x with Ray start) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
