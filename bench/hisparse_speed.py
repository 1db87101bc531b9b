"""CPU seconds of the HiSparse DP h200 replays of issue 10 for two trees (before / after), each replay in a fresh
process, as /work/notes/prof/run.py measures them (cProfile on, process CPU time of sim.replay).

Usage: python bench/hisparse_speed.py BEFORE_DIR AFTER_DIR OUT.json [REPEATS]   (DIRs: e.g. `git archive` exports of
two commits). Configs: the pinned keys (glm-5, 8 GPUs, pb-lru, CPU storage, draft 0, 24 requests at concurrency 24,
seed 1) and batch 1 (4 requests at concurrency 1). Runs alternate before/after; writes CPU-s, metric digest, load
before/after each run, date, command and machine."""
import json
import os
import platform
import subprocess
import sys
import time

CHILD = r"""
import cProfile, hashlib, json, sys, time
sys.path.insert(0, sys.argv[1])
import sim
cfg = json.loads(sys.argv[2])
pr = cProfile.Profile()
t = time.process_time()
pr.enable(); m = sim.replay(cfg); pr.disable()
cpu = time.process_time() - t
keep = {k: v for k, v in m.items() if "wall" not in k and k not in ("sim_cpu_s", "peak_rss_bytes", "est_peak_memory_bytes")}
print(json.dumps({"cpu_s": cpu, "gpu_hit_rate": m.get("gpu_hit_rate"), "decode_steps": m.get("decode_steps"),
                  "metrics_sha": hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]}))
"""


def config(batch1: bool) -> dict:
    wl = {"num_requests": 4, "max_concurrency": 1, "seed": 1} if batch1 else \
        {"num_requests": 24, "max_concurrency": 24, "seed": 1}
    return {"system": "hisparse", "attention": "dp", "hardware": {"preset": "h200", "num_gpus": 8}, "policy": "pb-lru",
            "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 0}, "workload": wl}


def run(tree: str, cfg: dict) -> dict:
    load0 = os.getloadavg()
    out = subprocess.run(["prlimit", "--as=8000000000", "--", sys.executable, "-c", CHILD, tree, json.dumps(cfg)],
                         capture_output=True, text=True, cwd=tree, env={**os.environ, "PYTHONPATH": tree}, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["load_before"], res["load_after"] = load0, os.getloadavg()
    return res


def main() -> int:
    before, after, out = sys.argv[1:4]
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    rows = []
    for name, b1 in (("batch1_4req", True), ("pinned_24req", False)):
        for i in range(repeats):
            for label, tree in (("before", before), ("after", after)):
                r = {"config": name, "tree": label, "repeat": i, **run(tree, config(b1))}
                rows.append(r)
                print(r, flush=True)
    summary = {}
    for name in ("batch1_4req", "pinned_24req"):
        for label in ("before", "after"):
            cpu = [r["cpu_s"] for r in rows if r["config"] == name and r["tree"] == label]
            summary.setdefault(name, {})[f"{label}_cpu_s_min"] = round(min(cpu), 2)
        shas = {r["metrics_sha"] for r in rows if r["config"] == name}
        summary[name]["metrics_identical"] = len(shas) == 1
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
            "machine": f"{platform.node()} {os.cpu_count()} cores (shared)", "load": os.getloadavg(),
            "before_tree": before, "after_tree": after, "summary": summary, "runs": rows}
    with open(out, "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
