"""SGLang batch-1 TPOT (run to completion) and UlaCache TP all-gather/stall per step, glm-5, h200.

Usage: python bench/cost_model_tp_check.py REPO_DIR > OUT.json   (REPO_DIR: the tree to measure, e.g. a `git archive`
of an older commit). Prints JSON."""
import json
import os
import sys
import tempfile


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    os.chdir(sys.argv[1])
    import pandas as pd

    import sim

    out = {}
    for system, conc, nreq in (("sglang", 1, 2), ("ulacache", 32, 64)):
        cfg = {"system": system, "attention": "tp", "hardware": {"preset": "h200", "num_gpus": 8},
               "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 4 if system == "ulacache" else 0},
               "workload": {"num_requests": nreq, "max_concurrency": conc, "seed": 11,
                            "max_steps": 0 if system == "sglang" else 60},
               "fidelity": {"request_fraction": 1.0 if conc == 1 else 0.125, "pilot_steps": 0, "policy_groups": 1}}
        d = tempfile.mkdtemp()
        m = sim.replay(cfg, d)
        tl = pd.read_parquet(f"{d}/timeline.parquet")
        keys = ("tpot_ms_p50", "tpot_ms_mean", "step_ms_mean", "decode_throughput_tok_s", "nvlink_bytes_per_token",
                "nvlink_kv_bytes_per_token", "completed_requests")
        out[system] = {k: m.get(k) for k in keys}
        out[system]["allgather_ms_per_step"] = float(tl["allgather_s"].mean() * 1e3)
        out[system]["transfer_stall_ms_per_step"] = float(tl["transfer_stall_s"].mean() * 1e3)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
