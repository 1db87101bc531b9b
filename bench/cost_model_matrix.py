"""Before/after figures of the cost model on 48 small configs (issue 11 items 3-5): h200/b300 x dp/tp x spec off/on x
sglang/hisparse/ulacache x batch 1 / concurrency 32 (glm-5, seed 11, 60 decode steps, policy on 1 group, no pilot).

Usage: python bench/cost_model_matrix.py REPO_DIR OUT.json [--set KEY=VALUE ...]   (REPO_DIR: the tree to measure,
e.g. a `git archive` of an older commit). Writes step time, throughput, admitted concurrency and hit rate per config
with date, command, machine and load."""
import json
import os
import platform
import sys
import time


def main() -> int:
    repo, out, extra = sys.argv[1], sys.argv[2], [a for a in sys.argv[3:] if a != "--set"]
    sys.path.insert(0, repo)
    os.chdir(repo)
    import sim

    rows = []
    for hw in ("h200", "b300"):
        for att in ("tp", "dp"):
            for q in (0, 4):
                for system in ("sglang", "hisparse", "ulacache"):
                    for conc, nreq in ((1, 2), (32, 64)):
                        cfg = {"system": system, "attention": att, "hardware": {"preset": hw, "num_gpus": 8},
                               "model": {"preset": "glm-5"}, "spec": {"draft_tokens": q},
                               "workload": {"num_requests": nreq, "max_concurrency": conc, "seed": 11,
                                            "max_steps": 60},
                               "fidelity": {"request_fraction": 1.0 if conc == 1 else 0.125, "pilot_steps": 0,
                                            "policy_groups": 1}}
                        t = time.time()
                        m = sim.replay(cfg, None, overrides=list(extra))
                        rows.append({"hw": hw, "attention": att, "q": q, "system": system, "conc": conc,
                                     "step_ms": m["step_ms_mean"], "tok_s": m["decode_throughput_tok_s"],
                                     "admitted": m["max_admitted_concurrency"], "hit": m["gpu_hit_rate"],
                                     "wall": round(time.time() - t, 2)})
                        print(rows[-1], flush=True)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
            "machine": platform.node(), "load": os.getloadavg(), "rows": rows}
    with open(out, "w") as fh:
        json.dump(meta, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
