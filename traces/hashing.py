"""Counter-based integer hashing (vectorized numpy): the randomness behind every synthetic selection.

Selections must be a pure function of (seed, request, step, group, query, history length), so the generator draws no
stream of random numbers; it hashes the coordinates instead. splitmix64's finalizer keys rows; a 32-bit finalizer
("lowbias32", Chris Wellons) and plain odd-constant multiplies mix the per-element values.
"""
from __future__ import annotations

import numpy as np

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
GOLDEN32 = np.uint32(0x9E3779B1)
MIX32 = np.uint32(0x2C1B3C6D)  # odd multiplier for the one-op per-element mix (use the product's high bits)


def splitmix64(x) -> np.ndarray:
    """splitmix64 finalizer of uint64 values (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def fold32(x64) -> np.ndarray:
    """uint64 -> uint32 by xoring the halves."""
    x64 = np.asarray(x64, dtype=np.uint64)
    return ((x64 >> np.uint64(32)) ^ (x64 & np.uint64(0xFFFFFFFF))).astype(np.uint32)


def mix32(x) -> np.ndarray:
    """lowbias32 finalizer of uint32 values: a bijection with good avalanche."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.uint32)
        x = x ^ (x >> np.uint32(16))
        x = x * np.uint32(0x7FEB352D)
        x = x ^ (x >> np.uint32(15))
        x = x * np.uint32(0x846CA68B)
        return x ^ (x >> np.uint32(16))


def key64(*parts: int) -> int:
    """A 64-bit key from a tuple of Python ints (seed, tags, indices)."""
    h = np.uint64(0x243F6A8885A308D3)
    for p in parts:
        h = splitmix64(h ^ np.uint64(int(p) & 0xFFFFFFFFFFFFFFFF))
    return int(h)


def row_keys32(seed_key: int, ids: np.ndarray) -> np.ndarray:
    """Per-row uint32 keys of int64 ids under a 64-bit seed key."""
    ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
    return fold32(splitmix64(splitmix64(ids) ^ np.uint64(seed_key)))


def mulhi16(bits32: np.ndarray, n) -> np.ndarray:
    """floor(u * n) for u = (bits32 >> 16) / 2**16: a uniform draw in [0, n) for n < 2**16 (uint32 arithmetic)."""
    return ((bits32 >> np.uint32(16)) * n) >> np.uint32(16)


def mix32_int(x: int) -> int:
    """hashing.mix32 of one uint32 value as a Python int (wrapping 32-bit products)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)
