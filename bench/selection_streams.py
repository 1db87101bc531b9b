"""Synthetic selection generator A/B (issue 10): CPU time of the generator alone on the calls real replays make.

1. `record`: runs replays (pinned TP h200 24 requests, batch-1 TP h200 with 0 and 4 draft tokens, the paper default
   config) with SyntheticSelections' `select` / `select_groups` wrapped, and pickles every outer call's arguments
   (request ids, history lengths, steps, groups, query tokens) to --streams DIR.
2. `time`: replays each stream against each source tree given (PYTHONPATH=TREE, one subprocess per stream and tree,
   --reps times, the least CPU time kept: this VM's speed drifts), and checks that every tree returns the same bits
   (a sha1 of every output, in an extra, untimed pass). Writes JSON (date, command, machine, load) to --out.

    python bench/selection_streams.py record --streams /tmp/streams
    python bench/selection_streams.py time --streams /tmp/streams --trees /tmp/base . --out bench/results/x.json
A baseline tree is any checkout's root holding traces/ (e.g. `git archive COMMIT traces | tar -x -C /tmp/base`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINNED = {"system": "ulacache", "attention": "tp", "hardware": {"preset": "h200", "num_gpus": 8}, "policy": "pb-lru",
          "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 0},
          "workload": {"num_requests": 24, "max_concurrency": 24, "seed": 1}}
B1 = {**PINNED, "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1}}
STREAMS = {"pinned_tp_h200": PINNED, "b1_tp_h200_d0": B1, "b1_tp_h200_d4": {**B1, "spec": {"draft_tokens": 4}},
           "paper_default": str(ROOT / "configs" / "paper-h200-tp-specon.yaml")}

RECORD = r'''
import pickle, sys, numpy as np
import sim, traces.synthetic as syn
C, calls, inits, depth = syn.SyntheticSelections, [], [], [0]
init0, sel0, many0 = C.__init__, C.select, C.select_groups
def init(self, spec=None, seed=0, num_threads=None):
    init0(self, spec, seed, num_threads); self._rec = len(inits); inits.append((self.spec.to_dict(), self.seed))
def wrap(f, kind):
    def g(self, rid, hist, steps, grp, q):
        if not depth[0]:
            calls.append((self._rec, kind, np.array(rid, np.int64), np.array(hist, np.int64),
                          np.array(steps, np.int64), grp if kind == "s" else list(grp), int(q)))
        depth[0] += 1
        try:
            return f(self, rid, hist, steps, grp, q)
        finally:
            depth[0] -= 1
    return g
C.__init__, C.select, C.select_groups = init, wrap(sel0, "s"), wrap(many0, "g")
sim.replay(__import__("json").loads(sys.argv[1]))
pickle.dump({"inits": inits, "calls": calls}, open(sys.argv[2], "wb"))
'''

TIME = r'''
import hashlib, pickle, resource, sys, numpy as np
import traces.synthetic as syn
rec, reps = pickle.load(open(sys.argv[1], "rb")), int(sys.argv[2])
def run(digest):
    srcs = [syn.SyntheticSelections(syn.SelectionSpec.from_dict(s), seed) for s, seed in rec["inits"]]
    h = hashlib.sha1()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for sid, kind, rid, hist, steps, g, q in rec["calls"]:
        out = srcs[sid].select(rid, hist, steps, g, q) if kind == "s" else srcs[sid].select_groups(rid, hist, steps, g, q)
        if digest:
            for o in ([out] if kind == "s" else out):
                h.update(np.ascontiguousarray(o).tobytes())
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    for s in srcs:
        s.close()
    return r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime, h.hexdigest()
cpu = [run(False)[0] for _ in range(reps)]
print(__import__("json").dumps({"cpu_s": cpu, "sha1": run(True)[1], "calls": len(rec["calls"]), "file": syn.__file__}))
'''


def machine() -> dict:
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    return {"cpu": cpu or platform.processor(), "num_cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}


def record(streams: Path, mem_gb: float) -> None:
    streams.mkdir(parents=True, exist_ok=True)
    for name, cfg in STREAMS.items():
        if isinstance(cfg, str):
            import yaml
            cfg = yaml.safe_load(open(cfg))
        cmd = ["prlimit", f"--as={int(mem_gb * 1e9)}", "--", sys.executable, "-c", RECORD, json.dumps(cfg),
               str(streams / f"{name}.pkl")]
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        print("recorded", name, flush=True)


def time_trees(streams: Path, trees: list[str], reps: int, out: Path, labels: dict) -> None:
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "machine": machine(),
           "what": "process CPU seconds (user+sys) of the synthetic generator alone replaying the recorded calls of "
                   "each replay; least of --reps runs; sha1 over every output must agree across trees",
           "trees": {t: labels.get(t, "") for t in trees}, "streams": {}}
    for pkl in sorted(streams.glob("*.pkl")):
        row = {}
        for tree in trees:
            load = os.getloadavg()
            root = str(Path(tree).resolve())  # (run there: `python -c` puts the working directory first on sys.path)
            p = subprocess.run([sys.executable, "-c", TIME, str(pkl.resolve()), str(reps)], capture_output=True,
                               text=True, check=True, cwd=root, env={**os.environ, "PYTHONPATH": root})
            r = json.loads(p.stdout.strip().splitlines()[-1])
            row[tree] = {"cpu_s_min": round(min(r["cpu_s"]), 3), "cpu_s": [round(x, 3) for x in r["cpu_s"]],
                         "calls": r["calls"], "sha1": r["sha1"], "module": r["file"], "load_avg_before": load,
                         "load_avg_after": os.getloadavg()}
            print(pkl.stem, tree, row[tree]["cpu_s_min"], r["sha1"][:12], flush=True)
        row["identical"] = len({v["sha1"] for v in row.values()}) == 1
        res["streams"][pkl.stem] = row
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print("wrote", out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["record", "time"])
    ap.add_argument("--streams", type=Path, required=True)
    ap.add_argument("--trees", nargs="+", default=[str(ROOT)])
    ap.add_argument("--labels", nargs="*", default=[], help="what each tree is (e.g. its commit), in order")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mem-gb", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "selection_streams.json")
    a = ap.parse_args()
    if a.action == "record":
        record(a.streams, a.mem_gb)
    else:
        time_trees(a.streams, a.trees, a.reps, a.out, dict(zip(a.trees, a.labels)))


if __name__ == "__main__":
    main()
