"""Cost of the simulator's link timing (sim/hardware.py Fabric, sim/timing.py StepTimer), before vs after (issue 10).

Each replay runs alone in a fresh interpreter under an address-space limit; its CPU seconds (user + sys of that
child, from os.wait4) and wall are recorded with the load average before it, and the child also reports the CPU
seconds spent inside `StepTimer.run` (the step's simpy simulation: fabric, rank processes, barriers) and a digest of
every modelled metric (all but wall / cpu / rss / memory-estimate keys and `simpy_events`, a simulator-performance
count), so the JSON shows the trees agree. Trees run alternately (before, after, before, ...) because the machine is
shared. `--tree NAME=DIR` names a checkout to import (e.g. `git archive` of the commit before the change).

Usage: python bench/fabric_speed.py --tree before=/tmp/base --tree after=. [--repeat 1] [--note TEXT]
       [--only paper,hisparse:dp:h200:0] [--out bench/results/fabric_speed.json]
Targets (issue 10, this 2-core machine): paper default <= 30 CPU-s, batch-1 replays <= 10 CPU-s.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("paper", "hisparse:dp:h200:0", "hisparse:tp:h200:0", "hisparse:dp:b300:0")
PAPER = "configs/paper-h200-tp-specon.yaml"
CODE = r"""
import hashlib, json, sys, time
import yaml
import sim, sim.timing as timing
spec = sys.argv[1]
if spec == "paper":
    cfg = yaml.safe_load(open(sys.argv[2]))
else:
    system, attention, preset, draft = spec.split(":")
    cfg = {"system": system, "attention": attention, "hardware": {"preset": preset, "num_gpus": 8},
           "policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"},
           "spec": {"draft_tokens": int(draft)}, "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1}}
inner = [0.0]
run = timing.StepTimer.run
def timed(self, *a, **k):
    t = time.process_time()
    try:
        return run(self, *a, **k)
    finally:
        inner[0] += time.process_time() - t
timing.StepTimer.run = timed
m = sim.replay(cfg)
skip = lambda k: any(s in k for s in ("wall", "cpu", "rss")) or k in ("est_peak_memory_bytes", "simpy_events")
model = {k: v for k, v in m.items() if not skip(k)}
digest = hashlib.sha256(json.dumps(model, sort_keys=True, default=str).encode()).hexdigest()[:16]
print("RESULT " + json.dumps({"steptimer_cpu_s": round(inner[0], 2), "simpy_events": m.get("simpy_events"),
                              "decode_steps": m.get("decode_steps"), "metrics_digest": digest,
                              "num_metrics": len(model)}))
"""


def run_one(spec: str, tree: Path, as_limit_bytes: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(["prlimit", f"--as={as_limit_bytes}", "--", sys.executable, "-c", CODE, spec,
                             str(ROOT / PAPER)], cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    res = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None)
    return {"cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "wall_s": round(wall, 2),
            "load_before": [round(x, 2) for x in load], "exit_status": os.waitstatus_to_exitcode(status),
            **(res or {})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR, in the order they alternate")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--only", default=",".join(RUNS))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fabric_speed.json")
    ap.add_argument("--as-limit-gb", type=float, default=6.0)
    ap.add_argument("--note", default="", help="what the trees are (e.g. which files of which commit)")
    args = ap.parse_args(argv)
    trees = {}
    for item in args.tree:
        name, _, path = item.partition("=")
        trees[name] = Path(path).resolve()
    runs: dict[str, dict[str, list]] = {}
    for spec in args.only.split(","):
        for _ in range(args.repeat):
            for name, tree in trees.items():
                r = run_one(spec, tree, int(args.as_limit_gb * 1e9))
                runs.setdefault(spec, {}).setdefault(name, []).append(r)
                print(f"{spec:22s} {name:8s} {r['cpu_s']:7.2f} CPU-s (StepTimer {r.get('steptimer_cpu_s')}) "
                      f"{r['wall_s']:7.2f} s wall  load {r['load_before'][0]:.1f}  events {r.get('simpy_events')} "
                      f"metrics {r.get('metrics_digest')}", flush=True)
    summary = {}
    for spec, by in runs.items():
        summary[spec] = {name: {"cpu_s_median": statistics.median(x["cpu_s"] for x in rs),
                                "steptimer_cpu_s_median": statistics.median(x.get("steptimer_cpu_s") or 0 for x in rs),
                                "simpy_events": rs[0].get("simpy_events"), "metrics_digest": rs[0].get("metrics_digest")}
                         for name, rs in by.items()}
        summary[spec]["metrics_identical"] = len({v["metrics_digest"] for v in summary[spec].values()}) == 1
    doc = {"what": "CPU seconds (user+sys of each replay's own process) and the part inside StepTimer.run, per tree; "
                   "'paper' = " + PAPER + " (default fidelity); 'system:attention:preset:draft' = batch-1 replays "
                   "(4 requests at max_concurrency 1, glm-5, pb-lru, CPU storage, seed 1, 8 GPUs)",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name] + sys.argv),
           "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
           "trees": {name: {"path": str(tree), "commit": subprocess.run(
               ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
           ).stdout.strip() or "n/a (not a git checkout)"} for name, tree in trees.items()},
           "note": args.note, "load_after": [round(x, 2) for x in os.getloadavg()], "summary": summary,
           "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
