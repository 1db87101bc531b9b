"""Micro-bench of recorded `Pool.take_free` calls: the large takes with holes (more than FEW_SLOTS slots, on ranks
with free slots below `high`, none asking more than its holes: the select_first path) of the pinned-keys ulacache
TP replay (24 requests at cap 24, 8 GPUs, glm-5, pb-lru, CPU storage, seed 1), every 10th, with the pool state
before each. Replaying them times take_free alone (pool rebuilt outside the timer) and digests every result and
the state after (must agree between trees).
  PYTHONPATH=TREE python bench/take_free_recorded.py record REC.pkl PRESET DRAFT
  python bench/take_free_recorded.py ab OUT.json REC.pkl REPEATS TREE_A TREE_B   (alternating, least of REPEATS)
(one timing: PYTHONPATH=TREE python bench/take_free_recorded.py time REC.pkl)."""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import pickle
import platform
import subprocess
import sys
import time

import numpy as np


def record(path: str, preset: str, draft: int) -> None:
    import sim
    from ulacache import pools

    f, rec, seen = pools.Pool.take_free, [], [0]

    def spy(self, be, counts):
        c, holes = np.asarray(counts), self.high - self.in_use
        if (int(np.maximum(c, 0).sum()) > pools.FEW_SLOTS and ((c > 0) & (holes > 0)).any()
                and not (c > holes).any()):
            seen[0] += 1
            if seen[0] % 10 == 0:
                rec.append({"R": self.R, "slots": self.slots, "cap": self.cap, "cleared": self.cleared,
                            "counts": c.copy(), **{k: getattr(self, k).copy()
                                                   for k in ("free", "free_nz", "in_use", "high", "low")}})
        return f(self, be, counts)

    pools.Pool.take_free = spy
    sim.replay({"system": "ulacache", "attention": "tp", "hardware": {"preset": preset, "num_gpus": 8},
                "policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"},
                "spec": {"draft_tokens": draft}, "workload": {"num_requests": 24, "max_concurrency": 24, "seed": 1}})
    with open(path, "wb") as fh:
        pickle.dump(rec, fh)
    print(json.dumps({"calls_seen": seen[0], "recorded": len(rec)}))


def timing(path: str) -> dict:
    from ulacache import pools
    from ulacache.backends import get_backend

    be = get_backend("numpy")
    with open(path, "rb") as fh:
        rec = pickle.load(fh)

    def once():
        spent, h = 0.0, hashlib.sha256()
        for d in rec:
            p = pools.Pool(d["R"], d["slots"])
            p.reserve(np.full(d["R"], d["cap"]))
            for k in ("free", "free_nz", "in_use", "high", "low"):
                setattr(p, k, d[k].copy())
            p.cleared = d["cleared"]
            t = time.process_time()
            s, found = p.take_free(be, d["counts"].copy())
            spent += time.process_time() - t
            for a in (s, found, p.free, p.free_nz, p.in_use, p.high, p.low, np.array([p.cleared])):
                h.update(np.ascontiguousarray(a).tobytes())
        return spent, h.hexdigest()[:16]

    runs = [once() for _ in range(5)]
    return {"tree": os.environ.get("PYTHONPATH"), "calls": len(rec),
            "slots_per_call": round(float(np.mean([np.maximum(d["counts"], 0).sum() for d in rec])), 1),
            "least_cpu_ms": round(min(r[0] for r in runs) * 1e3, 2), "digest": runs[0][1],
            "load": round(os.getloadavg()[0], 2)}


def main() -> None:
    cmd = sys.argv[1]
    if cmd == "record":
        return record(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    if cmd == "time":
        return print(json.dumps(timing(sys.argv[2])))
    out, rec, reps, trees = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:7]
    runs = []
    for _ in range(reps):
        for tree in trees:  # alternate
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "time", rec], check=True, text=True,
                               capture_output=True, env=dict(os.environ, PYTHONPATH=tree))
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    least = {t: min(r["least_cpu_ms"] for r in runs if r["tree"] == t) for t in trees}
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
           "load_end": [round(x, 2) for x in os.getloadavg()], "runs": runs, "least_cpu_ms": least,
           "identical": len({r["digest"] for r in runs}) == 1}
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps({"least_cpu_ms": least, "identical": res["identical"]}))


if __name__ == "__main__":
    main()
