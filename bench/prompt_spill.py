"""Prompt KV in host memory on issue 11's 150-step replay (ulacache, DP, h200 x 8, glm-5, 4 draft tokens, 128 requests
at concurrency 64, seed 11; pinned keys + max_steps 150), untimed: the policy runner's `pcie_prompt_load_bytes` beside
`prompt_host_write_bytes`, and the KV bytes of every prompt of the workload (an upper bound of both); with the
default fidelity (a pilot on all groups at a coarse stride), without the pilot, and without it at request stride 2
and 1 (every request simulated: the exact placement; the sampled requests' own placement moves with the sampling).

Usage: python bench/prompt_spill.py OUT.json. Writes the figures with date, command, machine, load, CPU seconds."""
import json
import os
import platform
import resource
import sys
import time

import sim
from sim.config import build, load_config
from sim.run import load_workload

CFG = {"system": "ulacache", "attention": "dp", "hardware": {"preset": "h200", "num_gpus": 8},
       "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 4},
       "workload": {"num_requests": 128, "max_concurrency": 64, "seed": 11, "max_steps": 150}}


FIDELITY = ({}, {"pilot_steps": 0}, {"pilot_steps": 0, "request_fraction": 0.5}, {"pilot_steps": 0, "request_fraction": 1.0})


def main() -> int:
    rows = []
    for fid in FIDELITY:
        t0, r0 = time.time(), resource.getrusage(resource.RUSAGE_SELF)
        m = sim.replay({**CFG, "fidelity": fid})
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        rows.append({"fidelity": fid, **{k: m[k] for k in (
            "pcie_prompt_load_bytes", "prompt_host_write_bytes", "request_sample_stride", "max_admitted_concurrency",
            "decode_steps", "completed_requests", "gpu_hit_rate", "cap_gpu_pool_slots_per_rank")},
            "wall_s": round(time.time() - t0, 2), "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2)})
        print(json.dumps(rows[-1]), flush=True)
    cfg = build(load_config(CFG))
    requests, _ = load_workload(cfg)
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
           "machine": platform.node(), "load": os.getloadavg(), "config": CFG,
           "all_prompts_kv_bytes": float(requests["input_tokens"].sum()) * cfg.model.kv_bytes_per_token, "rows": rows}
    print(json.dumps(out))
    with open(sys.argv[1], "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
