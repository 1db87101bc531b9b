"""The library's share of a replay, alone: record every UlaCache call a simulator replay makes, then replay the calls
against the library (no simulator, no trace generator) and time them in CPU-s, with a digest of every answer.

Why: a batch-1 replay spends about half its CPU in the simulator and the trace generator; A/B runs of whole replays
on a shared 2-core box then measure the facade's and the policies' changes through that noise. Replaying the recorded
calls measures them directly, and the digest (every returned address, every plan count and per-rank row array,
every CapacityError) checks that two trees answer the same calls identically.

Usage: python bench/facade_trace.py record CONFIG_NAME OUT.pkl   (CONFIG_NAME: b1-tp-h200-d0, ... see CONFIGS)
       python bench/facade_trace.py replay IN.pkl [--largest N] [--repeats N]   (CPU-s, least of the repeats, digest)
       python bench/facade_trace.py ab BEFORE AFTER OUT.json IN.pkl ... [--largest N] [--repeats N]
           (each trace replayed by both commits' trees, alternating, each run in a fresh process; JSON with date,
           command, commits, machine and load: every run, the least CPU-s per trace and tree, digests equal or not)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
import time

import numpy as np


def _cfg(system: str, att: str, preset: str, draft: int, b1: bool) -> dict:
    work = {"num_requests": 4, "max_concurrency": 1, "seed": 1} if b1 else \
        {"num_requests": 24, "max_concurrency": 24, "seed": 1}
    return {"system": system, "attention": att, "hardware": {"preset": preset, "num_gpus": 8}, "policy": "pb-lru",
            "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": draft}, "workload": work}


CONFIGS = {  # issue 10's replays (bench/scale_bench.py's batch1 / pinned sections)
    "b1-tp-h200-d0": _cfg("ulacache", "tp", "h200", 0, True),
    "b1-tp-h200-d4": _cfg("ulacache", "tp", "h200", 4, True),
    "b1-tp-b300-d0": _cfg("ulacache", "tp", "b300", 0, True),
    "b1-tp-b300-d4": _cfg("ulacache", "tp", "b300", 4, True),
    "b1-dp-b300-d0": _cfg("ulacache", "dp", "b300", 0, True),
    "b1-hs-dp-b300-d0": _cfg("hisparse", "dp", "b300", 0, True),
    "b1-hs-dp-h200-d0": _cfg("hisparse", "dp", "h200", 0, True),
    "b1-hs-tp-h200-d0": _cfg("hisparse", "tp", "h200", 0, True),
    "pinned-tp-h200": _cfg("ulacache", "tp", "h200", 0, False),
}
METHODS = ("alloc", "alloc_many", "free", "access", "commit", "locate", "replay")


def record(name: str, out: str) -> None:
    """Run the config's replay with UlaCache's public calls logged per cache instance; pickle the logs."""
    import sim
    from ulacache import UlaCache
    logs: dict[int, list] = {}
    ids: dict[int, int] = {}
    depth = [0]
    init = UlaCache.__init__

    def wrap_init(self, config):
        init(self, config)
        ids[id(self)] = k = len(logs)  # (not len(ids): a dead cache's id() may be reused by a new one)
        logs[k] = [("__init__", (config,), {})]

    def wrap(meth):
        orig = getattr(UlaCache, meth)

        def call(self, *args, **kw):
            if depth[0]:  # a call the facade makes to itself (alloc -> alloc_many): not the caller's
                return orig(self, *args, **kw)
            log = logs[ids[id(self)]]
            logged = (None,) + args[1:] if meth in ("commit", "replay") else args  # the plan: the last access's
            log.append((meth, tuple(np.array(a) if isinstance(a, np.ndarray) else a for a in logged), dict(kw)))
            depth[0] += 1
            try:
                return orig(self, *args, **kw)
            finally:
                depth[0] -= 1
        return call
    UlaCache.__init__ = wrap_init
    for m in METHODS:
        setattr(UlaCache, m, wrap(m))
    sim.replay(CONFIGS[name])
    logs = {k: v for k, v in logs.items() if any(m == "access" for m, _, _ in v)}
    with open(out, "wb") as f:
        pickle.dump(logs, f, protocol=pickle.HIGHEST_PROTOCOL)


def _digest_plan(h, plan) -> None:
    h.update(repr(plan.counts()).encode())
    for x in (plan.addrs, plan.h2d_rows_per_rank, plan.d2h_rows_per_rank, plan.peer_rows_per_rank,
              plan.move_src, plan.move_dst):
        h.update(np.ascontiguousarray(x, dtype=np.int64).tobytes())


def replay(path: str, largest: int | None = None, repeats: int = 1) -> dict:
    """Replay the logged calls, cache after cache (only the `largest` caches by calls when given: a replay's own
    group caches, not its footprint probes); CPU-s of the calls only (the least of `repeats` replays), and one
    digest of all answers."""
    with open(path, "rb") as f:
        logs = pickle.load(f)
    keys = sorted(sorted(logs, key=lambda k: -len(logs[k]))[:largest])
    runs = [_replay_once(logs, keys) for _ in range(repeats)]
    assert len({d for _, _, d in runs}) == 1, "a replay of the same calls answered differently"
    return {"trace": path, "caches": len(keys), "calls": runs[0][1], "cpu_s": [round(c, 3) for c, _, _ in runs],
            "cpu_s_min": round(min(c for c, _, _ in runs), 3), "digest": runs[0][2]}


def _replay_once(logs: dict, keys: list) -> tuple[float, int, str]:
    from ulacache import CapacityError, UlaCache
    h = hashlib.sha256()
    cpu = 0.0
    calls = 0
    for k in keys:
        log = logs[k]
        cache, plan = None, None
        t = time.process_time()
        for meth, args, kw in log:
            calls += 1
            if meth == "__init__":
                cache = UlaCache(*args)
                continue
            if meth == "commit" or meth == "replay":
                args = (plan,) + args[1:]
            try:
                res = getattr(cache, meth)(*args, **kw)
            except CapacityError as e:
                h.update(b"CapacityError" + str(e).encode())
                continue
            if meth == "access":
                plan = res
            elif meth == "commit":
                _digest_plan(h, plan)
            elif isinstance(res, np.ndarray):
                h.update(res.astype(np.int64).tobytes())
            elif isinstance(res, tuple):
                for x in res:
                    h.update(np.asarray(x, dtype=np.int64).tobytes())
        h.update(repr(sorted(cache.stats().items())).encode())
        cpu += time.process_time() - t
    return cpu, calls, h.hexdigest()


def ab(before: str, after: str, out: str, traces: list[str], largest: int | None, repeats: int) -> dict:
    """Replay each trace with the `before` and the `after` commit's library alternately (load drifts alike on both)."""
    import os
    import subprocess
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from hisparse_ab import export, write_result
    runs = []
    with tempfile.TemporaryDirectory(prefix="facade_ab_") as tmp:
        trees = {"before": Path(tmp) / "before", "after": Path(tmp) / "after"}
        commits = {"before": export(before, trees["before"]), "after": export(after, trees["after"])}
        for trace in traces:
            for i in range(repeats):
                for name, tree in trees.items():
                    load = os.getloadavg()
                    cmd = [sys.executable, str(Path(__file__).resolve()), "replay", trace]
                    cmd += ["--largest", str(largest)] if largest else []
                    res = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True,
                                         capture_output=True, text=True)
                    row = {"trace": trace, "tree": name, "repeat": i, "load_avg_before": load,
                           **json.loads(res.stdout.splitlines()[-1])}
                    runs.append(row)
                    print(f"{Path(trace).name:28s} {name:6s} {row['cpu_s_min']:7.2f} cpu-s load {load[0]:.2f}",
                          flush=True)
    summary = {}
    for trace in traces:
        rows = [r for r in runs if r["trace"] == trace]
        s = {f"{t}_cpu_s_min": min(r["cpu_s_min"] for r in rows if r["tree"] == t) for t in trees}
        s["digests_identical"] = len({r["digest"] for r in rows}) == 1
        summary[trace] = s
    return write_result("facade_trace_ab", out, commits, summary, runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("name", choices=sorted(CONFIGS))
    r.add_argument("out")
    p = sub.add_parser("replay")
    p.add_argument("trace")
    p.add_argument("--largest", type=int, default=None)
    p.add_argument("--repeats", type=int, default=1)
    a = sub.add_parser("ab")
    a.add_argument("before")
    a.add_argument("after")
    a.add_argument("out")
    a.add_argument("traces", nargs="+")
    a.add_argument("--largest", type=int, default=None)
    a.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.cmd == "ab":
        ab(args.before, args.after, args.out, args.traces, args.largest, args.repeats)
    elif args.cmd == "record":
        record(args.name, args.out)
    else:
        print(json.dumps(replay(args.trace, args.largest, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
