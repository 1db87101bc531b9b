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
    """Exact LRU order of a pool whose touch batches carry strictly increasing stamps (the TP local buffers: one
    stamp per access batch): the batches kept whole, oldest first, each read when it reaches the front.

    An entry (storage position) of the batch stamped s is live while the pool's stamp there is still s: a later
    touch or a release (stamp `RELEASED`) kills it, so nothing is searched or sorted when slots are touched. A
    selection reads batches from the front: live entries, sorted once by position (storage order is (rank, slot)
    order), taken per rank up to the victims it needs; the rest of a partly used batch stays at the front, sorted.
    Slots to protect from a selection must carry a stamp newer than every logged one (the caller stamps the batch's
    hits first: their final stamp). Each logged entry is read O(1) times: a selection costs the entries that reached
    the front, not a pass over the pool. Entries are compacted (dead ones dropped) when they outnumber
    COMPACT_FACTOR x the occupied slots, so memory follows the slots in use."""

    def __init__(self, pool):
        self.pool = pool
        self.stamps: list[int] = []  # per batch, ascending
        self.batches: list[np.ndarray] = []  # storage positions (int32 while they fit)
        self.ordered: list[bool] = []  # sorted, no repeats
        self.size = 0
        pool.listeners.append(self._grow)

    def _grow(self, old: int) -> None:
        """Pool storage re-laid (rank rows of `old` slots now `cap`): move every logged position."""
        cap, R = self.pool.cap, self.pool.R
        if R == 1 or not old or old == cap:
            return
        self.batches = [(a + (a // old) * (cap - old)).astype(self._dtype(), copy=False) for a in self.batches]

    def _dtype(self):
        return np.int32 if self.pool.R * max(self.pool.cap, 1) < 2**31 else np.int64

    def append(self, idx: np.ndarray, stamp: int) -> None:
        """Log slots just stamped `stamp` (>= every stamp logged; equal: joins the last batch)."""
        if idx.size == 0:
            return
        a = idx.astype(self._dtype())
        if self.stamps and self.stamps[-1] == stamp:
            self.batches[-1] = np.concatenate([self.batches[-1], a])
            self.ordered[-1] = False
        else:
            self.stamps.append(int(stamp))
            self.batches.append(a)
            self.ordered.append(False)
        self.size += a.size
        if self.size > COMPACT_FACTOR * int(self.pool.in_use.sum()) + COMPACT_FLOOR * self.pool.R:
            self.compact()

    def _live(self, k: int) -> np.ndarray:
        a = self.batches[k]
        return a.take(np.flatnonzero(self.pool.stamp.take(a) == self.stamps[k]))

    def compact(self) -> None:
        """Drop dead entries (order kept)."""
        keep = [(s, self._live(k), o) for k, (s, o) in enumerate(zip(self.stamps, self.ordered))]
        keep = [t for t in keep if t[1].size]
        self.stamps, self.batches, self.ordered = [t[0] for t in keep], [t[1] for t in keep], [t[2] for t in keep]
        self.size = sum(a.size for a in self.batches)

    def select(self, need: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per rank the need[r] live entries with the smallest (stamp, slot), as parts (one per batch read, storage
        positions grouped by rank, int64) with found[r] per part (pools.merge_by_rank joins them)."""
        pool = self.pool
        R, cap = pool.R, max(pool.cap, 1)
        need = np.asarray(need, dtype=np.int64).copy()
        cuts = np.arange(R + 1, dtype=np.int64) * cap
        parts, found = [], []
        k = 0
        while k < len(self.batches) and need.any():  # batches oldest first; a batch left with entries stays
            live = self._live(k)
            if not self.ordered[k]:
                live = np.sort(live)
                if live.size > 1 and (live[1:] == live[:-1]).any():  # a slot touched twice at one stamp: once
                    live = live[np.concatenate([[True], live[1:] != live[:-1]])]
            b = np.searchsorted(live, cuts)
            have = np.diff(b)
            take = np.minimum(have, need)
            need -= take
            if (take == have).all():
                got, rest = live, live[:0]
            else:
                pos = np.arange(live.size) - np.repeat(b[:-1], have)
                mine = pos < np.repeat(take, have)
                got, rest = live[mine], live[~mine]
            if got.size:
                parts.append(got.astype(np.int64))
                found.append(take)
            self.size -= self.batches[k].size - rest.size
            if rest.size:
                self.batches[k], self.ordered[k] = rest, True
                k += 1
            else:
                del self.stamps[k], self.batches[k], self.ordered[k]
        return parts, found


COMPACT_FACTOR = 4  # logged entries allowed per occupied slot before dead ones are dropped
COMPACT_FLOOR = 4096  # ... and per rank beyond that
RELEASED = -1  # stamp of a released slot: never logged, so the slot's entries are dead


__all__ = ["COMPACT_FACTOR", "COMPACT_FLOOR", "LruLog", "RELEASED", "StampLog"]
