"""Untimed vs chunked prefill (issue 11 item 6) on configs of the pinned keys: throughput (steady and whole run),
TPOT, TTFT, prefill time and the prompt KV each system writes to host memory.

Usage: python bench/prefill_modes.py OUT.json [NUM_REQUESTS MAX_CONCURRENCY [SYSTEM:ATTENTION ...]]
(glm-5, h200 x 8, 4 draft tokens, seed 11; every request run to completion). Writes one row per config and mode with
date, command, machine, load and CPU seconds; each replay runs in its own process (its own memory limit)."""
import json
import os
import platform
import resource
import subprocess
import sys
import time

KEYS = ("decode_throughput_tok_s", "run_throughput_tok_s", "tpot_ms_p50", "tpot_ms_p90", "ttft_ms_p50", "ttft_ms_p90",
        "ttft_ms_mean", "prefill_s", "prefill_only_s", "prefill_tokens", "prefill_chunk_tokens",
        "prompt_host_write_bytes", "pcie_prompt_load_bytes", "makespan_s", "decode_steps", "completed_requests",
        "max_admitted_concurrency", "gpu_hit_rate", "steady_window_steps", "pcie_bytes_per_token")


def main() -> int:
    out = sys.argv[1]
    nreq = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    conc = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    pairs = [a.split(":") for a in sys.argv[4:]] or [["sglang", "dp"], ["hisparse", "dp"], ["ulacache", "dp"]]
    rows = []
    for system, att in pairs:
        for mode in ("untimed", "chunked"):
            cfg = {"system": system, "attention": att, "hardware": {"preset": "h200", "num_gpus": 8},
                   "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 4},
                   "workload": {"num_requests": nreq, "max_concurrency": conc, "seed": 11, "prefill": mode}}
            r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
            done = subprocess.run([sys.executable, __file__, "--one", json.dumps(cfg)], capture_output=True, text=True)
            if done.returncode:
                print(done.stderr.strip().splitlines()[-1], file=sys.stderr)
                return 1
            m = json.loads(done.stdout)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            rows.append({"system": system, "attention": att, "prefill": mode, **{k: m[k] for k in KEYS},
                         "wall_s": round(time.time() - t0, 2),
                         "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2)})
            print(json.dumps(rows[-1]), flush=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
            "machine": platform.node(), "load": os.getloadavg(), "rows": rows}
    with open(out, "w") as fh:
        json.dump(meta, fh, indent=1)
    return 0


def one(cfg_json: str) -> int:
    import sim

    print(json.dumps(sim.replay(json.loads(cfg_json))))
    return 0


if __name__ == "__main__":
    sys.exit(one(sys.argv[2]) if sys.argv[1:2] == ["--one"] else main())
