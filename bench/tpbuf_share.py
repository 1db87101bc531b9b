"""CPU-s spent in the TP local buffers (LocalBuffers.plan, commit, invalidate) beside the whole replay's, before and
after a change, for ulacache TP replays (tplru_bench.py's cases). The whole replay's CPU-s on this shared 2-core
machine swing by up to 30% run to run; the local buffers' own share is what a change to them moves, so it is timed
in the replay's process (time.process_time around each call: ~1 us per call against 0.1-5 ms calls).

Usage: python bench/tpbuf_share.py --before-tree DIR [--after-tree DIR] [--cases batch1-h200,pinned-h200]
       [--repeat N] [--note TEXT] [--out bench/results/tpbuf_share.json]
Each replay runs in a fresh interpreter with the tree on PYTHONPATH under a 6 GB address-space cap, before and after
alternating N times per case; each figure is the least of the N (all N kept under `runs`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tplru_bench import AS_LIMIT_BYTES, ROOT, case_config  # noqa: E402

CHILD = """
import json, sys, time
import sim
from ulacache import local_buffer as lb
acc = {"plan_s": 0.0, "commit_s": 0.0, "invalidate_s": 0.0}
def timed(name):
    f = getattr(lb.LocalBuffers, name)
    def g(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[name + "_s"] += time.process_time() - t
    setattr(lb.LocalBuffers, name, g)
for name in ("plan", "commit", "invalidate"):
    timed(name)
t = time.process_time()
m = sim.replay(json.loads(sys.argv[1]))
acc["replay_cpu_s"] = time.process_time() - t
acc["buffers_cpu_s"] = acc["plan_s"] + acc["commit_s"] + acc["invalidate_s"]
acc["gpu_hit_rate"], acc["decode_steps"] = m.get("gpu_hit_rate"), m.get("decode_steps")
print("RESULT " + json.dumps(acc))
"""


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT_BYTES, AS_LIMIT_BYTES))


def run(tree: Path, config: dict) -> dict:
    """One replay of `config` with the code of `tree`: the child's timings (CPU-s) and load before it."""
    load = os.getloadavg()
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)}, preexec_fn=_cap)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        raise SystemExit(f"tpbuf_share: error: replay failed in {tree}: {proc.stderr.strip().splitlines()[-1:]}")
    out = json.loads(line[0][len("RESULT "):])
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in out.items()} | {"load_avg_before": load}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before-tree", type=Path, required=True)
    ap.add_argument("--after-tree", type=Path, default=ROOT)
    ap.add_argument("--cases", default="batch1-h200")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tpbuf_share.json")
    args = ap.parse_args()
    cases = {}
    for case in args.cases.split(","):
        config = yaml.safe_load(case_config(case, args.after_tree))
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(max(args.repeat, 1)):  # loop over repetitions: before, after, before, after, ...
            for name, tree in (("before", args.before_tree), ("after", args.after_tree)):
                runs[name].append(run(tree.resolve(), config))
        best = {name: {k: min(r[k] for r in rs) for k in ("buffers_cpu_s", "replay_cpu_s", "plan_s", "commit_s")}
                for name, rs in runs.items()}
        same = all(r["gpu_hit_rate"] == runs["before"][0]["gpu_hit_rate"]
                   and r["decode_steps"] == runs["before"][0]["decode_steps"] for rs in runs.values() for r in rs)
        cases[case] = {"least": best, "runs": runs, "hit_rate_and_steps_identical": same}
        print(f"{case}: buffers {best['before']['buffers_cpu_s']} -> {best['after']['buffers_cpu_s']} CPU-s, replay "
              f"{best['before']['replay_cpu_s']} -> {best['after']['replay_cpu_s']} CPU-s (least of "
              f"{args.repeat}); hit rate and steps identical: {same}", flush=True)
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "cases": cases}
    if args.note:
        record["note"] = args.note
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
