"""A low-noise A/B of the TP local buffers on a recorded segment of the pinned-keys TP replay (24 requests at cap 24,
8 GPUs, glm-5, pb-lru, CPU storage, no draft tokens, seed 1).

  record OUT.pkl   the replay of the tree on PYTHONPATH runs up to its `--start`-th cache access (all caches counted);
                   every UlaCache it made is pickled with the mutating calls (alloc, alloc_many, access, commit, free)
                   of the next `--accesses` accesses. Each tree records its own (pickles hold its classes).
  time IN.pkl      applies the segment `--repeats` times to fresh copies: least CPU time (time.process_time) of the
                   whole segment and of its LocalBuffers calls (plan, commit, invalidate), and a digest of every
                   plan's outcome (hits, peer fetches, moves) to check that two trees agree.
  count IN.pkl     under valgrind (callgrind, caches simulated as this VM's: 32 KB D1, 32 MB L3): instructions, D1 / last-level
                   misses of the LocalBuffers calls only (a toggle library built from bench/cg_toggle.c with gcc):
                   unmoved by this shared VM's load. `--no-cache-sim`: instructions only (~3x faster).
  ab BEFORE AFTER OUT.json   both trees (paths of source trees): record, count, then `time` alternately
                   (`--rounds`); writes JSON (date, command, machine, load).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import pickle
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

_MUTATORS = ("alloc", "alloc_many", "access", "commit", "free")
_BUFFER_CALLS = ("plan", "commit", "invalidate")
_HERE = Path(__file__).resolve().parent


class _Done(Exception):
    pass


def _config(preset: str) -> dict:
    return {"system": "ulacache", "attention": "tp", "hardware": {"preset": preset, "num_gpus": 8}, "policy": "pb-lru",
            "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 0},
            "workload": {"num_requests": 24, "max_concurrency": 24, "seed": 1}}


def record(preset: str, start: int, accesses: int) -> tuple[bytes, list]:
    """(pickled caches at access `start`, the calls of the next `accesses` accesses)."""
    import sim
    from ulacache import cache as cache_mod

    cls = cache_mod.UlaCache
    orig = {name: getattr(cls, name) for name in _MUTATORS}
    caches, calls, seen, state, plan_ids = [], [], [0], {"snap": None}, {}

    def wrap(name):
        f = orig[name]

        def g(self, *a, **k):
            if self not in caches:
                caches.append(self)
            if name == "access":
                if seen[0] == start:
                    state["snap"] = pickle.dumps(caches, protocol=pickle.HIGHEST_PROTOCOL)
                if seen[0] == start + accesses:
                    raise _Done
                seen[0] += 1
            if state["snap"] is None:
                return f(self, *a, **k)
            ci = caches.index(self)
            if name == "commit":
                calls.append((ci, name, (plan_ids[id(a[0])],), {}))
                return f(self, *a, **k)
            calls.append((ci, name, tuple(np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in a),
                          dict(k)))
            out = f(self, *a, **k)
            if name == "access":
                plan_ids[id(out)] = len(calls) - 1
            return out
        return g

    for name in _MUTATORS:
        setattr(cls, name, wrap(name))
    try:
        sim.replay(_config(preset))
    except _Done:
        pass
    finally:
        for name in _MUTATORS:
            setattr(cls, name, orig[name])
    if state["snap"] is None:
        raise SystemExit(f"the replay made fewer than {start} accesses")
    return state["snap"], calls


def _wrap_buffers(before, after) -> None:
    """Call before() / after() around every LocalBuffers call of the segment."""
    from ulacache import local_buffer

    for name in _BUFFER_CALLS:
        f = getattr(local_buffer.LocalBuffers, name)

        def g(*a, _f=f, **k):
            before()
            try:
                return _f(*a, **k)
            finally:
                after()
        setattr(local_buffer.LocalBuffers, name, g)


def apply(snap: bytes, calls: list, digest: bool) -> tuple[float, str | None]:
    """Apply the calls to a fresh copy of the caches: (CPU-s, digest of the plans' outcomes or None)."""
    caches, plans = pickle.loads(snap), {}
    h = hashlib.sha256() if digest else None
    t0 = time.process_time()
    for i, (ci, name, a, k) in enumerate(calls):
        c = caches[ci]
        if name == "commit":
            c.commit(plans.pop(a[0]))
            continue
        try:
            out = getattr(c, name)(*a, **k)
        except Exception as e:  # a refused batch (CapacityError) changes nothing; the replay splits it
            if h is not None:
                h.update(type(e).__name__.encode())
            continue
        if name == "access":
            plans[i] = out
            if h is not None:
                h.update(np.array([out.num_hits, out.num_misses, out.num_local_hits, out.num_peer_fetches]).tobytes())
                for arr in (out.move_src, out.move_dst, np.asarray(out.peer_rows_per_rank)):
                    h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    total = time.process_time() - t0
    if h is not None:
        for c in caches:
            if c.buffers is not None:
                c.check_invariants()
    return total, (h.hexdigest()[:16] if h is not None else None)


def _load(path: str):
    with open(path, "rb") as fh:
        return pickle.load(fh)


def cmd_time(path: str, repeats: int) -> dict:
    snap, calls = _load(path)
    buf = [0.0, 0.0]
    _wrap_buffers(lambda: buf.__setitem__(1, time.process_time()),
                  lambda: buf.__setitem__(0, buf[0] + time.process_time() - buf[1]))
    totals, bufs, digest = [], [], None
    for r in range(repeats + 1):  # the first repeat computes the digest (and warms up): not timed
        buf[0] = 0.0
        total, d = apply(snap, calls, digest=r == 0)
        if r == 0:
            digest = d
            continue
        totals.append(total)
        bufs.append(buf[0])
    return {"segment_cpu_s_min": round(min(totals), 3), "buffers_cpu_s_min": round(min(bufs), 3),
            "segment_cpu_s": [round(x, 3) for x in totals], "buffers_cpu_s": [round(x, 3) for x in bufs],
            "digest": digest, "load": round(os.getloadavg()[0], 2)}


def cmd_count_inner(path: str, lib: str) -> None:
    """(Under callgrind, collection off at start) collect the LocalBuffers calls of one application only."""
    snap, calls = _load(path)
    cg = ctypes.CDLL(lib)
    _wrap_buffers(cg.cg_toggle, cg.cg_toggle)
    apply(snap, calls, digest=False)


def cmd_count(path: str, tree: str, cache_sim: bool = True) -> dict:
    lib = Path(tempfile.gettempdir()) / f"cg_toggle_{os.getuid()}.so"
    if not lib.exists():
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(_HERE / "cg_toggle.c")], check=True)
    sim = ["--cache-sim=yes", "--D1=32768,8,64", "--LL=33554432,16,64"] if cache_sim else ["--cache-sim=no"]
    cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", *sim, "--callgrind-out-file=/dev/null",
           sys.executable, str(Path(__file__).resolve()), "count-inner", path, "--lib", str(lib)]
    res = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True,
                         check=True)
    events = re.search(r"Events\s*:\s*(.+)", res.stderr).group(1).split()
    counts = [int(x) for x in re.search(r"Collected\s*:\s*(.+)", res.stderr).group(1).split()]
    out = dict(zip(events, counts))
    # An estimate of cycles (callgrind's usual weights): a D1 miss ~10, a last-level miss ~100 instructions' time.
    d1 = out.get("D1mr", 0) + out.get("D1mw", 0)
    ll = out.get("DLmr", 0) + out.get("DLmw", 0)
    out["cycle_estimate"] = out.get("Ir", 0) + 10 * d1 + 100 * ll
    return out


def cmd_ab(args) -> None:
    trees = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    tmp = Path(tempfile.mkdtemp(prefix="tpbuf_segment_"))
    me = str(Path(__file__).resolve())
    common = ["--preset", args.preset, "--start", str(args.start), "--accesses", str(args.accesses)]

    def run(tree, *a):
        res = subprocess.run([sys.executable, me, *a], cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                             capture_output=True, text=True, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])

    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "machine": f"{platform.machine()} {os.cpu_count()} cores, {platform.node()}", "trees": trees,
           "segment": {"preset": args.preset, "start": args.start, "accesses": args.accesses}, "runs": []}
    try:
        for name, tree in trees.items():
            run(tree, "record", str(tmp / f"{name}.pkl"), *common)
        if args.count:
            out["callgrind"] = {}
            for name, tree in trees.items():
                out["callgrind"][name] = run(tree, "count", str(tmp / f"{name}.pkl"), *args.no_cache_sim)
                print(json.dumps({"callgrind": name, **out["callgrind"][name]}), flush=True)
        for rnd in range(args.rounds):
            for name, tree in (trees.items() if rnd % 2 == 0 else reversed(trees.items())):
                row = run(tree, "time", str(tmp / f"{name}.pkl"), "--repeats", str(args.repeats))
                out["runs"].append({**row, "tree": name, "path": tree, "round": rnd})
                print(json.dumps(out["runs"][-1]), flush=True)
    finally:
        for p in tmp.glob("*.pkl"):
            p.unlink()
        tmp.rmdir()
    best = {n: min(r["buffers_cpu_s_min"] for r in out["runs"] if r["tree"] == n) for n in trees}
    out["summary"] = {"buffers_cpu_s_least": best,
                      "digests_equal": len({r["digest"] for r in out["runs"]}) == 1}
    if "callgrind" in out:
        cg = out["callgrind"]
        out["summary"]["after_over_before"] = {k: round(cg["after"][k] / cg["before"][k], 4)
                                               for k in ("Ir", "D1mr", "DLmr", "cycle_estimate") if cg["before"].get(k)}
    print(json.dumps(out["summary"]))
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["record", "time", "count", "count-inner", "ab"])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--preset", default="h200")
    ap.add_argument("--start", type=int, default=2000)
    ap.add_argument("--accesses", type=int, default=600)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--count", action="store_true", help="ab: also count under valgrind")
    ap.add_argument("--no-cache-sim", action="store_const", const=["--no-cache-sim"], default=[],
                    help="count: instructions only (~3x faster under valgrind; no D1/LL misses)")
    ap.add_argument("--lib")
    args = ap.parse_args()
    if args.mode == "record":
        snap, calls = record(args.preset, args.start, args.accesses)
        with open(args.paths[0], "wb") as fh:
            pickle.dump((snap, calls), fh, protocol=pickle.HIGHEST_PROTOCOL)
        print(json.dumps({"recorded": args.paths[0], "snapshot_mb": len(snap) >> 20, "calls": len(calls)}))
    elif args.mode == "time":
        print(json.dumps({"tree": os.environ.get("PYTHONPATH"), **cmd_time(args.paths[0], args.repeats)}))
    elif args.mode == "count":
        print(json.dumps(cmd_count(args.paths[0], os.environ.get("PYTHONPATH", "."), not args.no_cache_sim)))
    elif args.mode == "count-inner":
        cmd_count_inner(args.paths[0], args.lib)
    else:
        args.before, args.after, args.out = args.paths
        cmd_ab(args)


if __name__ == "__main__":
    main()
