"""Vectorized LEB128 varints (unsigned), the byte code of captured selections (see FORMAT.md)."""
from __future__ import annotations

import numpy as np

from traces.errors import TraceError

_MAX_BYTES = 10


def encode(values: np.ndarray) -> np.ndarray:
    """uint8 bytes of the LEB128 encodings of non-negative integers, concatenated."""
    v = np.asarray(values, dtype=np.uint64).ravel()
    if v.size == 0:
        return np.zeros(0, dtype=np.uint8)
    nb = np.ones(v.size, dtype=np.int64)
    for b in range(1, _MAX_BYTES):
        nb += v >= np.uint64(1 << (7 * b))
    ends = np.cumsum(nb)
    starts = ends - nb
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    for b in range(int(nb.max())):
        sel = np.flatnonzero(nb > b)
        byte = (v[sel] >> np.uint64(7 * b)) & np.uint64(0x7F)
        byte |= (nb[sel] > b + 1).astype(np.uint64) << np.uint64(7)
        out[starts[sel] + b] = byte.astype(np.uint8)
    return out


def decode(buf: np.ndarray, where: str = "varint stream") -> np.ndarray:
    """uint64 values of a concatenation of LEB128 varints; TraceError if truncated or overlong."""
    b = np.asarray(buf, dtype=np.uint8).ravel()
    if b.size == 0:
        return np.zeros(0, dtype=np.uint64)
    term = b < 0x80
    if not term[-1]:
        raise TraceError(f"{where}: truncated varint at the end")
    ends = np.flatnonzero(term)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts + 1
    if lengths.max() > _MAX_BYTES:
        raise TraceError(f"{where}: overlong varint")
    gid = np.repeat(np.arange(ends.size), lengths)
    shift = (np.arange(b.size) - starts[gid]).astype(np.uint64) * np.uint64(7)
    vals = (b & 0x7F).astype(np.uint64) << shift
    return np.add.reduceat(vals, starts)
