"""Admitted concurrency and UlaCache's GPU/CPU split on the 8 paper configs (issue 11 item 2), for one checkout.

Each config holds the DESIGN §8 pinned keys (glm-5, 8 GPUs, pb-lru, CPU storage, seed 11; h200|b300 x dp|tp x draft
tokens 0|4) at concurrency caps 256 and 1024 (1024: the admission ceiling the budgets allow). Admission is decided
before the first decode step (closed arrivals: every request is offered at once and admitted in order while it fits),
so one decode step tells it: `workload.max_steps=1` with the cheapest fidelity. Per config: max_admitted_concurrency
and the per-rank GPU pool, CPU pool and local-buffer slots the system sized. Each replay runs in a fresh interpreter
with PYTHONPATH = --tree (default: this checkout), so an older tree can be measured the same way.

Usage: python bench/sizing_admission.py --label after [--tree DIR --commit SHA] [--out bench/results/sizing_admission.json]
Records of other labels already in --out are kept (before and after side by side).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPS = (256, 1024)
KEEP = ("max_admitted_concurrency", "cap_gpu_pool_slots_per_rank", "cap_cpu_pool_slots_per_rank",
        "cap_local_buffer_slots_per_rank", "cap_logical_tokens", "cap_gpu_kv_budget_bytes_per_gpu")
CHILD = ("import json, sys; import sim; m = sim.replay(json.loads(sys.argv[1])); "
         "print('METRICS ' + json.dumps({k: m.get(k) for k in json.loads(sys.argv[2])}))")


def config(hw: str, attention: str, draft: int, cap: int) -> dict:
    return {"system": "ulacache", "attention": attention, "policy": "pb-lru", "cpu_storage": True,
            "hardware": {"preset": hw, "num_gpus": 8}, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": draft},
            "workload": {"num_requests": cap, "max_concurrency": cap, "seed": 11, "max_steps": 1},
            "fidelity": {"pilot_steps": 0, "policy_groups": 1, "request_fraction": 1 / 32}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True)
    ap.add_argument("--tree", default=str(ROOT))
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sizing_admission.json"))
    args = ap.parse_args()
    commit = args.commit or subprocess.run(["git", "-C", args.tree, "rev-parse", "--short", "HEAD"],
                                           capture_output=True, text=True).stdout.strip()
    rows = []
    for hw in ("h200", "b300"):
        for att in ("dp", "tp"):
            for draft in (0, 4):
                for cap in CAPS:
                    load = os.getloadavg()
                    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
                    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config(hw, att, draft, cap)),
                                           json.dumps(KEEP)], capture_output=True, text=True, cwd=args.tree,
                                          env={**os.environ, "PYTHONPATH": args.tree})
                    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    line = next((x for x in proc.stdout.splitlines() if x.startswith("METRICS ")), None)
                    row = {"hardware": hw, "attention": att, "draft_tokens": draft, "cap": cap,
                           "status": "ok" if line else f"exit {proc.returncode}: {proc.stderr.strip()[-200:]}",
                           "wall_s": round(time.perf_counter() - t0, 2),
                           "cpu_s": round(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, 2), "load": load}
                    row |= json.loads(line[8:]) if line else {}
                    print(f"{hw} {att} draft {draft} cap {cap}: admitted {row.get('max_admitted_concurrency')} "
                          f"(gpu {row.get('cap_gpu_pool_slots_per_rank')}, cpu {row.get('cap_cpu_pool_slots_per_rank')}"
                          f", buffer {row.get('cap_local_buffer_slots_per_rank')} slots per rank)", flush=True)
                    rows.append(row)
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.is_file() else {}
    doc[args.label] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "tree_commit": commit,
                       "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "rows": rows}
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)
    print(f"wrote {out} [{args.label}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
