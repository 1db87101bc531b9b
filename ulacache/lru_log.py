"""Exact LRU order of a pool's slots without a pass over the pool: the slots touched at each step, per stamp.

Every stamp write is logged under its stamp (stamps never decrease, so the log's keys are in order). A selection
walks the stamps from the oldest; a stamp's entries are consolidated once (live ones kept: stamp unchanged and
still occupied; sorted, so grouped by rank and ascending slot) and then read from a per-rank front. Entries passed
over are taken, protected (this batch's hits) or stale -- the first two are re-stamped when the plan commits -- so
the fronts only move forward and each logged entry is examined O(1) times. The result equals `lru_select` over all
occupied, unprotected slots: per rank the smallest (stamp, slot). The log is rebuilt from the pool when stale
entries outnumber twice the occupied slots (amortized O(1) per touch).

The log pays a sort of what it consolidates and a Python step per (stamp, rank) it walks, the scan a pass over
the pool. Measured in the simulator (TP 8, small batches, one stamp per step): walking many thin stamps cost more
than the scan, so the default mode is "scan" (the log is off, `touch` logs nothing) until the walk is batched.
Mode "auto" runs the log after 4 selections in a row that take < 1/16 of the occupied slots (rebuilt then) and
drops it at one that takes > 1/4; "log" forces it (tests check it equals the scan).
"""
from __future__ import annotations

import numpy as np

REBUILD_FLOOR = 65536  # logged entries allowed beyond twice the occupied slots before a rebuild


class _Stamp:
    """One stamp's entries: raw appended arrays, and once consolidated, sorted per-rank segments with fronts."""

    __slots__ = ("raw", "segs", "front")

    def __init__(self) -> None:
        self.raw: list[np.ndarray] = []
        self.segs: list[np.ndarray] | None = None
        self.front: list[int] = []


class LruLog:
    def __init__(self, pool, mode: str = "scan"):
        self.pool, self.mode = pool, mode
        self.active = mode == "log"
        self.small_runs = 0
        self.stamps: dict[int, _Stamp] = {}
        self.size = 0
        self.scratch = np.zeros(0, dtype=bool)  # protected marks over storage

    def use_log(self, counts: np.ndarray) -> bool:
        """Whether this selection reads the log (switching modes as the docstring says)."""
        if self.mode != "auto":
            return self.mode == "log"
        total, occupied = int(counts.sum()), int(self.pool.in_use.sum())
        if self.active and total * 4 > occupied:
            self.active, self.stamps, self.size = False, {}, 0
        elif not self.active:
            self.small_runs = self.small_runs + 1 if total * 16 < occupied else 0
            if self.small_runs >= 4:
                self.rebuild()
                self.active = True
        return self.active

    def touch(self, idx: np.ndarray, stamp: int) -> None:
        if idx.size == 0 or not self.active:
            return
        self.stamps.setdefault(int(stamp), _Stamp()).raw.append(np.array(idx, dtype=np.int64))
        self.size += idx.size
        if self.size > 2 * int(self.pool.in_use.sum()) + REBUILD_FLOOR:
            self.rebuild()

    def rebuild(self) -> None:
        """The log of the pool as it is: occupied slots grouped by stamp."""
        pool = self.pool
        occ = np.flatnonzero(pool.own >= 0)
        st = pool.stamp[occ]
        order = np.argsort(st, kind="stable")
        occ, st = occ[order], st[order]
        cut = np.flatnonzero(np.diff(st)) + 1
        self.stamps = {}
        for s, part in zip(st[np.concatenate([[0], cut])].tolist() if occ.size else [], np.split(occ, cut)):
            self.stamps.setdefault(int(s), _Stamp()).raw.append(part)
        self.size = int(occ.size)

    def remap(self, fn) -> None:
        """Storage positions changed (pool growth): map every logged position (monotone within a rank)."""
        for e in self.stamps.values():
            e.raw = [fn(a) for a in e.raw]
            if e.segs is not None:
                e.segs = [fn(a) for a in e.segs]

    def _consolidate(self, s: int, e: _Stamp) -> None:
        pool = self.pool
        parts = list(e.raw)
        held = sum(p.size for p in parts)
        if e.segs is not None:
            parts += [seg[f:] for seg, f in zip(e.segs, e.front)]
            held += sum(seg.size for seg in e.segs)
        a = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        a = a[(pool.stamp[a] == s) & (pool.own[a] >= 0)]
        a.sort()
        if a.size > 1:
            a = a[np.concatenate([[True], a[1:] != a[:-1]])]
        cap = max(pool.cap, 1)
        b = np.searchsorted(a, np.arange(pool.R + 1, dtype=np.int64) * cap).tolist()
        e.segs = [a[b[r]:b[r + 1]] for r in range(pool.R)]
        e.front = [0] * pool.R
        self.size += a.size - held
        e.raw = []

    def select(self, counts: np.ndarray, protected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per rank the counts[r] occupied, unprotected slots with the smallest (stamp, slot), grouped by rank in
        that order (storage positions); and found per rank."""
        from .pools import merge_by_rank

        pool = self.pool
        n_store = pool.own.size
        if self.scratch.size != n_store:
            self.scratch = np.zeros(n_store, dtype=bool)
        mark = self.scratch
        mark[protected] = True
        remaining = np.array(counts, dtype=np.int64)
        parts, founds = [], []
        try:
            for s in list(self.stamps):  # oldest stamp first
                if not remaining.any():
                    break
                e = self.stamps[s]
                if e.raw or e.segs is None:
                    self._consolidate(s, e)
                found = np.zeros(pool.R, dtype=np.int64)
                taken = []
                for r in np.flatnonzero(remaining).tolist():  # loop over ranks
                    got, e.front[r] = self._take(s, e.segs[r], e.front[r], int(remaining[r]), mark)
                    taken.append(got)
                    found[r] = got.size
                if all(f >= seg.size for seg, f in zip(e.segs, e.front)):
                    self.size -= sum(seg.size for seg in e.segs)
                    del self.stamps[s]
                if found.any():
                    parts.append(np.concatenate(taken))
                    founds.append(found)
                    remaining -= found
        finally:
            mark[protected] = False
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(pool.R, dtype=np.int64)
        return merge_by_rank(parts, founds), np.sum(founds, axis=0)

    def _take(self, s: int, seg: np.ndarray, front: int, need: int, mark: np.ndarray) -> tuple[np.ndarray, int]:
        """Up to `need` live, unprotected entries of one rank's segment from `front`; the new front."""
        pool, out = self.pool, []
        while need > 0 and front < seg.size:
            chunk = seg[front:front + max(2 * need, 256)]
            ok = (pool.stamp[chunk] == s) & (pool.own[chunk] >= 0) & ~mark[chunk]
            pos = np.flatnonzero(ok)
            if pos.size >= need:
                out.append(chunk.take(pos[:need]))
                return np.concatenate(out), front + int(pos[need - 1]) + 1
            out.append(chunk.take(pos))
            need -= pos.size
            front += chunk.size
        return (np.concatenate(out) if out else np.zeros(0, dtype=np.int64)), front


__all__ = ["LruLog"]
