"""A/B of `Pool.take_free` on the pinned-keys ulacache TP replay (24 requests at cap 24, 8 GPUs, glm-5, pb-lru, CPU
storage, seed 1; PRESET and DRAFT as given): runs each tree's replay in its own process, alternating (this VM's speed
drifts), and keeps the least CPU-s of each. Per run: total CPU-s (user+sys), the CPU-s inside Pool.take_free (a
process_time wrapper, the same in both trees), its calls, wall, load, and a digest of every metric but the
wall-clock and resident-memory ones (must agree).
  python bench/take_free_ab.py OUT.json PRESET DRAFT REPEATS TREE_A TREE_B
(one run: PYTHONPATH=TREE python bench/take_free_ab.py --one PRESET DRAFT)."""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import time


def one(preset: str, draft: int) -> dict:
    import sim
    from ulacache import pools

    spent, calls = [0.0], [0]
    f = pools.Pool.take_free

    def timed(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            spent[0] += time.process_time() - t
            calls[0] += 1

    pools.Pool.take_free = timed
    cfg = {"system": "ulacache", "attention": "tp", "hardware": {"preset": preset, "num_gpus": 8}, "policy": "pb-lru",
           "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": draft},
           "workload": {"num_requests": 24, "max_concurrency": 24, "seed": 1}}
    t, w = time.process_time(), time.time()
    m = sim.replay(cfg)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    skip = ("peak_rss_bytes", "est_peak_memory_bytes")  # differ run to run, like the wall-clock figures
    m = {k: v for k, v in m.items() if "wall" not in k and k not in skip}
    digest = hashlib.sha256(json.dumps(m, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"tree": os.environ.get("PYTHONPATH"), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
            "replay_cpu_s": round(time.process_time() - t, 2), "take_free_cpu_s": round(spent[0], 3),
            "take_free_calls": calls[0], "wall_s": round(time.time() - w, 1), "load": round(os.getloadavg()[0], 2),
            "metrics_digest": digest}


def main() -> None:
    if sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2], int(sys.argv[3]))))
        return
    out, preset, draft, reps, trees = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:7]
    runs = []
    for i in range(reps):
        for tree in trees:  # alternate
            env = dict(os.environ, PYTHONPATH=tree)
            p = subprocess.run(["prlimit", "--as=6000000000", "--", sys.executable, os.path.abspath(__file__),
                                "--one", preset, draft], env=env, capture_output=True, text=True, check=True)
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), flush=True)
    least = {t: {k: min(r[k] for r in runs if r["tree"] == t) for k in ("cpu_s", "take_free_cpu_s")} for t in trees}
    same = len({r["metrics_digest"] for r in runs}) == 1
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus",
           "load_end": [round(x, 2) for x in os.getloadavg()], "runs": runs, "least": least,
           "metrics_identical": same}
    with open(out, "w") as fh:
        json.dump(res, fh, indent=1)
    print(json.dumps({"least": least, "metrics_identical": same}))


if __name__ == "__main__":
    main()
