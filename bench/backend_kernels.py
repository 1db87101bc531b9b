"""Per-call cost of the numpy backend's hot kernels at the argument sizes the replays pass them.

The sizes were logged from two replays of main fd86693 (every backend call wrapped, its argument sizes and shapes
recorded): pinned-keys `ulacache` DP on h200 (24 requests at concurrency 24) and batch-1 `ulacache` TP on b300
(4 requests, concurrency 1). Inputs are rebuilt here from what was logged: bitmaps of 8 segments whose set bits sit
at the high end of each segment (pools hand out their lowest slots), stale summary flags just below them (flags
stay up after clears until recomputed), slot lists sorted as the pools pass them. Each case prints and records
microseconds per call (best of several repeats, CPU time and wall time: this machine is shared and loaded).

Run it against another tree's library with PYTHONPATH=that_tree (the JSON records which library it imported).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

import ulacache
from ulacache.backends.numpy_backend import NumpyBackend

be = NumpyBackend()


def _pool_bitmap(rng, nseg, wps, first_word, stale_words, density=1.0):
    """(bitmap, summary): per segment, words from `first_word` on hold set bits (full words at density 1), the
    `stale_words` words below them are flagged but empty."""
    words = np.zeros(nseg * wps, dtype="<u8")
    flags = np.zeros(nseg * wps, dtype=bool)
    for r in range(nseg):
        lo = r * wps
        n = wps - first_word
        full = rng.random(n) < density
        words[lo + first_word:lo + wps] = np.where(full, np.uint64(2**64 - 1), rng.integers(1, 2**63, n, dtype=np.uint64))
        flags[lo + first_word - stale_words:lo + wps] = True
    flags = np.concatenate([flags, np.zeros((-flags.size) % 64, dtype=bool)])
    return words.view(np.uint8).copy(), np.packbits(flags, bitorder="little")


def select_first_cases(rng):
    """(name, args, calls in the logged replay of that shape)."""
    one_hot = np.zeros(8, dtype=np.int64)
    one_hot[3] = 1
    tp_buf = _pool_bitmap(rng, 8, 261, 256, 0)  # TP local buffer: 8 x 16704 slots, its top words free
    dp_gpu = _pool_bitmap(rng, 8, 6738, 5300, 20)  # DP GPU pool: 8 x 431232 slots
    tp_gpu = _pool_bitmap(rng, 8, 1882, 1700, 20)  # TP GPU pool: 8 x 120448 slots
    cpu = _pool_bitmap(rng, 8, 2048, 0, 0)  # a CPU pool, all free: 8 x 131072 slots
    bulk = np.zeros(8, dtype=np.int64)
    bulk[0] = 131072
    return [
        ("select_first tp-b1 local buffer 8x16704 counts one-hot 1", (*tp_buf, 16704, one_hot), "tp-b1 11698"),
        ("select_first dp gpu pool 8x431232 counts 3", (*dp_gpu, 431232, np.full(8, 3, np.int64)), "dp 4956"),
        ("select_first tp gpu pool 8x120448 counts 1", (*tp_gpu, 120448, np.ones(8, np.int64)), "tp-b1 ~8000"),
        ("select_first tp gpu pool 8x120448 counts 100", (*tp_gpu, 120448, np.full(8, 100, np.int64)), "tp-b1 ~2700"),
        ("select_first cpu pool 8x131072 free, 131072 from one", (*cpu, 131072, bulk), "dp 633"),
    ]


def write_cases(rng):
    out = []
    for nbytes, n, how, calls in [(16704, 1, "scattered", "tp-b1 25000"), (16704, 7, "scattered", "tp-b1 7000"),
                                  (16704, 2048, "scattered", "tp-b1 11768"), (431232, 3, "scattered", "dp 1200"),
                                  (431232, 6144, "scattered", "dp 1014"), (131072, 131072, "range", "dp 1350")]:
        slots = (np.arange(n) if how == "range" else np.sort(rng.choice(nbytes * 8, n, replace=False)))
        out.append((f"bitmap_set+clear {nbytes}B {n} slots {how}", nbytes, slots.astype(np.int64), calls))
    return out


def timed(fn, min_total_s=0.2, repeats=5):
    """(CPU us, wall us) per call: best of `repeats` runs of enough calls to last min_total_s."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_total_s / repeats or n < 1:
        fn()
        n += 1
    cpu, wall = [], []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn()
        cpu.append((time.process_time() - c) / n)
        wall.append((time.perf_counter() - w) / n)
    return min(cpu) * 1e6, min(wall) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench/results/backend_kernels.json")
    ap.add_argument("--label", default="", help="what this run measures (e.g. before/after)")
    ap.add_argument("--library-commit", default="", help="the commit of the imported library when it is an export")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []

    def record(name, fn, calls):
        cpu_us, wall_us = timed(fn)
        rows.append({"kernel": name, "cpu_us_per_call": round(cpu_us, 2), "wall_us_per_call": round(wall_us, 2),
                     "replay_calls": calls})
        print(f"{cpu_us:10.1f} CPU-us {wall_us:10.1f} wall-us  {name}  ({calls} calls)", flush=True)

    load_before = os.getloadavg()
    for name, a, calls in select_first_cases(rng):
        record(name, lambda a=a: be.select_first(*a), calls)
    for name, nbytes, slots, calls in write_cases(rng):
        bm = np.zeros(nbytes, dtype=np.uint8)

        def set_clear(bm=bm, slots=slots):
            be.bitmap_set(bm, slots)
            be.bitmap_clear(bm, slots)
        record(name, set_clear, calls)
    for nstamps, nslots, calls in [(3449856, 16384, "dp 740"), (3449856, 6144, "dp 1014"), (133632, 2048, "tp-b1 11768")]:
        stamps = rng.integers(0, 2000, nstamps).astype(np.int64)
        slots = np.sort(rng.choice(nstamps, nslots, replace=False)).astype(np.int64)
        record(f"bucket_of stamps {nstamps} slots {nslots}", lambda s=stamps, x=slots: be.bucket_of(s, x, 1990, 4),
               calls)
    for ntable, nidx, calls in [(3048761, 16384, "dp 740"), (133480, 2048, "tp-b1 11768")]:
        table = rng.integers(-1, 2**31 - 2, ntable).astype(np.int32)
        idx = np.sort(rng.choice(ntable, nidx, replace=False)).astype(np.int64)
        marker = np.zeros(ntable + 1, dtype=bool)
        addrs = rng.choice(idx, nidx * 2).astype(np.int64)
        record(f"gather table {ntable} idx {nidx}", lambda t=table, i=idx: be.gather(t, i), calls)
        record(f"hit_mask {nidx}", lambda t=table, i=idx: be.hit_mask(t[:nidx], 2**30), calls)
        record(f"dedup {nidx * 2} addrs marker {ntable + 1}", lambda a=addrs, m=marker: be.dedup(a, m), calls)
    lib = os.path.dirname(os.path.dirname(os.path.abspath(ulacache.__file__)))
    try:
        commit = subprocess.run(["git", "-C", lib, "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = args.library_commit or "not a git checkout"
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "label": args.label,
              "library": lib, "git_commit": commit, "numpy": np.__version__,
              "machine": {"node": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()},
              "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "kernels": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
