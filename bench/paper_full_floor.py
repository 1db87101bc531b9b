"""A floor under the paper-scale replay at full fidelity (issue 10: every indexer group and every request; target
<= 10 min on the 2-core box): the time of two things any exact replay must do per decode step, timed here on the
paper config's own requests and selections, times the run's decode steps.

1. generate the step's selections: every running request x verify token x top-2048, for each of the 21 indexer
   groups (the synthetic indexer, `SyntheticSelections.select_groups`, as `sim/policy.py` fetches them);
2. deduplicate each group's access batch (one sort of its references: the first step of every PB-LRU access).
The library's translate, recency, victim search, exchanges and the TP local buffers come on top, so the replay
costs more than this floor; processes (sim/group_workers.py) divide it by at most the usable cores.

Usage: python bench/paper_full_floor.py [--running 145] [--steps 2146] [--repeats 3] [--out bench/results/paper_full_floor.json]
(145 running requests and 2,146 decode steps: what the paper config's full-fidelity probe admitted and the paper
default's run length, bench/results/paper_full_probe.json.)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.config import build, load_config  # noqa: E402
from sim.group_workers import usable_cores  # noqa: E402
from sim.policy import SELECT_ELEMS  # noqa: E402
from sim.run import load_workload  # noqa: E402
from traces.atomic import atomic_write_text  # noqa: E402

PAPER = ROOT / "configs" / "paper-h200-tp-specon.yaml"
TARGET_S = 600.0


def one_step(source, rids, hist, steps, groups, q, top_k) -> tuple[float, float, int]:
    """(CPU-s generating, CPU-s sorting, references) of one decode step over `groups`."""
    gen = srt = 0.0
    refs = 0
    per = max(1, SELECT_ELEMS // max(1, rids.size * q * top_k))  # groups per source call, as sim/policy.py
    for a in range(0, len(groups), per):
        t = time.process_time()
        sels = source.select_groups(rids, hist, steps, groups[a:a + per], q)
        gen += time.process_time() - t
        for sel in sels:
            flat = sel.reshape(-1).astype(np.int32)  # addresses fit int32 (what the address tables hand out)
            t = time.process_time()
            flat.sort()
            srt += time.process_time() - t
            refs += flat.size
    return gen, srt, refs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, default=145)
    ap.add_argument("--steps", type=int, default=2146)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "paper_full_floor.json"))
    args = ap.parse_args()
    cfg = build(load_config(PAPER, ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0"]))
    requests, source = load_workload(cfg)
    n = min(args.running, len(requests["input_tokens"]))
    rids = np.asarray(requests["request_id"], dtype=np.int64)[:n]
    hist = np.asarray(requests["input_tokens"], dtype=np.int64)[:n]
    q, top_k = cfg.query_tokens, cfg.model.top_k
    groups = list(range(cfg.model.num_index_groups))
    runs = []
    for r in range(args.repeats):  # decode steps 1.. of the same requests (step 0 warms the source's caches)
        steps = np.full(n, r + 1, dtype=np.int64)
        runs.append(one_step(source, rids, hist + r, steps, groups, q, top_k))
    gen = min(x[0] for x in runs)
    srt = min(x[1] for x in runs)
    refs = runs[0][2]
    per_step = gen + srt
    cores = usable_cores()
    floor = per_step * args.steps
    result = {
        "bench": "paper_full_floor",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "usable_cores": cores, "platform": platform.platform(),
                    "python": platform.python_version(), "load_avg": os.getloadavg()},
        "config": str(PAPER.relative_to(ROOT)) + " + fidelity.policy_groups=0, fidelity.request_fraction=1.0",
        "running_requests": n, "query_tokens": q, "groups": len(groups), "references_per_step": refs,
        "cpu_s_per_step": {"select": round(gen, 3), "sort": round(srt, 3), "floor": round(per_step, 3)},
        "decode_steps": args.steps,
        "floor_cpu_s": round(floor, 1),
        "floor_wall_s_on_all_usable_cores": round(floor / cores, 1),
        "target_wall_s": TARGET_S,
        "floor_over_target": round(floor / cores / TARGET_S, 2),
        "note": "least of the repeats; the replay does translate, recency, victims, exchanges and TP buffers on top",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"{refs:,} references per step ({n} requests x {q} tokens x {top_k} x {len(groups)} groups): "
          f"select {gen:.2f} + sort {srt:.2f} = {per_step:.2f} CPU-s; x {args.steps} steps = {floor:,.0f} CPU-s, "
          f"{floor / cores:,.0f} s on {cores} cores (target {TARGET_S:.0f} s: x{floor / cores / TARGET_S:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
