"""Per-step overhead of batch-1 replays (issue 10 item 4): CPU seconds of 4 requests at max_concurrency 1.

Each replay runs alone in a fresh interpreter (CPU = user + sys of that child, from os.wait4; wall beside it; the
load average before each). `--tree DIR` imports the simulator from another checkout (e.g. the commit before the
change, unpacked with `git archive`), so before/after figures come from one script on one machine; `--label` names
the figures (before / after) and the JSON keeps every label it has seen.

Usage: python bench/step_speed.py [--tree DIR] [--label after] [--out bench/results/step_speed.json]
       [--only hisparse:dp:h200:0,...,configs/x.yaml] [--base DIR --reps N]

`--base DIR` runs an A/B on a shared, noisy machine: for each replay, N rounds of the base tree and --tree, back to
back (alternating which goes first), so both see the same load; the label keeps every round, the medians and the
least figures (`ab`), with both trees' metrics (they must be equal for a speed-only change).
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
RUNS = ("hisparse:dp:h200:0", "sglang:dp:h200:0", "ulacache:dp:h200:4")
CODE = ("import json, sys; import sim; c = json.loads(sys.argv[1]); m = sim.replay(c); "
        "print('METRICS ' + json.dumps({k: m[k] for k in ('decode_steps', 'gpu_hit_rate', 'decode_time_s')}))")


def config(run: str) -> dict:
    """The batch-1 config of `system:attention:preset:draft`, or a config file's (a run ending in .yaml)."""
    if run.endswith(".yaml"):
        import yaml

        return yaml.safe_load((ROOT / run).read_text())
    system, attention, preset, draft = run.split(":")
    return {"system": system, "attention": attention, "hardware": {"preset": preset, "num_gpus": 8},
            "policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"},
            "spec": {"draft_tokens": int(draft)}, "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1}}


def run_one(run: str, tree: Path, as_limit_bytes: int) -> dict:
    """One replay in a child interpreter under an address-space limit: its CPU seconds, wall, metrics."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen(["prlimit", f"--as={as_limit_bytes}", "--", sys.executable, "-c", CODE,
                             json.dumps(config(run))], cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    metrics = next((json.loads(line[8:]) for line in out.splitlines() if line.startswith("METRICS ")), None)
    return {"run": run, "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "wall_s": round(wall, 2),
            "load_before": [round(x, 2) for x in load], "exit_status": os.waitstatus_to_exitcode(status),
            "metrics": metrics}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT)
    ap.add_argument("--label", default="after")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "step_speed.json")
    ap.add_argument("--only", default=",".join(RUNS))
    ap.add_argument("--as-limit-gb", type=float, default=6.0)
    ap.add_argument("--base", type=Path, default=None, help="A/B: the tree to compare against, run alternately")
    ap.add_argument("--reps", type=int, default=2, help="A/B rounds per replay (with --base)")
    ap.add_argument("--note", default="", help="what the trees are (e.g. the commit a `git archive` base came from)")
    args = ap.parse_args(argv)
    tree = args.tree.resolve()
    commit = _commit(tree)
    if args.base is not None:
        return _ab(args, args.base.resolve(), tree)
    results = []
    for run in args.only.split(","):
        r = run_one(run, tree, int(args.as_limit_gb * 1e9))
        print(f"{r['cpu_s']:7.2f} CPU-s {r['wall_s']:7.2f} s wall  load {r['load_before'][0]:.1f}  {run}  "
              f"{r['metrics']}", flush=True)
        results.append(r)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc.setdefault("what", "CPU seconds (user+sys of the replay's own process) of batch-1 replays: 4 requests at "
                           "max_concurrency 1, glm-5, pb-lru, CPU storage, seed 1, 8 GPUs; target <= 10 s each")
    doc[args.label] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "command": " ".join([Path(sys.executable).name] + sys.argv), "tree": str(tree),
                       "commit": commit, "machine": f"{platform.node()} {platform.machine()} "
                                                    f"{os.cpu_count()} cores, {platform.python_version()}",
                       "load_after": [round(x, 2) for x in os.getloadavg()], "runs": results}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "n/a (not a git checkout)"


def _ab(args, base: Path, tree: Path) -> int:
    """Alternate base / tree replays, `args.reps` rounds each; medians of CPU seconds per tree."""
    import statistics

    limit = int(args.as_limit_gb * 1e9)
    rows = {}
    for run in args.only.split(","):
        rounds = []
        for k in range(args.reps):  # base first in even rounds, tree first in odd ones (a load drift cancels)
            first, second = ("base", "tree") if k % 2 == 0 else ("tree", "base")
            pair = {first: run_one(run, base if first == "base" else tree, limit)}
            pair[second] = run_one(run, base if second == "base" else tree, limit)
            print(f"{run:24s} base {pair['base']['cpu_s']:7.2f} CPU-s  tree {pair['tree']['cpu_s']:7.2f} CPU-s  "
                  f"load {pair['base']['load_before'][0]:.1f}", flush=True)
            rounds.append(pair)
        med = {k: round(statistics.median(r[k]["cpu_s"] for r in rounds), 2) for k in ("base", "tree")}
        least = {k: min(r[k]["cpu_s"] for r in rounds) for k in ("base", "tree")}  # the least noisy figure
        same = all(r["base"]["metrics"] == r["tree"]["metrics"] for r in rounds)
        rows[run] = {"median_cpu_s": med, "min_cpu_s": least, "metrics_equal": same, "rounds": rounds}
        print(f"{run:24s} least base {least['base']:.2f} -> tree {least['tree']:.2f} CPU-s (median "
              f"{med['base']:.2f} -> {med['tree']:.2f}), metrics equal: {same}", flush=True)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc[args.label] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "command": " ".join([Path(sys.executable).name] + sys.argv),
                       "base": {"tree": str(base), "commit": _commit(base)},
                       "tree": {"tree": str(tree), "commit": _commit(tree)},
                       "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
                                  f"{platform.python_version()}",
                       "load_after": [round(x, 2) for x in os.getloadavg()], "note": args.note, "ab": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
