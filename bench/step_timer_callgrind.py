"""Instructions (valgrind callgrind) of the step timer on recorded inputs, per tree: an A/B the box's load does not move.

Records one replay's `StepTimer.run` inputs with the first tree (bench/step_timer_bench.py's RECORD; the engine makes
the same inputs in every tree when only the timer changed: the digests below check the outputs agree), cuts calls
[start, start + calls), and runs step_timer_bench's REPLAY on them under callgrind once with the cut and once with a
single call (imports and set-up), so `timer_instructions` = the difference. Prints and writes JSON.

Usage: python bench/step_timer_callgrind.py --tree before=/tmp/base --tree after=. [--run paper] [--start 1000]
       [--calls 80] [--out bench/results/step_timer_callgrind.json] [--note TEXT]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import step_timer_bench as stb  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def callgrind(tree: Path, pkl: str, tmp: str) -> tuple[int, dict]:
    out = os.path.join(tmp, "cg.out")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-c",
                           stb.REPLAY, pkl, "1"], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"step_timer_callgrind: error: replay in {tree} failed: {proc.stderr.strip()[-400:]}")
    m = re.search(r"Collected : (\d+)", proc.stderr)
    res = json.loads(next(x[7:] for x in proc.stdout.splitlines() if x.startswith("RESULT ")))
    res.pop("cpu_s")
    return int(m.group(1)), res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR, twice or more")
    ap.add_argument("--run", default="paper", help="paper or SYSTEM:ATTENTION:PRESET:DRAFT (see step_timer_bench)")
    ap.add_argument("--start", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=80)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "step_timer_callgrind.json")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    trees = {k: Path(v).resolve() for k, v in (t.split("=", 1) for t in args.tree)}
    limit = 8_000_000_000
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        full = os.path.join(tmp, "full.pkl")
        stb.child(next(iter(trees.values())), stb.RECORD, [json.dumps(stb.config(args.run)), full], limit)
        with open(full, "rb") as f:
            rec = pickle.load(f)
        cuts = {}
        for name, sl in (("cut", slice(args.start, args.start + args.calls)), ("one", slice(args.start,
                                                                                              args.start + 1))):
            cuts[name] = os.path.join(tmp, f"{name}.pkl")
            with open(cuts[name], "wb") as f:
                pickle.dump({**rec, "calls": rec["calls"][sl]}, f)
        for name, tree in trees.items():
            total, res = callgrind(tree, cuts["cut"], tmp)
            setup, _ = callgrind(tree, cuts["one"], tmp)
            rows[name] = {"total_instructions": total, "one_call_instructions": setup,
                          "timer_instructions": total - setup, **res}
            print(f"{name:10s} timer {total - setup:>13,d} instructions  (events {res['simpy_events']}, "
                  f"digest {res['digest']})", flush=True)
    same = len({(v["clock_s"], v["simpy_events"], v["digest"]) for v in rows.values()}) == 1
    print(f"outputs equal: {same}")
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc[datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")] = {
        "what": f"callgrind instructions of StepTimer.run over calls [{args.start}, {args.start + args.calls}) of "
                f"the {args.run} replay's recorded inputs (less one call: imports and set-up), per tree",
        "command": " ".join([Path(sys.executable).name] + sys.argv), "trees": {k: str(v) for k, v in trees.items()},
        "note": args.note, "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
                                      f"{platform.python_version()}",
        "load": [round(x, 2) for x in os.getloadavg()], "outputs_equal": same, "trees_result": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
