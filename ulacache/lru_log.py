"""Exact LRU order of a pool's slots without a pass over the pool: per rank, a queue of the touches in (stamp, slot)
order.

Every stamp write is logged (stamps never decrease between selections). Before a selection, a rank's new touches
are sorted by (stamp, slot) once and appended to its queue as a segment (merged with the queue's tail if a stamp
repeats). A selection reads each rank's queue from its front in chunks: an entry is live while the slot still
carries that stamp and is occupied; the first counts[r] live entries not protected by the batch are the victims.
Entries passed over are taken, protected (this batch's hits) or stale -- the first two are re-stamped when the plan
commits -- so the fronts only move forward and each logged entry is examined O(1) times: a selection costs the
victims, the entries gone stale before them and a sort of the touches since the last one, not a pass over the
pool. The result equals `lru_select` over all occupied, unprotected slots: per rank the smallest (stamp, slot).
A queue is rebuilt from the pool when its entries outnumber twice the rank's occupied slots (amortized O(1)).

The log pays a sort of the touches, the scan a pass over the pool: when a step touches most of the pool (TP local
buffers at the pinned-keys config: measured 141 s in the log vs ~30 s scanning, profiled), scanning is cheaper.
Modes: "auto" (the default: the log runs after 4 selections in a row that take < 1/16 of the occupied slots and
follow < 1/8 of them touched, rebuilt then, and is dropped at one beyond 1/4 taken or 1/8 touched), "log" (always,
from the pool's creation), "scan" (nothing logged). Tests check every mode against the scan.
"""
from __future__ import annotations

import numpy as np

from . import slot_map

REBUILD_FLOOR = 1024  # logged entries per rank allowed beyond twice its occupied slots before a rebuild
_EMPTY = np.zeros(0, dtype=np.int64)


class _Queue:
    """One rank's log: pending touches (raw) and sorted segments [idx, stamp] read from `front`."""

    __slots__ = ("raw", "raw_stamps", "segs", "front", "size")

    def __init__(self) -> None:
        self.raw: list[np.ndarray] = []
        self.raw_stamps: list[int] = []
        self.segs: list[list[np.ndarray]] = []
        self.front = 0  # into segs[0]
        self.size = 0  # entries held (raw + unread)


class LruLog:
    def __init__(self, pool, mode: str = "auto"):
        self.pool, self.mode = pool, mode
        self.active = mode == "log"
        self.small_runs = 0
        self.touched = 0  # slots touched since the last selection (counted in every mode)
        self.queues = [_Queue() for _ in range(pool.R)]
        self.scratch = np.zeros(0, dtype=bool)  # protected marks over storage

    @property
    def size(self) -> int:
        return sum(q.size for q in self.queues)

    def use_log(self, counts: np.ndarray) -> bool:
        """Whether this selection reads the log (switching modes as the docstring says)."""
        if self.mode != "auto":
            return self.mode == "log"
        total, occupied = int(counts.sum()), int(self.pool.in_use.sum())
        touched, self.touched = self.touched, 0
        if self.active and (total * 4 > occupied or touched * 8 > occupied):
            self.active = False
            self.queues = [_Queue() for _ in range(self.pool.R)]
        elif not self.active:
            small = total * 16 < occupied and touched * 8 < occupied
            self.small_runs = self.small_runs + 1 if small else 0
            if self.small_runs >= 4:
                self.rebuild()
                self.active = True
        return self.active

    def touch(self, idx: np.ndarray, stamp: int) -> None:
        self.touched += idx.size
        if idx.size == 0 or not self.active:
            return
        idx = np.array(idx, dtype=np.int64)
        if self.pool.R == 1:
            parts = [(0, idx)]
        else:
            rank = idx // max(self.pool.cap, 1)
            if rank.size > 1 and (rank[1:] < rank[:-1]).any():
                order = np.argsort(rank, kind="stable")
                idx, rank = idx[order], rank[order]
            n = np.bincount(rank, minlength=self.pool.R)
            ends = np.cumsum(n).tolist()
            parts = [(r, idx[e - c:e]) for r, (e, c) in enumerate(zip(ends, n.tolist())) if c]
        stamp = int(stamp)
        for r, part in parts:  # loop over ranks
            q = self.queues[r]
            q.raw.append(part)
            q.raw_stamps.append(stamp)
            q.size += part.size
            if q.size > 2 * int(self.pool.in_use[r]) + REBUILD_FLOOR:  # memory follows the occupied slots
                self._rebuild_rank(r)

    def rebuild(self) -> None:
        """The log of the pool as it is: each rank's occupied slots in (stamp, slot) order."""
        pool = self.pool
        self.queues = [_Queue() for _ in range(pool.R)]
        occ = np.flatnonzero(pool.own >= 0)
        if occ.size == 0:
            return
        st = pool.stamp[occ]
        order = np.lexsort((occ, st, occ // max(pool.cap, 1)))
        occ, st = occ[order], st[order]
        n = np.bincount(occ // max(pool.cap, 1), minlength=pool.R)
        ends = np.cumsum(n).tolist()
        for r, (e, c) in enumerate(zip(ends, n.tolist())):  # loop over ranks
            if c:
                q = self.queues[r]
                q.segs, q.size = [[occ[e - c:e], st[e - c:e]]], c

    def remap(self, fn) -> None:
        """Storage positions changed (pool growth): map every logged position (monotone within a rank)."""
        for q in self.queues:
            q.raw = [fn(a) for a in q.raw]
            for seg in q.segs:
                seg[0] = fn(seg[0])

    def _consolidate(self, q: _Queue) -> None:
        """Sort the rank's new touches by (stamp, slot) into its queue (merged with the tail where stamps meet)."""
        if not q.raw:
            return
        a = np.concatenate(q.raw) if len(q.raw) > 1 else q.raw[0]
        s = np.repeat(np.array(q.raw_stamps, dtype=np.int64), [p.size for p in q.raw])
        q.raw, q.raw_stamps = [], []
        low = int(s.min())
        back = []
        while q.segs and int(q.segs[-1][1][-1]) >= low:  # a stamp repeats: re-sort the tail with the new touches
            idx, st = q.segs.pop()
            f = q.front if not q.segs else 0
            if not q.segs:
                q.front = 0
            back.append((idx[f:], st[f:]))
        if back:
            a = np.concatenate([a, *(b[0] for b in back)])
            s = np.concatenate([s, *(b[1] for b in back)])
        if back or s[0] != s[-1]:  # several stamps: order by (stamp, slot)
            order = np.lexsort((a, s))
            a, s = a[order], s[order]
        else:  # one stamp (the usual: a commit's hits and dests)
            a = np.sort(a)
        if a.size > 1:  # a slot touched twice at one stamp: keep one entry
            keep = np.concatenate([[True], (a[1:] != a[:-1]) | (s[1:] != s[:-1])])
            q.size -= a.size - int(keep.sum())
            a, s = a[keep], s[keep]
        q.segs.append([a, s])

    def select(self, counts: np.ndarray, protected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per rank the counts[r] occupied, unprotected slots with the smallest (stamp, slot), grouped by rank in
        that order (storage positions); and found per rank."""
        pool = self.pool
        n_store = pool.own.size
        if self.scratch.size != n_store:
            self.scratch = np.zeros(n_store, dtype=bool)
        mark = self.scratch
        mark[protected] = True
        found = np.zeros(pool.R, dtype=np.int64)
        parts = []
        try:
            for r in np.flatnonzero(counts).tolist():  # loop over ranks with victims to find
                q = self.queues[r]
                self._consolidate(q)
                got = self._take(q, int(counts[r]), mark)
                found[r] = got.size
                parts.append(got)
                if q.size > 2 * int(pool.in_use[r]) + REBUILD_FLOOR:
                    self._rebuild_rank(r)
        finally:
            mark[protected] = False
        return (np.concatenate(parts) if parts else _EMPTY), found

    def _rebuild_rank(self, r: int) -> None:
        pool, q = self.pool, self.queues[r]
        cap = max(pool.cap, 1)
        self._consolidate(q)
        live = [seg[0][(q.front if i == 0 else 0):] for i, seg in enumerate(q.segs)]
        a = np.concatenate(live) if live else _EMPTY
        s = pool.stamp[a]
        ok = (pool.own[a] >= 0) & (a // cap == r)
        if q.segs:
            st = np.concatenate([seg[1][(q.front if i == 0 else 0):] for i, seg in enumerate(q.segs)])
            ok &= s == st
        a, s = a[ok], s[ok]
        q.segs, q.front, q.size = ([[a, s]] if a.size else []), 0, int(a.size)

    def _take(self, q: _Queue, need: int, mark: np.ndarray) -> np.ndarray:
        """Up to `need` live, unprotected entries from the rank's queue front; the front moves past them."""
        pool, out = self.pool, []
        while need > 0 and q.segs:
            idx, st = q.segs[0]
            f = q.front
            end = min(idx.size, f + max(2 * need, 256))
            chunk = idx[f:end]
            ok = (pool.stamp[chunk] == st[f:end]) & (pool.own[chunk] >= 0) & ~mark[chunk]
            pos = np.flatnonzero(ok)
            if pos.size >= need:
                out.append(chunk.take(pos[:need]))
                adv = int(pos[need - 1]) + 1
                need = 0
            else:
                out.append(chunk.take(pos))
                need -= pos.size
                adv = chunk.size
            q.front += adv
            q.size -= adv
            if q.front >= idx.size:
                q.segs.pop(0)
                q.front = 0
        return np.concatenate(out) if len(out) > 1 else (out[0] if out else _EMPTY)


class StampLog:
    """Exact LRU order of the TP local buffers without a pass over them: the access batches' addresses, oldest first.

    Every rank executes every batch and touches each of its addresses not homed there (a hit, or a miss that takes
    a slot), so a buffer slot's last touch is the last batch holding its address: one stamp per address (`last`,
    laid out like the address space), not one per rank and slot. Batch k's address a is live while last[a] == k,
    and a victim candidate of rank r while r holds a copy of it. A selection reads batches oldest first: per rank
    the candidates in slot order, the first need[r] taken -- per rank the smallest (stamp, slot), what a scan of
    the occupied slots not touched by the batch gives. The caller looks the batch up (`lookup`, which stamps it:
    its hits are then no candidates) before selecting and logs it (`append`) after. Reading a batch drops its addresses gone dead
    or held nowhere; `left[k][r]` bounds the candidates batch k still has for rank r, so a selection skips batches
    without any for the ranks that need victims (per-rank fronts) and a batch is dropped once it has none. A log
    entry is an address per batch (the pinned-keys TP replay: ~18k per batch, where one per rank and slot touched
    was ~124k), kept as its storage position in the address space (re-mapped when that storage grows), so reading
    a batch needs no address translation. Dead addresses are dropped when the log outgrows COMPACT_FACTOR x the
    live entries or the slots in use, so memory follows the copies held."""

    def __init__(self, pool, space):
        self.pool, self.space = pool, space
        self.last = np.zeros(space.table.size, dtype=np.int32)  # last batch of each address (0: none)
        self.stamps: list[int] = []  # per batch, ascending
        self.batches: list[np.ndarray] = []  # storage positions of its addresses, ascending
        self.left: list[np.ndarray] = []  # per batch: candidates left per rank (an upper bound)
        self.rows: list[np.ndarray | None] = []  # per batch read and left with candidates: its maps rows (`select`)
        self.size = 0
        self.limit = 0  # size that triggers a compaction
        # Per rank the newest batch it took victims from (0: none yet). Victims go oldest batch first, so a rank holds
        # no copy of an address last touched before its front and every copy of one touched after it (every rank
        # takes in every address of a batch not homed on it): `lookup` reads hits from the stamps, the maps only
        # for addresses last touched at a front.
        self.front = np.zeros(pool.R, dtype=self.last.dtype)
        space.listeners.append(self._grow)

    def _grow(self, old) -> None:
        self.last = self.space.rows.relayout(self.last, old, 0)
        rows, dt = self.space.rows, self._dtype(self.space.size)
        self.batches = [rows.index(rows.ids(ix, old)).astype(dt, copy=False) for ix in self.batches]

    @staticmethod
    def _dtype(limit: int):
        """int32 for values below `limit` when it fits (half the bytes to sort)."""
        return np.int32 if limit < 2**31 else np.int64

    def stamp(self, ix: np.ndarray, stamp: int) -> None:
        """Addresses (storage positions `ix`) touched by the batch `stamp` (> every stamp logged)."""
        self.last[ix] = stamp

    def forget(self, ix: np.ndarray) -> None:
        """Addresses (storage positions `ix`) freed: no rank holds a copy (their log entries die)."""
        self.last[ix] = 0

    def lookup(self, addrs: np.ndarray, ix: np.ndarray, bounds: list[int], stamp: int, maps):
        """Every rank's look-up of the ascending batch `addrs` (storage positions `ix`) but its own homes
        (addrs[bounds[r]:bounds[r + 1]]), which it then stamps (`stamp` > every stamp logged): (hits per rank, miss
        indices into addrs grouped by rank, ascending within a rank, misses per rank). Rank r holds a copy of an
        address last touched after front[r] and none of one touched before; the maps (`rank_major`) are read only
        for the addresses last touched at a front."""
        old = self.last.take(ix)
        self.last[ix] = stamp
        front = self.front
        absent = old <= front[:, None]  # (R, U): no copy
        for f in np.unique(front[front > 0]).tolist():  # loop over distinct fronts (a few): copies there by the maps
            cols = np.flatnonzero(old == f)
            if cols.size:
                rs = np.flatnonzero(front == f)
                held = maps.rank_major(None if maps.by_index else addrs.take(cols), ix.take(cols))
                absent[np.ix_(rs, cols)] = held.take(rs, axis=0) == 0
        return slot_map.misses_by_rank(absent, bounds)

    def append(self, ix: np.ndarray, stamp: int, counts: np.ndarray) -> None:
        """Log the batch `stamp`'s addresses (storage positions `ix`, ascending; stamped already); counts[r]: the
        addresses rank r touched."""
        if ix.size == 0:
            return
        a = ix.astype(self._dtype(self.space.size))
        if self.stamps and self.stamps[-1] == stamp:  # the same batch again: one entry per address
            a = np.union1d(self.batches[-1], a)
            self.size -= self.batches[-1].size
            self.batches[-1] = a
            self.left[-1] = self.left[-1] + counts
            self.rows[-1] = None  # this plan's commit writes rows of its addresses
        else:
            self.stamps.append(int(stamp))
            self.batches.append(a)
            self.left.append(np.asarray(counts, dtype=np.int64).copy())
            self.rows.append(None)
        self.size += a.size
        if self.size > self.limit:
            self.compact()

    def compact(self) -> None:
        """Drop dead addresses (order kept)."""
        keep = []
        for s, a, left, rows in zip(self.stamps, self.batches, self.left, self.rows):  # loop over batches
            live = self.last.take(a) == s
            a = a[live]
            if a.size:
                keep.append((s, a, left, None if rows is None else rows[live]))
        self.stamps, self.batches, self.left, self.rows = ([t[i] for t in keep] for i in range(4))
        self.size = sum(a.size for a in self.batches)
        self.limit = COMPACT_FACTOR * max(self.size, int(self.pool.in_use.sum())) + COMPACT_FLOOR * self.pool.R

    def select(self, need: np.ndarray, maps) -> tuple[np.ndarray, np.ndarray, list]:
        """Per rank the need[r] candidates with the smallest (stamp, slot), as buffer-local places (r * seg + slot,
        int64) grouped by rank in that order; found[r]; and the victims' removal from the maps, for the plan's commit
        (`maps.drop_rows`, hash maps `maps.drop`, of each batch read, for `maps.write`). `maps`: the buffers' slot
        maps (dense: `rows` of addresses; hash: `rank_major`, every rank's slot + 1). A batch read and left with
        candidates keeps (dense maps) the maps' rows of its addresses as this plan's commit leaves them: its next
        read takes its live ones from there, not from the table (no one else writes those rows: the addresses of
        later batches are dead in it; `append` drops them when a batch is logged again at its stamp). Per rank the
        candidates are the row's nonzero cells: slot + 1 - 1 as unsigned wraps the empty ones to the top, so a
        partition of the whole row (then a sort of the t taken) finds the t smallest without gathering them."""
        R = self.pool.R
        need = np.asarray(need, dtype=np.int64).copy()
        mine: list[list[np.ndarray]] = [[] for _ in range(R)]  # per rank: slots taken, per batch read
        found, taken = np.zeros(R, dtype=np.int64), []
        dense = maps.by_index
        k = 0
        while k < len(self.batches) and need.any():  # batches oldest first; a batch left with candidates stays
            if not np.logical_and(self.left[k] > 0, need > 0).any():  # nothing here for the ranks that need
                k += 1
                continue
            ix, rows, a, held = self._read_batch(k, maps, dense)
            mask = held != 0  # (nonzero of a bool array is ~5x faster than of int32)
            have = _row_counts(mask)
            take = np.minimum(have, need)
            sel = np.flatnonzero(take)
            keep, lim = mask, None
            if sel.size:
                self.front[sel] = self.stamps[k]
                lim = _take_smallest(held, take, have, sel, mine)
                found += take
                need -= take
                if dense:
                    change, rows = maps.drop_rows(ix, rows, lim)
                    taken.append(change)
                else:
                    taken.append(maps.drop(ix, a, held, held * (held > lim[:, None])))
                keep = None
            k = self._keep_left(k, ix, rows if dense else None, held, keep, lim, have - take)
        return _buffer_places(mine, found, self.pool.seg), found, taken

    def _read_batch(self, k: int, maps, dense: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None,
                                                                np.ndarray]:
        """`select`'s view of logged batch k: (its live storage positions, their map rows (dense maps), their
        addresses (hash maps), held (R, live addresses) slot + 1 per rank, 0: no copy)."""
        ix, rows = self.batches[k], self.rows[k] if dense else None
        live = self.last.take(ix) == self.stamps[k]
        if not live.all():
            ix = ix[live]
            if rows is not None:
                rows = rows[live]
        if not dense:
            a = self.space.rows.ids(ix)
            return ix, None, a, maps.rank_major(a, ix)
        if rows is None:
            rows = maps.rows(ix)
        return ix, rows, None, np.ascontiguousarray(maps.cells(rows).T)

    def _keep_left(self, k: int, ix: np.ndarray, rows, held: np.ndarray, keep, lim, left: np.ndarray) -> int:
        """After `select` took from batch k: keep its addresses some rank still holds (`keep`: which, or None to
        derive from the taken slots' bound `lim`) with `left` candidates per rank, or drop it. The next k."""
        if not left.any():
            self.size -= self.batches[k].size
            del self.stamps[k], self.batches[k], self.left[k], self.rows[k]
            return k
        if keep is None:
            keep = held > lim[:, None]  # copies not taken (held ones only: lim >= 0)
        anyh = keep.any(axis=0)  # addresses no rank holds once this plan commits are no candidates again
        if not anyh.all():
            ix = ix[anyh]
            if rows is not None:
                rows = rows[anyh]
        self.size += ix.size - self.batches[k].size
        self.batches[k], self.left[k], self.rows[k] = ix, left, rows
        return k + 1

    def check(self, require, ix: np.ndarray, maps=None) -> None:
        """Every held address (storage positions `ix`) is in the logged batch of its last stamp; the rows a batch
        keeps are the maps' rows of its live addresses."""
        last = self.last.take(ix)
        at = dict(zip(self.stamps, self.batches))
        for s in np.unique(last).tolist():  # loop over stamps (tests only)
            batch = at.get(s)
            mine = ix[last == s]
            require(batch is not None and np.isin(mine, batch).all(), "a held copy is missing from the LRU log")
        for s, a, rows in zip(self.stamps, self.batches, self.rows):  # loop over batches (tests only)
            if rows is not None and maps is not None and maps.by_index:
                live = self.last.take(a) == s
                require(rows.size == a.size and np.array_equal(maps.cells(rows[live]), maps.cells(maps.rows(a[live]))),
                        "a logged batch's rows disagree with the maps")


def _take_smallest(held: np.ndarray, take: np.ndarray, have: np.ndarray, sel: np.ndarray, mine: list) -> np.ndarray:
    """Per rank r in `sel` the take[r] smallest slots of held[r] (slot + 1, 0 = empty), in order, appended to mine[r];
    returns lim: per rank the largest taken slot + 1 (held's dtype: comparing it with int64 casts every cell), or the
    dtype's top when the rank took every copy it had. Empty cells wrap to the top as unsigned slot + 1 - 1. 16 bits:
    the stable sort is a radix sort, O(n): ~8x faster than partition + quicksort."""
    R, n = held.shape
    slots = held.view(_UNSIGNED[held.dtype.itemsize]) - 1
    lim = np.zeros(R, dtype=held.dtype)
    radix = held.dtype.itemsize <= 2
    every = np.iinfo(held.dtype).max  # slot + 1 <= the buffer's slots < every (slot_map._dense_dtype)
    for r in sel.tolist():  # loop over ranks
        t = int(take[r])
        x = slots[r]
        if radix:
            got = np.sort(x, kind="stable")[:t]
        else:
            got = np.partition(x, t - 1)[:t] if t < n else x.copy()
            got.sort()
        lim[r] = int(got[t - 1]) + 1 if t < have[r] else every
        mine[r].append(got)
    return lim


def _buffer_places(mine: list, found: np.ndarray, seg: int) -> np.ndarray:
    """The slots taken per rank, per batch read, as buffer-local places (rank r's slot s is r * seg + s), int64."""
    out, e = np.empty(int(found.sum()), dtype=np.int64), 0
    for r, parts in enumerate(mine):  # loop over ranks
        for got in parts:  # loop over the batches read
            np.add(got, r * seg, out=out[e:e + got.size], dtype=np.int64)
            e += got.size
    return out


def _row_counts(mask: np.ndarray) -> np.ndarray:
    """np.count_nonzero(mask, axis=1) of a few long rows, row by row (with an axis it sums through an integer cast:
    ~5x slower, measured on 8 x 20k)."""
    return np.array([np.count_nonzero(row) for row in mask], dtype=np.int64)  # loop over ranks


COMPACT_FACTOR = 4  # logged addresses allowed per live one (or per slot in use) before dead ones are dropped
COMPACT_FLOOR = 4096  # ... and per rank beyond that
_UNSIGNED = {2: np.uint16, 4: np.uint32, 8: np.uint64}  # held's cells as unsigned (slot + 1 - 1 wraps 0 to the top)


__all__ = ["COMPACT_FACTOR", "COMPACT_FLOOR", "LruLog", "StampLog"]
