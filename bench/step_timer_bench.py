"""The step timer alone (sim/timing.py StepTimer on sim/hardware.py's node), before vs after (issue 10).

A replay's CPU seconds on this shared 2-core machine drift by tens of percent between runs, more than a timer change
moves them. So each tree first records, in one child interpreter, the inputs of every `StepTimer.run` call of a
replay (each rank's group work, ranks, epilogue, group order); then children of the trees, run alternately, replay
those calls on a fresh node, `--reps` times each, and report the least CPU seconds. Each tree replays its own
recording (its engine makes the timer's inputs), and the clock, the simpy event count and a digest of every
returned (step seconds, parts) are compared across trees: a speed-only change must keep all three.

Usage: python bench/step_timer_bench.py --tree before=/tmp/base --tree after=. [--only paper,ulacache:tp:h200:0]
       [--reps 3] [--rounds 2] [--out bench/results/step_timer.json] [--note TEXT]
A run is `paper` (configs/paper-h200-tp-specon.yaml) or SYSTEM:ATTENTION:PRESET:DRAFT, the batch-1 replay of 4
requests at max_concurrency 1 (glm-5, pb-lru, CPU storage, seed 1, 8 GPUs).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("paper", "hisparse:dp:h200:0", "ulacache:tp:h200:0", "ulacache:tp:h200:4")

RECORD = r"""
import json, pickle, sys
import sim, sim.timing as timing
cfg, out = json.loads(sys.argv[1]), sys.argv[2]
calls = []
orig = timing.StepTimer.run
def run(self, work, ranks, epilogue, dedup=True, order=None):
    objs = {}
    shape = [[objs.setdefault(id(w), len(objs)) for w in ws] for ws in work]
    fields = {}
    for ws in work:
        for w in ws:
            fields[objs[id(w)]] = {k: v for k, v in w.__dict__.items() if not k.startswith("_")}
    calls.append((shape, [fields[i] for i in range(len(fields))], list(ranks), dict(epilogue), dedup,
                  order.seq if order is not None else None))
    return orig(self, work, ranks, epilogue, dedup, order)
timing.StepTimer.run = run
m = sim.replay(cfg)
with open(out, "wb") as f:
    pickle.dump({"cfg": cfg, "calls": calls, "simpy_events": m["simpy_events"]}, f)
"""

REPLAY = r"""
import hashlib, json, pickle, struct, sys, time
from sim.costs import CostModel
from sim.hardware import Node, events_scheduled, make_env
from sim.run import build, load_config
from sim.timing import GroupOrder, GroupWork, StepTimer
with open(sys.argv[1], "rb") as f:
    rec = pickle.load(f)
reps = int(sys.argv[2])
cfg = build(load_config(rec["cfg"], None))
best, digest = None, None
for _ in range(reps):
    calls = []
    for shape, fields, ranks, epilogue, dedup, seq in rec["calls"]:
        objs = [GroupWork(**f) for f in fields]
        calls.append(([[objs[i] for i in row] for row in shape], ranks, epilogue, dedup,
                      GroupOrder.of(seq) if seq is not None else None))
    costs = CostModel.load(cfg.hardware, cfg.model, None, overrides=cfg.costs)
    env = make_env()
    timer = StepTimer(env, Node(env, cfg.num_gpus, costs))
    out = []
    t = time.process_time()
    for work, ranks, epilogue, dedup, order in calls:
        out.append(timer.run(work, ranks, epilogue, dedup=dedup, order=order))
    t = time.process_time() - t
    best = t if best is None else min(best, t)
    h = hashlib.sha256()
    for step_s, parts in out:
        h.update(struct.pack("d", step_s))
        h.update(struct.pack(f"{len(parts)}d", *(parts[k] for k in sorted(parts))))
    digest = h.hexdigest()[:16]
print("RESULT " + json.dumps({"cpu_s": round(best, 4), "clock_s": repr(float(env.now)),
                              "simpy_events": events_scheduled(env), "digest": digest, "steps": len(calls)}))
"""


def config(run: str) -> dict:
    if run == "paper":
        import yaml

        return yaml.safe_load((ROOT / "configs" / "paper-h200-tp-specon.yaml").read_text())
    system, attention, preset, draft = run.split(":")
    return {"system": system, "attention": attention, "hardware": {"preset": preset, "num_gpus": 8},
            "policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"},
            "spec": {"draft_tokens": int(draft)}, "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1}}


def child(tree: Path, code: str, args: list[str], limit: int) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(["prlimit", f"--as={limit}", "--", sys.executable, "-c", code, *args], cwd=tree,
                          env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"step_timer_bench: error: child in {tree} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR, twice or more")
    ap.add_argument("--only", default=",".join(RUNS))
    ap.add_argument("--reps", type=int, default=3, help="replays per child (the least counts)")
    ap.add_argument("--rounds", type=int, default=2, help="children per tree, alternating trees")
    ap.add_argument("--as-limit-gb", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "step_timer.json")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    trees = {k: Path(v).resolve() for k, v in trees.items()}
    limit = int(args.as_limit_gb * 1e9)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.only.split(","):
            row = {}
            for name, tree in trees.items():
                path = str(Path(tmp) / f"{name}.pkl")
                child(tree, RECORD, [json.dumps(config(run)), path], limit)
                row[name] = {"recording": path, "rounds": []}
            for k in range(args.rounds):
                names = list(trees) if k % 2 == 0 else list(reversed(trees))
                for name in names:
                    load = [round(x, 2) for x in os.getloadavg()]
                    out = child(trees[name], REPLAY, [row[name]["recording"], str(args.reps)], limit)
                    res = json.loads(next(x[7:] for x in out.splitlines() if x.startswith("RESULT ")))
                    row[name]["rounds"].append({**res, "load_before": load})
            for name in trees:
                rounds = row[name].pop("rounds")
                row[name].pop("recording")
                row[name] = {"min_cpu_s": min(r["cpu_s"] for r in rounds),
                             **{k: rounds[0][k] for k in ("clock_s", "simpy_events", "digest", "steps")},
                             "rounds": rounds}
            same = len({(v["clock_s"], v["simpy_events"], v["digest"]) for v in row.values()}) == 1
            results[run] = {"trees": row, "outputs_equal": same}
            print(f"{run:22s} " + "  ".join(f"{n} {v['min_cpu_s']:.3f} CPU-s" for n, v in row.items())
                  + f"  (events {[v['simpy_events'] for v in row.values()]}, outputs equal: {same})", flush=True)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc[datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")] = {
        "what": "least CPU seconds of StepTimer.run over every step of a replay (recorded inputs), per tree",
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "trees": {k: str(v) for k, v in trees.items()}, "note": args.note,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, {platform.python_version()}",
        "load_after": [round(x, 2) for x in os.getloadavg()], "runs": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
