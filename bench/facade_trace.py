"""The library's share of a replay, alone: record every UlaCache call a simulator replay makes, then replay the calls
against the library (no simulator, no trace generator) and time them in CPU-s, with a digest of every answer.

Why: a batch-1 replay spends about half its CPU in the simulator and the trace generator; A/B runs of whole replays
on a shared 2-core box then measure the facade's and the policies' changes through that noise. Replaying the recorded
calls measures them directly, and the digest (every returned address, every plan count and per-rank row array,
every CapacityError) checks that two trees answer the same calls identically.

Usage: python bench/facade_trace.py record CONFIG_NAME OUT.pkl   (CONFIG_NAME: b1-tp-h200-d0, ... see CONFIGS)
       python bench/facade_trace.py replay IN.pkl [--largest N] [--repeats N]   (CPU-s, least of the repeats, digest)
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
    "b1-dp-b300-d0": _cfg("ulacache", "dp", "b300", 0, True),
    "b1-hs-dp-b300-d0": _cfg("hisparse", "dp", "b300", 0, True),
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
        ids[id(self)] = len(ids)
        logs[ids[id(self)]] = [("__init__", (config,), {})]

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
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.name, args.out)
    else:
        print(json.dumps(replay(args.trace, args.largest, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
