"""A/B of two TP local-buffer kernels against their previous code, in one process (least of many repeats, CPU
time): the free-slot bit extraction (numpy_backend._set_bits vs unpacking every bit) on words like the pinned-keys
TP replay's free-slot searches (~6 free bits per word, ~450 words a call), and DenseSlotMaps.remote on a batch-1
decode step (2048 addresses, 8 ranks, a handful of misses) and a pinned-keys-sized batch (20000, many misses).
Prints and writes bench/results/tpbuf_kernels.json (date, command, machine, load)."""
from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time

import numpy as np

from ulacache.address_space import AddressSpace
from ulacache.backends.numpy_backend import _set_bits
from ulacache.slot_map import DenseSlotMaps

REPEATS = 400


def _least(fn) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best * 1e6


def _remote_before(maps, ix, bounds):
    """DenseSlotMaps.remote as it was (main 91dc8bd): the misses split by rank with slices for every size."""
    R, U = maps.R, ix.size
    rows = maps._row_items.take(ix)
    absent = np.ascontiguousarray((rows.view(maps._dt["s"].base).reshape(U, R) == 0).T)
    for r in range(R):
        absent[r, bounds[r]:bounds[r + 1]] = False
    miss = np.flatnonzero(absent)
    cut = miss.searchsorted(np.arange(R + 1, dtype=np.int64) * U).tolist()
    for r in range(1, R):
        miss[cut[r]:cut[r + 1]] -= r * U
    m_counts = np.diff(cut)
    return U - np.diff(bounds) - m_counts, miss, m_counts, rows


def main() -> None:
    rng = np.random.default_rng(0)
    out = {}
    words = np.zeros(37_600, np.uint64)
    wu = np.sort(rng.choice(words.size, 450, replace=False))
    bits = [rng.integers(0, 2**63, wu.size, dtype=np.int64).astype(np.uint64) for _ in range(3)]
    words[wu] = bits[0] & bits[1] & bits[2]  # ~8 set bits of 64
    before = lambda: np.unpackbits(words.take(wu).view(np.uint8), bitorder="little").nonzero()[0]  # noqa: E731
    after = lambda: _set_bits(words.take(wu))  # noqa: E731
    assert np.array_equal(before(), after())
    out["set_bits_450_words"] = {"before_us": _least(before), "after_us": _least(after)}
    R, per_rank = 8, 340_000
    space = AddressSpace(R, per_rank, per_rank)
    for r in range(R):
        space.pop_ids(r, per_rank)
    maps = DenseSlotMaps(R, space, capacity=300_000)
    for U, miss_p in ((2048, 0.0005), (20000, 0.5)):
        addrs = np.unique(rng.choice(R * per_rank, U, replace=False))
        ix = space.index(addrs)
        bounds = np.searchsorted(addrs, np.arange(R + 1) * per_rank).tolist()
        home = addrs // per_rank
        for r in range(R):
            keys = addrs[(home != r) & (rng.random(addrs.size) >= miss_p)]
            maps.set(np.full(keys.size, r, np.int64), keys, rng.integers(0, 300_000, keys.size))
        b = _remote_before(maps, ix, bounds)
        a = maps.remote(addrs, ix, bounds)
        assert all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3]))
        out[f"remote_{U}"] = {"misses": int(a[1].size), "before_us": _least(lambda: _remote_before(maps, ix, bounds)),
                              "after_us": _least(lambda: maps.remote(addrs, ix, bounds))}
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
           "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores",
           "load": os.getloadavg(), "repeats": REPEATS, "unit": "least CPU microseconds per call", "results": out}
    print(json.dumps(res, indent=1))
    os.makedirs("bench/results", exist_ok=True)
    with open("bench/results/tpbuf_kernels.json", "w") as fh:
        json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
