"""PB-LRU vs exact LRU inside the simulator on issue 11's paired replay (item 7): the same config under both policies.

Config (pinned keys only, every other key at its default): ulacache, DP, h200 x 8, glm-5, 4 draft tokens, 128
requests at concurrency 64, seed 11. Prints and writes each policy's GPU hit rate, the gap in points, throughput,
wall and CPU seconds under `--label` in bench/results/pblru_gap.json (other labels kept, so "before" and "after" sit
side by side). ULACACHE_BENCH_LIB=DIR measures another copy of the code (e.g. `git archive` of an older commit;
ULACACHE_BENCH_COMMIT names it where DIR is no git checkout).

    .venv/bin/python bench/pblru_gap.py --label after [--policies lru pb-lru] [--library-gap]

--library-gap adds bench/policy_bench.py's library-only gap table (locality workloads, pools of 16K-64K slots,
4/16/32 recent buckets, 80 steps, 2 seeds) for the same code.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = Path(os.environ.get("ULACACHE_BENCH_LIB") or ROOT)
sys.path.insert(0, str(LIB))
import sim  # noqa: E402

OUT = ROOT / "bench" / "results" / "pblru_gap.json"
CONFIG = {"system": "ulacache", "attention": "dp", "cpu_storage": True, "hardware": {"preset": "h200", "num_gpus": 8},
          "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 4},
          "workload": {"num_requests": 128, "max_concurrency": 64, "seed": 11}}
KEYS = ("gpu_hit_rate", "decode_throughput_tok_s", "run_throughput_tok_s", "pcie_bytes_per_token", "completed_requests")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(policy: str) -> dict:
    t0, c0 = time.perf_counter(), _cpu_s()
    m = sim.replay({**CONFIG, "policy": policy})
    return {"policy": policy, **{k: m[k] for k in KEYS}, "wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--policies", nargs="*", default=["lru", "pb-lru"], choices=["lru", "pb-lru"])
    ap.add_argument("--library-gap", action="store_true", help="also policy_bench.hit_rate_gap(80 steps, 2 seeds)")
    args = ap.parse_args()
    load_before = os.getloadavg()
    rows = []
    for p in args.policies:
        rows.append(run(p))
        r = rows[-1]
        print(f"{args.label} {p}: gpu_hit_rate {r['gpu_hit_rate']:.5f} ({r['cpu_s']:.0f} CPU s)", flush=True)
    git = lambda *a: subprocess.run(["git", "-C", str(LIB), *a], capture_output=True, text=True).stdout.strip()
    commit = os.environ.get("ULACACHE_BENCH_COMMIT") or git("rev-parse", "--short", "HEAD")
    dirty = "ULACACHE_BENCH_COMMIT" not in os.environ and bool(git("status", "--porcelain", "--untracked-files=no"))
    rec = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name, *sys.argv]), "code": str(LIB), "commit": commit,
           "uncommitted_changes": dirty, "config": CONFIG, "runs": rows,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "load_avg_before": load_before, "load_avg_after": os.getloadavg()}}
    if args.library_gap:
        spec = importlib.util.spec_from_file_location("policy_bench", ROOT / "bench" / "policy_bench.py")
        policy_bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(policy_bench)
        rec["library_gap"] = policy_bench.hit_rate_gap(steps=80, seeds=2)
        for r in rec["library_gap"]:
            print(f"{args.label} library gpu {r['gpu_slots']} K={r['num_recent_buckets']} seed {r['seed']}: "
                  f"{r['gap_points']:+.3f} points")
    by = {r["policy"]: r["gpu_hit_rate"] for r in rows}
    if {"lru", "pb-lru"} <= set(by):
        rec["gap_points"] = (by["lru"] - by["pb-lru"]) * 100
        print(f"{args.label}: lru - pb-lru = {rec['gap_points']:.3f} points")
    data = json.loads(OUT.read_text()) if OUT.exists() else {}
    data[args.label] = rec
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(OUT)


if __name__ == "__main__":
    main()
