"""Where a batch-1 replay's decode steps spend CPU time: the engine's, timer's and policy runner's own methods vs the
library's calls (UlaCache.access / commit / alloc_many), per step.

Each method listed below is wrapped with a CPU-time accumulator (time.process_time; nested methods count in both,
so the rows are cumulative, not additive). One replay, in this process, of 4 requests at max_concurrency 1.

Usage: [PYTHONPATH=TREE] python bench/step_breakdown.py SYSTEM ATTENTION PRESET DRAFT [--max-steps N] [--label after]
       [--out bench/results/step_speed.json]
Writes the table under "breakdown" in the JSON (date, command, tree, machine, load). PYTHONPATH picks the simulator's
tree (e.g. the commit before a change, unpacked with `git archive`).
"""
from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import sim
import ulacache.cache as cache_mod
from sim import engine, policy, timing
from traces import synthetic

ROOT = Path(__file__).resolve().parents[1]

WRAP = ((engine.Engine, ("_step", "_batch", "_policy_ratios", "_link_rows", "_shared_work", "_order", "_ranks_work", "_rank_work",
                         "_epilogue", "_advance", "_account", "_footprint")),
        (timing.StepTimer, ("run",)), (policy.PolicyRunner, ("run_step", "grow", "admit", "_access", "_ratios")),
        (policy.AddressTable, ("lookup", "append")), (synthetic.SyntheticSelections, ("select", "select_groups")))
LIBRARY = ("access", "commit", "alloc_many")
# Inside the library: the policies' and TP local buffers' own steps (the facade's share = UlaCache.* minus these).
INTERNAL = (("ulacache.policies.exclusive", "ExclusivePolicy", ("access", "commit", "alloc_many")),
            ("ulacache.policies.hisparse", "HiSparsePolicy", ("access", "commit", "alloc_many")),
            ("ulacache.local_buffer", "LocalBuffers", ("check_fits", "plan", "commit")))


def instrument(acc: dict) -> None:
    """Wrap the methods; the library's calls made by an admission are labelled apart (`... (admit)`): they are not
    part of a decode step."""
    admitting = [0]

    def wrap(cls, name):
        f = getattr(cls, name)
        label = f"{cls.__name__}.{name}"
        library = cls.__module__.startswith("ulacache")
        is_admit = label == "PolicyRunner.admit"

        @functools.wraps(f)
        def g(*a, **k):
            t = time.process_time()
            admitting[0] += is_admit
            try:
                return f(*a, **k)
            finally:
                admitting[0] -= is_admit
                key = label + " (admit)" if library and admitting[0] else label
                acc[key] = acc.get(key, 0.0) + time.process_time() - t
        setattr(cls, name, g)

    for cls, names in WRAP:
        for name in names:
            if hasattr(cls, name):  # an older tree (PYTHONPATH) may lack some
                wrap(cls, name)
    for cls in {v for v in vars(cache_mod).values() if isinstance(v, type) and hasattr(v, "alloc_many")}:
        for name in LIBRARY + ("clone",):
            if hasattr(cls, name):
                wrap(cls, name)
    for module, cls_name, names in INTERNAL:
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError):  # an older tree may lack it
            continue
        for name in names:
            if name in vars(cls):
                wrap(cls, name)


def split(acc: dict, steps: int) -> dict:
    """Per decode step (us): the step in all; the library's calls from it (access, commit, alloc_many of the
    accepted tokens); of those, the facade's own share (UlaCache minus the policy's and TP buffers' steps); the rest
    of the step (the simulator). Pilot cache copies (UlaCache.clone, in a tree that has it, made in the first step)
    are set-up like the admissions' allocations they replace: left out of the step, reported in seconds."""
    lib = sum(acc.get(f"UlaCache.{n}", 0.0) for n in LIBRARY)
    inner = sum(v for k, v in acc.items() if k.split(".")[0] in ("ExclusivePolicy", "HiSparsePolicy", "LocalBuffers")
                and not k.endswith("(admit)"))
    clone = acc.get("UlaCache.clone", 0.0)  # the pilot's caches copied at its first step: set-up, as admissions
    step = acc.get("Engine._step", 0.0) - clone
    us = lambda v: round(v / steps * 1e6)  # noqa: E731
    return {"step": us(step), "library": us(lib), "facade": us(lib - inner), "simulator": us(step - lib),
            "pilot_clones_s": round(clone, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("system")
    ap.add_argument("attention")
    ap.add_argument("preset")
    ap.add_argument("draft", type=int)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--label", default="after")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "step_speed.json")
    args = ap.parse_args(argv)
    cfg = {"system": args.system, "attention": args.attention, "hardware": {"preset": args.preset, "num_gpus": 8},
           "policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"},
           "spec": {"draft_tokens": args.draft},
           "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1, "max_steps": args.max_steps}}
    acc: dict = {}
    instrument(acc)
    load = os.getloadavg()
    t0 = time.process_time()
    m = sim.replay(cfg)
    total = time.process_time() - t0
    steps = max(1, m["decode_steps"])
    rows = {k: {"cpu_s": round(v, 3), "us_per_step": round(v / steps * 1e6)}
            for k, v in sorted(acc.items(), key=lambda x: -x[1])}
    summary = split(acc, steps)
    print(f"total {total:.2f} CPU-s, {steps} steps, load {load[0]:.1f}; per step: "
          + ", ".join(f"{k} {v}" + ("" if k.endswith("_s") else " us") for k, v in summary.items()))
    for k, v in rows.items():
        print(f"{k:40s} {v['cpu_s']:8.2f} s {v['us_per_step']:8d} us/step")
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc.setdefault("breakdown", {})[f"{args.label} {args.system}:{args.attention}:{args.preset}:{args.draft}"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name] + sys.argv), "tree": str(Path(sim.__file__).parents[1]),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
        "load_before": [round(x, 2) for x in load], "total_cpu_s": round(total, 2), "decode_steps": steps,
        "per_step_us": summary, "methods": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
