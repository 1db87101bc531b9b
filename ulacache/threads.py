"""Large random gathers and scatters over host tables split over a few threads (numpy releases the GIL in them).

The TP local buffers' address -> slot maps take millions of random writes a step at paper scale (one group of
paper-h200-tp-specon with a 1% hit rate: ~115 ms of its ~400 ms step in one scatter). A random write costs a
memory round trip, not compute, so a few threads issuing them at once finish sooner: 7M writes into a 526 MB
table took 69 ms on one thread and 37 ms on two on the 2-core development box (take: 50 -> 33 ms). Results are the
same bit for bit: a scatter's positions are distinct (each thread writes its own), a gather only reads.

Threads: `set_threads(n)` or $ULACACHE_THREADS (default 2; 1 = none). The pool is made on first use in each
process (a pool made before a fork has no threads in the child).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ENV_VAR = "ULACACHE_THREADS"
MIN_ITEMS = 1 << 19  # below this many positions one thread does it (a thread hand-off costs ~10-50 us)
_state = {"threads": None, "pool": None, "pid": None, "size": 0}


def set_threads(n: int | None) -> None:
    """Threads for the large gathers and scatters (None: $ULACACHE_THREADS, else 2)."""
    if n is not None and (isinstance(n, bool) or int(n) < 1):
        raise ValueError(f"threads: expected a whole number >= 1, got {n!r}")
    _state["threads"] = None if n is None else int(n)


def threads() -> int:
    if _state["threads"] is not None:
        return _state["threads"]
    env = os.environ.get(ENV_VAR, "").strip()
    try:
        return max(1, int(env)) if env else 2
    except ValueError:
        raise ValueError(f"{ENV_VAR}={env!r}: expected a whole number of threads >= 1") from None


def _pool(n: int) -> ThreadPoolExecutor:
    pool = _state["pool"]
    if pool is None or _state["pid"] != os.getpid() or _state["size"] != n:
        pool = ThreadPoolExecutor(n, thread_name_prefix="ulacache")
        _state.update(pool=pool, pid=os.getpid(), size=n)
    return pool


def _parts(size: int) -> list[tuple[int, int]] | None:
    """Contiguous ranges of [0, size) for the threads, None where one thread does it."""
    n = min(threads(), size // MIN_ITEMS)
    if n < 2:
        return None
    cuts = [size * i // n for i in range(n + 1)]
    return list(zip(cuts, cuts[1:]))


def _run(parts: list[tuple[int, int]], fn) -> None:
    """fn(lo, hi) of each part, on the threads."""
    list(_pool(len(parts)).map(lambda p: fn(*p), parts))


def over(size: int, fn) -> None:
    """fn(lo, hi) over contiguous ranges covering [0, size): on the threads when `size` is large, else fn(0, size).
    `fn` must write only its own range's outputs."""
    parts = _parts(size)
    if parts is None:
        fn(0, size)
        return
    _run(parts, fn)


def scatter(dst: np.ndarray, at: np.ndarray, vals, put: bool = False) -> None:
    """dst[at] = vals (1-D `dst`; `at` of any shape, `vals` an array like it or one value) for distinct positions
    `at`, or repeated ones that all get the same value; `put`: by np.put (faster for wide void items)."""
    at = at.reshape(-1)
    one = np.ndim(vals) == 0
    if not one:
        vals = vals.reshape(-1)

    def part(lo: int, hi: int) -> None:
        v = vals if one else vals[lo:hi]
        if put:
            np.put(dst, at[lo:hi], v)
        else:
            dst[at[lo:hi]] = v
    over(at.size, part)


def flatnonzero(mask: np.ndarray) -> np.ndarray:
    """np.flatnonzero(mask) (1-D), ascending: each thread scans its own range."""
    parts = _parts(mask.size)
    if parts is None:
        return np.flatnonzero(mask)
    found: dict[int, np.ndarray] = {}

    def part(lo: int, hi: int) -> None:
        found[lo] = np.flatnonzero(mask[lo:hi]) + lo
    _run(parts, part)
    return np.concatenate([found[lo] for lo, _ in parts])


def take(src: np.ndarray, at: np.ndarray) -> np.ndarray:
    """src.take(at) (1-D `src`, `at` 1-D)."""
    parts = _parts(at.size)
    if parts is None:
        return src.take(at)
    out = np.empty(at.size, dtype=src.dtype)

    def part(lo: int, hi: int) -> None:
        np.take(src, at[lo:hi], out=out[lo:hi])
    _run(parts, part)
    return out


__all__ = ["ENV_VAR", "MIN_ITEMS", "flatnonzero", "over", "scatter", "set_threads", "take", "threads"]
