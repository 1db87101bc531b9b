"""Sampling bias of the default fidelity: GPU hit rate (and prompt host bytes) at the default fidelity (pilot on all
groups, request stride from `request_fraction`), without the pilot, and with every request simulated (no pilot; all 78
groups at every request do not fit this box), on
issue 11's UlaCache DP config (h200 x 8, glm-5, 4 draft tokens, 128 requests at concurrency 64, seed 11, 150 steps)
and the same config under TP attention (fewer steps: TP's exact run is the slowest).

Usage: python bench/fidelity_bias.py OUT.json [--steps-dp N] [--steps-tp N]. Writes date, command, machine, load, CPU s.
Run it on a tree before a change and after it to compare (each JSON records the commit it ran on)."""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import sim

BASE = {"system": "ulacache", "hardware": {"preset": "h200", "num_gpus": 8}, "model": {"preset": "glm-5"},
        "spec": {"draft_tokens": 4}, "workload": {"num_requests": 128, "max_concurrency": 64, "seed": 11}}
FIDELITY = {"default": {}, "no_pilot": {"pilot_steps": 0},
            "all_requests": {"pilot_steps": 0, "request_fraction": 1.0}}
KEYS = ("gpu_hit_rate", "request_sample_stride", "prompt_host_write_bytes", "pcie_prompt_load_bytes",
        "max_admitted_concurrency", "decode_steps")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps-dp", type=int, default=150)
    ap.add_argument("--steps-tp", type=int, default=40)
    a = ap.parse_args()
    rows = []
    for attention, steps in (("dp", a.steps_dp), ("tp", a.steps_tp)):
        if steps <= 0:
            continue
        for name, fid in FIDELITY.items():
            cfg = {**BASE, "attention": attention, "workload": {**BASE["workload"], "max_steps": steps},
                   "fidelity": fid}
            t0, r0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
            m = sim.replay(cfg)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            rows.append({"attention": attention, "max_steps": steps, "fidelity_name": name, "fidelity": fid,
                         **{k: m.get(k) for k in KEYS}, "wall_s": round(time.time() - t0, 2),
                         "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2)})
            print(json.dumps(rows[-1]), flush=True)
    here = os.path.dirname(os.path.abspath(sim.__file__))
    commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
           "machine": platform.node(), "load": os.getloadavg(), "commit": commit, "sim": here, "config": BASE,
           "rows": rows}
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
