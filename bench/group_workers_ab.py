"""Group workers A/B (sim/group_workers.py): the same replays with their simulated groups in 1 process and in N,
alternating in fresh interpreters on the same minutes; wall and CPU seconds (least of the rounds) and whether every
metric but the wall time agrees.

Usage: python bench/group_workers_ab.py [--rounds 2] [--processes 2] [--out bench/results/group_workers_ab.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from traces.atomic import atomic_write_text  # noqa: E402

PINNED = {"policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 0},
          "hardware": {"preset": "h200", "num_gpus": 8}, "workload": {"num_requests": 24, "max_concurrency": 24, "seed": 1}}
CASES = {
    "paper default (configs/paper-h200-tp-specon.yaml)": str(ROOT / "configs" / "paper-h200-tp-specon.yaml"),
    "pinned ulacache tp h200": {**PINNED, "system": "ulacache", "attention": "tp"},
    "pinned hisparse dp h200": {**PINNED, "system": "hisparse", "attention": "dp"},
    "batch 1 ulacache tp h200, no draft": {**PINNED, "system": "ulacache", "attention": "tp",
                                           "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1}},
    "batch 1 hisparse dp h200, no draft": {**PINNED, "system": "hisparse", "attention": "dp",
                                           "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1}},
}
SKIP = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "sim_cpu_s", "peak_rss_bytes",
        "est_peak_memory_bytes", "policy_processes", "policy_probe_step_ms"}
CODE = ("import json, sys, sim; a = json.loads(sys.argv[1]); "
        "m = sim.replay(a['config'], policy_workers=a['n']); print('METRICS ' + json.dumps(m))")


def run(config, n: int) -> dict:
    t0 = time.perf_counter()
    before = os.times()
    out = subprocess.run([sys.executable, "-c", CODE, json.dumps({"config": config, "n": n})], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    after = os.times()
    wall = time.perf_counter() - t0
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    metrics = next(json.loads(x[8:]) for x in out.stdout.splitlines() if x.startswith("METRICS "))
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "metrics": metrics}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "group_workers_ab.json"))
    args = ap.parse_args()
    rows = {}
    for name, config in CASES.items():
        runs = {1: [], args.processes: []}
        for _ in range(args.rounds):  # alternating: 1, N, 1, N
            for n in runs:
                runs[n].append(run(config, n))
        base, many = runs[1], runs[args.processes]
        same = all({k: v for k, v in r["metrics"].items() if k not in SKIP}
                   == {k: v for k, v in base[0]["metrics"].items() if k not in SKIP} for r in base + many)
        row = {"one_process": {"wall_s": min(r["wall_s"] for r in base), "cpu_s": min(r["cpu_s"] for r in base),
                               "walls": [r["wall_s"] for r in base]},
               f"{args.processes}_processes": {"wall_s": min(r["wall_s"] for r in many),
                                               "cpu_s": min(r["cpu_s"] for r in many),
                                               "walls": [r["wall_s"] for r in many],
                                               "policy_processes": many[0]["metrics"].get("policy_processes")},
               "metrics_equal": same}
        row["wall_ratio"] = round(row[f"{args.processes}_processes"]["wall_s"] / row["one_process"]["wall_s"], 3)
        rows[name] = row
        print(f"{name:40s} wall {row['one_process']['wall_s']:6.2f} -> {row[f'{args.processes}_processes']['wall_s']:6.2f} s "
              f"(x{row['wall_ratio']}), cpu {row['one_process']['cpu_s']:6.2f} -> "
              f"{row[f'{args.processes}_processes']['cpu_s']:6.2f}, metrics {'equal' if same else 'DIFFER'}", flush=True)
    result = {"bench": "group_workers_ab",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                          "load_avg_after": os.getloadavg()},
              "what": "least wall / CPU seconds of fresh-interpreter replays (CPU: the replay and its group workers)",
              "cases": rows}
    atomic_write_text(Path(args.out), json.dumps(result, indent=2) + "\n")
    return 0 if all(r["metrics_equal"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
