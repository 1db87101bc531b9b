"""Per-step hashing kernels of the synthetic generator: step keys, query-token keys, the draw that turns mixed bits
into a stratum offset, and small cached constant arrays."""
from __future__ import annotations

import numpy as np

from traces.hashing import GOLDEN32, MIX32, mix32, mix32_int

TS_MIX32 = np.uint32((0x846CA68B * int(MIX32)) & 0xFFFFFFFF)  # the step key's multiplier times MIX32


def draw(d: np.ndarray, tb: dict, mult: np.ndarray, early: bool) -> None:
    """A query's mixed bits `d` -> each stratum's offset from its base position, in place: ((d >> sh1) * mult)
    >> sh2 (& mask)."""
    d >>= tb["sh1"]
    d *= mult
    d >>= tb["sh2"]
    if early:
        d &= tb["mask"]


def step_keys(step32: np.ndarray) -> np.ndarray:
    """mix32(step * GOLDEN32 ^ 0x51E9) per row (uint32): in Python integers for a few rows (a handful of numpy
    calls on one element cost more than the arithmetic), the same bits."""
    if step32.size > 8:
        with np.errstate(over="ignore"):
            return mix32(step32 * GOLDEN32 ^ np.uint32(0x51E9))
    return np.array([mix32_int(((int(x) * 0x9E3779B1) & 0xFFFFFFFF) ^ 0x51E9) for x in step32.tolist()],
                    dtype=np.uint32)


_RECENT: dict[int, np.ndarray] = {}
_ARANGE: dict[int, np.ndarray] = {}


def arange(n: int) -> np.ndarray:
    """0 .. n-1 (int64, read-only, cached): the sink positions."""
    a = _ARANGE.get(n)
    if a is None:
        a = _ARANGE[n] = np.arange(n, dtype=np.int64)
        a.setflags(write=False)
    return a


def recent_offsets(w: int) -> np.ndarray:
    """-w .. -1 (int64, read-only, cached): the recent window's positions relative to the history length."""
    a = _RECENT.get(w)
    if a is None:
        a = _RECENT[w] = np.arange(-w, 0, dtype=np.int64)
        a.setflags(write=False)
    return a


def qkeys(q: int) -> np.ndarray:
    """Per query-token keys (query 0's key is only used where a token diverges, never for token 0 itself)."""
    with np.errstate(over="ignore"):
        return mix32(np.arange(q, dtype=np.uint32) * np.uint32(0x27D4EB2F) ^ np.uint32(0x0A11))


QKEYS = qkeys(16)
