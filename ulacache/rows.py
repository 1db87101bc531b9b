"""Storage that grows with what is in use (issue 10): rank-row tables and free lists of ids.

A table over `num_ranks` ranges of ids (rank r's ids are [r * stride, r * stride + limit)) stores rank r's first
`cap` ids in row r of an (R, cap) array; `cap` grows geometrically as higher ids come into use, so memory follows the
high-water mark of the ids handed out (free lists hand out the lowest ids first), never the budget.
`RankRows.index(ids)` maps ids to storage positions (the identity with one rank or once cap == stride); `RaggedRows`
grows each rank's row on its own. Re-layouts move rows inside a buffer with room to spare (`_Buffers`), so growth
rarely touches fresh pages. The slot pools built on these rows are in pools.py.
"""
from __future__ import annotations

import mmap
import weakref

import numpy as np

GROW_FLOOR = 1024  # smallest storage row (slots or ids per rank)
SMALL_ROW = 1 << 16  # rows shorter than this double when they grow
HEADROOM = 8  # longer rows grow to need + need / HEADROOM
FIRST_ROOM = 1 + 2 / HEADROOM  # a first buffer: room for one growth step of its long rows (need / HEADROOM, padded)
SPARE = 2  # a table re-laid again gets a buffer of SPARE x its size (buffers are anonymous mappings: memory once written)


def id_dtype(limit: int | None):
    """int32 for ids (addresses, places) known to stay below 2**31 - 1: half the bytes of int64 tables."""
    return np.int32 if limit is not None and limit < 2**31 - 1 else np.int64


def pad64(n: int) -> int:
    return -(-n // 64) * 64


class IdStack:
    """Free list of integer ids in [lo, hi): never-used ids come out ascending, freed ids are reused LIFO.

    Memory grows with the ids freed, not with the range (pools of tens of millions of slots stay cheap)."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi, self.fresh = lo, hi, lo
        self._buf = np.zeros(0, dtype=np.int64)
        self._len = 0

    def __len__(self) -> int:
        return self._len + (self.hi - self.fresh)

    def high_after(self, n: int) -> int:
        """The highest id + 1 handed out once `n` more are popped (freed ids come first)."""
        return self.fresh + max(0, n - self._len)

    def pop(self, n: int) -> np.ndarray:
        if n > len(self):
            raise AssertionError("IdStack.pop beyond capacity (callers check first)")
        k = min(n, self._len)
        reused = self._buf[self._len - k:self._len][::-1].copy()
        self._len -= k
        fresh = np.arange(self.fresh, self.fresh + (n - k), dtype=np.int64)
        self.fresh += n - k
        return np.concatenate([reused, fresh]) if k else fresh

    def pop_few(self, n: int) -> list:
        """`pop` as a list of Python ints, without array passes (a few ids: a decode token's)."""
        if n > len(self):
            raise AssertionError("IdStack.pop beyond capacity (callers check first)")
        k = min(n, self._len)
        out = self._buf[self._len - k:self._len][::-1].tolist() if k else []
        self._len -= k
        out.extend(range(self.fresh, self.fresh + (n - k)))
        self.fresh += n - k
        return out

    def push(self, ids: np.ndarray) -> None:
        need = self._len + ids.size
        if need > self._buf.size:
            grown = np.zeros(max(need, 2 * self._buf.size, 1024), dtype=np.int64)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len:need] = ids[::-1]
        self._len = need


def _grown(cap, need, floor: int, limit: int):
    """Row length after growth to `need` (> cap): a row's first storage is exactly `need` (at least `floor`): a
    table filled once costs what it holds, unless need is within 1/HEADROOM of `limit`: then the limit (the next
    token would grow the row there, re-laying every table); then short rows double (few events while they are
    small) and long rows get need + need / HEADROOM (the slack stays below 1/HEADROOM of the use, where doubling
    left up to 1x). Callers cap the result at the limit."""
    regrow = np.maximum(need + need // HEADROOM, np.where(cap < SMALL_ROW, 2 * cap, 0))
    first = np.where(need + need // HEADROOM >= limit, limit, np.maximum(floor, need))
    return np.where(cap > 0, np.maximum(floor, regrow), first)


class _Buffers:
    """Storage re-laid in place: a table's first buffer has room for one growth step (FIRST_ROOM: a prompt's rows,
    then its first decode tokens), a later one SPARE x its new size, and the caller holds a prefix view of it, so
    growth moves rows inside the buffer instead of copying every row into fresh pages (first-touch page faults were
    most of a re-layout's cost: 1.4 GB/s measured, vs ~20 GB/s for a copy within written pages; on this project's
    2-core VM a first touch costs ~0.8 CPU-s per 100 MB). The buffer is an anonymous mapping of its own: its pages are zero and cost memory only
    once written (numpy's own allocation would be recycled heap that calloc clears in full, or huge pages that
    make the untouched room resident), and unmapping it on release gives the address space back. Buffers are known
    by identity (weak references), never guessed from a view's base."""

    def __init__(self):
        self.known: dict[int, tuple] = {}  # id(flat mapping array) -> (its weak reference, the buffer's shape)
        self.held: dict[int, int] = {}  # id(flat mapping array) -> bytes of its prefix in use (`mapped_bytes`)

    def hold(self, buf: np.ndarray, view: np.ndarray) -> None:
        """Note the bytes of `buf`'s prefix in use (`view`) once a re-layout is done."""
        if buf.base is not None and id(buf.base) in self.known:
            self.held[id(buf.base)] = view.nbytes

    def _forget(self, ref, key: int) -> None:
        if self.known.get(key, (None,))[0] is ref:
            self.known.pop(key)
            self.held.pop(key, None)

    def room(self, arr: np.ndarray, n: int, axis: int):
        """(buffer, length written along `axis`) when `arr` is a prefix view of a buffer made here with room for n."""
        flat = arr.base
        entry = None if flat is None else self.known.get(id(flat))
        if entry is None or entry[0]() is not flat:
            return None, -1
        b = flat.reshape(entry[1])
        if b.shape[axis] < n or b.ndim != arr.ndim or arr.strides != b.strides:
            return None, -1
        if any(x != y for k, (x, y) in enumerate(zip(b.shape, arr.shape)) if k != axis % b.ndim):
            return None, -1
        if arr.__array_interface__["data"][0] != b.__array_interface__["data"][0]:
            return None, -1
        return b, arr.shape[axis]

    def new(self, arr: np.ndarray, n: int, axis: int, room: float):
        """(a new buffer with room for n * room along `axis`, 0: it is known zero from there on); a mapping."""
        shape = list(arr.shape)
        shape[axis] = max(n, int(n * room))
        nbytes = int(np.prod(shape, dtype=np.int64)) * arr.dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype=arr.dtype), -1
        mem = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        flat = np.frombuffer(mem, dtype=arr.dtype)  # views of it name it as their base
        key = id(flat)
        self.known[key] = (weakref.ref(flat, lambda r, k=key: self._forget(r, k)), tuple(shape))
        return flat.reshape(shape), 0


_BUFFERS = _Buffers()


def mapped_bytes() -> int:
    """Bytes of the re-laid tables in use (their buffers' prefixes), all live buffers of the process: the library's
    storage outside numpy's allocator (tracemalloc does not see mappings; sim/footprint's probes add this)."""
    return sum(_BUFFERS.held.values())


def _prefix(buf: np.ndarray, n: int, axis: int) -> np.ndarray:
    if buf.shape[axis] == n:
        return buf
    return buf[:n] if axis == 0 else buf[..., :n]


def _move(dst: np.ndarray, src: np.ndarray, d: int, s: int, length: int, axis: int) -> None:
    """dst[d:d + length] = src[s:s + length] along `axis` (0 or -1); overlapping moves within one buffer are
    done per leading row when rows are strided (numpy's overlap copy of a strided block is ~10x slower)."""
    if axis == 0 or dst.ndim == 1 or dst is not src:
        if axis == 0:
            dst[d:d + length] = src[s:s + length]
        else:
            dst[..., d:d + length] = src[..., s:s + length]
        return
    for row in range(dst.shape[0]):  # loop over leading rows (a few tables)
        dst[row, d:d + length] = src[row, s:s + length]


def _parts(buf: np.ndarray, a: int, b: int, axis: int) -> list[np.ndarray]:
    """[a, b) along `axis` as contiguous pieces: one block (axis 0, or 1-D), else one piece per leading row."""
    if axis == 0 or buf.ndim == 1:
        return [buf[a:b] if axis == 0 else buf[..., a:b]]
    return [buf[i][..., a:b] for i in np.ndindex(*buf.shape[:-1])]


def _lazy_put(dst: np.ndarray, src: np.ndarray | None, dst_zero: bool) -> None:
    """dst = src (None: zeros) in a zero-filled table without writing pages that stay zero: an all-zero source is
    written only where dst is not already zero (`dst_zero`: known zero), so untouched pages of a mapping stay
    unmapped (a page's first write is the costly part of a re-layout, and what makes it resident)."""
    if src is not None and _any(src):
        dst[...] = src
    elif not dst_zero and _any(dst):
        dst[...] = 0


def _any(a: np.ndarray) -> bool:
    """Whether `a` holds a non-zero element; a structured array by its fields (its own any() reads every record as
    False: re-laid that way, the TP local buffers' slot maps lost their keys)."""
    if a.dtype.names is None:
        return bool(a.any())
    return any(bool(a[name].any()) for name in a.dtype.names)


def _relayout(arr: np.ndarray, olds: list[int], oleft: list[int], news: list[int], left: list[int], total: int,
              fill, axis: int) -> np.ndarray:
    """Rows of `arr` (row r: [olds[r], olds[r] + oleft[r]) along `axis`) moved to [news[r], ...) in storage of
    `total`, [news[r] + oleft[r], news[r] + left[r]) filled; in place when `arr`'s buffer has room. Zero-filled
    tables are written only where a value is not zero already (`_lazy_put`)."""
    buf, zero = _BUFFERS.room(arr, total, axis)  # zero: where the buffer is still all zero (-1: unknown)
    src = buf
    if buf is None:  # a new buffer: room for one growth step the first time, SPARE x after
        (buf, zero), src = _BUFFERS.new(arr, total, axis, FIRST_ROOM if arr.shape[axis] == 0 else SPARE), arr
    lazy = fill == 0 and zero >= 0  # a mapping: pages never written are zero and cost nothing
    zero = zero if fill == 0 else -1  # zero fills stop there (those pages stay unmapped)
    for r in range(len(olds) - 1, -1, -1):  # loop over rows, last first: moves go right, none overwrites a row to come
        o, n, oc, c = olds[r], news[r], oleft[r], left[r]
        if oc and lazy:
            for d_part, s_part in zip(_parts(buf, n, n + oc, axis), _parts(src, o, o + oc, axis)):
                if src is not buf or o != n:
                    _lazy_put(d_part, s_part, dst_zero=n >= zero)
        elif oc and (src is not buf or o != n):
            _move(buf, src, n, o, oc, axis)
        lo, hi = n + oc, n + c if zero < 0 else min(n + c, zero)
        if hi > lo:
            if lazy:
                for part in _parts(buf, lo, hi, axis):
                    _lazy_put(part, None, dst_zero=False)
            elif axis == 0:
                buf[lo:hi] = fill
            else:
                buf[..., lo:hi] = fill
    out = _prefix(buf, total, axis)
    _BUFFERS.hold(buf, out)
    return out


class RankRows:
    """Rank r's ids [r * stride, r * stride + limit) kept in row r of (R, cap) storage; cap grows (x2 while short,
    then by 1/HEADROOM) up to limit (a multiple of 64 while limit is). Callers re-lay their arrays with `relayout`
    when `grow` says so."""

    def __init__(self, num_ranks: int, stride: int, limit: int, floor: int = GROW_FLOOR):
        self.R, self.stride, self.limit, self.cap, self.floor = num_ranks, stride, limit, 0, floor

    @property
    def identity(self) -> bool:
        return self.R == 1 or self.cap == self.stride

    def index(self, ids: np.ndarray) -> np.ndarray:
        """Storage positions of ids (>= 0, below the row's cap)."""
        if self.identity:
            return ids
        return ids + (ids // self.stride) * (self.cap - self.stride)

    def ids(self, index: np.ndarray) -> np.ndarray:
        if self.identity:
            return index
        return index + (index // self.cap) * (self.stride - self.cap)

    def grow(self, need: int) -> int:
        """Make cap >= need (need <= limit); returns the old cap (== cap when nothing changed)."""
        old = self.cap
        if need > old:
            cap = int(_grown(old, need, self.floor, self.limit))
            cap = pad64(cap) if self.limit % 64 == 0 else cap
            self.cap = min(cap, self.limit)
        return old

    def _rows(self, old: int, per_id: float):
        o, n = int(old * per_id), int(self.cap * per_id)
        R = self.R
        return [r * o for r in range(R)], [o] * R, [r * n for r in range(R)], [n] * R, R * n

    def relayout(self, arr: np.ndarray, old: int, fill, per_id: float = 1) -> np.ndarray:
        """`arr` (R rows of old * per_id elements, trailing dims kept) re-laid to rows of cap * per_id elements, in
        place when its buffer has room (rows move right, last first)."""
        return _relayout(arr, *self._rows(old, per_id), fill, 0)

    def relayout_stacked(self, arr: np.ndarray, old: int, fill, per_id: float = 1) -> np.ndarray:
        """`relayout` of each row of a 2-D `arr` (M tables laid out like the ids): one (M, R * cap * per_id) array."""
        return _relayout(arr, *self._rows(old, per_id), fill, -1)


class RaggedRows:
    """Rank r's ids [r * stride, r * stride + limit) kept in row r of storage, at offs[r], caps[r] long: each row
    grows on its own (from `floor`; x2 while short, then by 1/HEADROOM), so storage is the sum of the rows in use,
    not ranks x the fullest (a DP rank holding one request costs one row). Rows lie in rank order, ascending
    within: storage order is id order. `grow` returns the old layout, which `relayout` takes to re-lay arrays laid
    out like the ids."""

    def __init__(self, num_ranks: int, stride: int, limit: int, floor: int = GROW_FLOOR):
        self.R, self.stride, self.limit, self.floor = num_ranks, stride, limit, floor
        self.caps = np.zeros(num_ranks, dtype=np.int64)
        self.offs = np.zeros(num_ranks + 1, dtype=np.int64)
        self._shift = np.zeros(num_ranks, dtype=np.int64)  # offs[r] - r * stride

    @property
    def size(self) -> int:
        """Ids in storage, all rows."""
        return int(self.offs[-1])

    @property
    def identity(self) -> bool:
        return self.R == 1

    def layout(self) -> tuple[np.ndarray, np.ndarray]:
        return self.caps.copy(), self.offs.copy()

    def index(self, ids: np.ndarray) -> np.ndarray:
        """Storage positions of ids (each below its row's cap)."""
        if self.R == 1:
            return ids
        return ids + self._shift.take(ids // self.stride)

    def ids(self, index: np.ndarray, layout: tuple | None = None) -> np.ndarray:
        """Ids of ASCENDING storage positions (of `layout`, default the current one)."""
        if self.R == 1:
            return index
        caps, offs = (self.caps, self.offs) if layout is None else layout
        cut = np.searchsorted(index, offs[1:-1])
        n = np.diff(np.concatenate([[0], cut, [index.size]]))
        return index - np.repeat(offs[:-1] - np.arange(self.R, dtype=np.int64) * self.stride, n)

    def grow(self, need: np.ndarray):
        """Make caps[r] >= need[r] (<= limit); the old layout, or None when nothing changed. `need` of every rank
        (its ids in use where it does not grow): rows within 1/(2 HEADROOM) of full grow in the same event (one
        re-layout instead of one per rank as they fill in step)."""
        need = np.minimum(np.asarray(need, dtype=np.int64), self.limit)
        over = need > self.caps
        if not over.any():
            return None
        old = self.layout()
        grow = over | ((need > self.caps - self.caps // (2 * HEADROOM)) & (self.caps < self.limit))
        cap = _grown(self.caps, np.maximum(need, self.caps + 1), self.floor, self.limit)
        if self.limit % 64 == 0:
            cap = -(-cap // 64) * 64
        self.caps = np.where(grow, np.minimum(cap, self.limit), self.caps)
        self.offs = np.concatenate([[0], np.cumsum(self.caps)])
        self._shift = self.offs[:-1] - np.arange(self.R, dtype=np.int64) * self.stride
        return old

    def relayout(self, arr: np.ndarray, old: tuple, fill) -> np.ndarray:
        """`arr` (last axis laid out like the ids in layout `old`) re-laid to the current layout (in place when its
        buffer has room: the caller keeps the returned view)."""
        ocaps, ooffs = (x.tolist() for x in old)
        caps, offs = self.caps.tolist(), self.offs.tolist()
        return _relayout(arr, ooffs[:-1], ocaps, offs[:-1], caps, offs[-1], fill, -1)


__all__ = ["FIRST_ROOM", "GROW_FLOOR", "HEADROOM", "IdStack", "RaggedRows", "RankRows", "SMALL_ROW", "SPARE", "id_dtype",
           "mapped_bytes", "pad64"]
