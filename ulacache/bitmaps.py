"""PB-LRU recency buckets as membership bitmaps: a ring of current/recent buckets and one cold bucket.

The buckets age by epochs, not by calls: `epoch` is the bucket clock, and a GPU slot touched during epoch e (its
stamp) is in ring row e % (K + 1) while its age (epoch - e) is <= K, and in the cold bitmap after that. `rotate()`
opens the next epoch: the ring row that is about to hold it still holds epoch - K - 1, which just turned cold, so it
is OR-ed into the cold bitmap and cleared. When an epoch ends is the policy's rule (policies/pblru.py). Eviction
order (docs/architecture.md): cold, then recent buckets oldest -> newest; age 0 (the current bucket) is never a candidate.

The bitmaps cover the GPU pool's storage (pools.Pool: rows per rank, grown with the slots in use) and keep their
summaries (one flag per 64-slot word: the hierarchical summary) current as they are written, so a candidate search
packs the flags and reads only the words they name, and rotation moves only the non-zero words of the row. A set
raises its words' flags; a clear leaves them up (a flagged empty word yields no candidate, so searches are exact)
and counts them, and the flags are recomputed once the cleared slots outnumber the words (amortized O(1) per write,
no pass per search). Member counts per bucket let the search skip empty buckets.

Hits that join the current bucket (`refresh`) are written lazily: the moved slots and their stamps before the move
are kept (`pending`), and `flush` writes them all at once (one clear per tier, one set) before anything reads the
bitmaps or the other buckets' counts (rotation, candidate search, removal, growth, snapshots, checks); the
current bucket's counts (total and per rank, which the rotation rule reads every access) are kept at once. An epoch
moves a slot at most once, so the pending slots (flushed at the latest by the next rotation) are at most one pool's
worth, and the recency update of a batch without misses is a gather, a compare and a count instead of bitmap
writes. Same bitmaps and counts.
"""
from __future__ import annotations

import numpy as np

from .pools import Pool, pack_summary

_FEW_SLOTS = 8  # writes of at most this many slots keep flags and counts in Python ints


class BucketBitmaps:
    def __init__(self, pool: Pool, num_recent: int):
        self.pool, self.num_recent = pool, num_recent
        self.epoch = 0  # the bucket clock: slots touched now get this stamp
        words = pool.free_nz.size
        self.ring_bits = np.zeros((num_recent + 1, words * 8), dtype=np.uint8)
        self.cold_bits = np.zeros(words * 8, dtype=np.uint8)
        self.ring_nz = np.zeros((num_recent + 1, words), dtype=bool)  # summaries: word w of the row is non-zero
        self.cold_nz = np.zeros(words, dtype=bool)
        # Members per bucket (ring rows, then cold): lets the candidate search skip empty buckets without a scan.
        self.count = np.zeros(num_recent + 2, dtype=np.int64)
        self.cleared = np.zeros(num_recent + 2, dtype=np.int64)  # slots cleared since the flags were recomputed
        # Members of the current bucket per rank, kept as it is written (the rotation rule reads them every access:
        # a popcount of the row each time cost more than the access's own bucket writes).
        self.current_per_rank = np.zeros(pool.R, dtype=np.int64)
        self.pending: list = []  # (slots, their stamps before) moved into the current bucket, not yet written
        self.num_pending = 0  # slots in `pending`
        self._be = None  # the backend of the pending moves' writes
        pool.listeners.append(self._grow)

    def flush(self) -> None:
        """Write the pending moves (module docstring): the slots leave the buckets their stamps before the move put
        them in (as `remove`; none is the current bucket) and their bits join the current bucket's (counted
        already)."""
        if not self.pending:
            return
        if len(self.pending) == 1:
            slots, old = self.pending[0]
        else:
            slots, old = (np.concatenate(x) for x in zip(*self.pending))
        self.pending, self.num_pending, be = [], 0, self._be
        ages = np.subtract(self.epoch, old, dtype=np.int64)
        np.clip(ages, 0, self.num_recent + 1, out=ages)
        self._remove_ages(be, slots, ages)
        i = self.current
        cur, nz = self.ring_bits[i], self.ring_nz[i]
        bitmap = be.to_numpy(be.bitmap_set(be.asarray(cur), be.asarray(slots)))
        if bitmap is not cur:
            self.ring_bits[i] = bitmap
        nz[slots >> 6] = True

    def _grow(self, old: int) -> None:
        self.flush()  # (storage positions change)
        rows = self.pool.rows
        self.ring_bits = rows.relayout_stacked(self.ring_bits, old, 0, 1 / 8)
        self.ring_nz = rows.relayout_stacked(self.ring_nz, old, False, 1 / 64)
        self.cold_bits = rows.relayout(self.cold_bits, old, 0, 1 / 8)
        self.cold_nz = rows.relayout(self.cold_nz, old, False, 1 / 64)

    def row(self, stamp: int) -> int:
        return stamp % (self.num_recent + 1)

    @property
    def current(self) -> int:
        """Ring row of the current bucket."""
        return self.row(self.epoch)

    def rank_counts(self, row: int) -> np.ndarray:
        """Members of ring row `row` per rank (a popcount of the row's storage, R rows of cap slots; the current
        row's are kept in `current_per_rank`)."""
        self.flush()
        words = self.ring_bits[row].view("<u8").reshape(self.pool.R, -1)
        return np.bitwise_count(words).sum(axis=1, dtype=np.int64)

    def rotate(self) -> None:
        """Open the next epoch: the oldest recent bucket joins the cold one and its row becomes the current bucket."""
        self.flush()
        self.epoch += 1
        i = self.row(self.epoch)
        if self.count[i]:
            w = np.flatnonzero(self.ring_nz[i])  # only the row's non-zero words
            cold, ring = self.cold_bits.view("<u8"), self.ring_bits[i].view("<u8")
            cold[w] |= ring[w]
            ring[w] = 0
            self.cold_nz[w] = True
            self.ring_nz[i, w] = False
            self.cleared[i] = 0
            self.count[-1] += self.count[i]
            self.count[i] = 0
        self.current_per_rank[:] = 0  # the row now current was emptied (or was empty)

    def _bits(self, kind: str, row: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.cold_bits, self.cold_nz) if kind == "cold" else (self.ring_bits[row], self.ring_nz[row])

    def _store(self, kind: str, row: int, bitmap: np.ndarray, slots: np.ndarray, delta: int) -> None:
        """Install the bitmap after a write of `slots` (delta > 0: set; None: written in place), keep its summary
        flags, count members (a few slots, e.g. a decode token's, in Python ints: no array passes)."""
        if bitmap is None:  # written in place (numpy): copying a row onto itself cost a pass over the row
            pass
        elif kind == "cold":
            self.cold_bits = bitmap
        else:
            self.ring_bits[row] = bitmap
        if delta > 0:
            nz = self._bits(kind, row)[1]
            if slots.size > _FEW_SLOTS:
                nz[slots >> 6] = True
            else:
                for s in slots.tolist():
                    nz[s >> 6] = True
        self._account(kind, row, slots, delta)

    def _account(self, kind: str, row: int, slots, delta: int) -> None:
        """Counts after `delta` members were set (> 0) or cleared (< 0) in a bucket: its members; its clears since
        its flags were recomputed (recomputed, O(words), once they outnumber the words); and, for the current
        bucket, its members per rank (from `slots`, read only then)."""
        i = -1 if kind == "cold" else row
        if delta < 0:
            self.cleared[i] -= delta
            nz = self._bits(kind, row)[1]
            if self.cleared[i] > nz.size:
                nz[:] = self._bits(kind, row)[0].view("<u8") != 0
                self.cleared[i] = 0
        self.count[i] += delta
        if kind == "ring" and row == self.current:
            per_rank, sign = self.current_per_rank, 1 if delta > 0 else -1
            if per_rank.size == 1:
                per_rank[0] += delta
            elif slots.size <= _FEW_SLOTS:
                cap = max(self.pool.cap, 1)
                for s in slots.tolist():
                    per_rank[s // cap] += sign
            else:
                per_rank += sign * np.bincount(self.pool.rank_of_idx(slots), minlength=per_rank.size)

    def _write(self, be, age: int, slots: np.ndarray, value: bool) -> None:
        op = be.bitmap_set if value else be.bitmap_clear
        kind, row = ("cold", -1) if age > self.num_recent else ("ring", self.row(self.epoch - age))
        cur = self._bits(kind, row)[0]
        bitmap = be.to_numpy(op(be.asarray(cur), be.asarray(slots)))
        self._store(kind, row, None if bitmap is cur else bitmap, slots, slots.size if value else -slots.size)

    def remove(self, be, slots: np.ndarray, stamps: np.ndarray) -> None:
        """Take occupied slots (storage positions) out of whatever bucket their stamps put them in."""
        if slots.size == 0:
            return
        self.flush()
        ages = be.to_numpy(be.bucket_of(be.asarray(stamps), be.asarray(slots), self.epoch, self.num_recent))
        self._remove_ages(be, slots, ages)

    def _remove_ages(self, be, slots: np.ndarray, ages: np.ndarray) -> None:
        """`remove` of slots whose ages (epoch - stamp, clipped to 0 .. K + 1) are known."""
        per_age = np.bincount(ages, minlength=self.num_recent + 2)
        present = np.flatnonzero(per_age)
        if present.size == 1:
            return self._write(be, int(present[0]), slots, False)
        if getattr(be, "scalar_updates", False) and self.ring_bits.flags.c_contiguous:
            return self._clear_across(be, slots, ages, present.tolist(), per_age.tolist())
        for age in present.tolist():  # loop over buckets (at most K + 2)
            self._write(be, age, slots.take(np.flatnonzero(ages == age)), False)

    def _clear_across(self, be, slots: np.ndarray, ages: np.ndarray, present: list, per_age: list) -> None:
        """`remove` of slots in several buckets (numpy, bitmaps written in place): the ring rows are one array, so
        the slots in recent buckets are cleared by one write over it (bit row * row bits + slot), the cold ones by
        one more; then each bucket's flags and counts are kept as `_store` keeps them. One bitmap write per tier
        instead of one per bucket, and no per-bucket selection of its slots (but the current bucket's, whose
        per-rank counts need them)."""
        K = self.num_recent
        ring = ages <= K
        if present[-1] > K:  # some slots are cold
            cold = np.flatnonzero(~ring)
            be.bitmap_clear(self.cold_bits, slots.take(cold))
            ring_idx = np.flatnonzero(ring)
            r_slots, r_ages = slots.take(ring_idx), ages.take(ring_idx)
        else:
            r_slots, r_ages = slots, ages
        if r_slots.size:
            rows = (self.epoch - r_ages) % (K + 1)
            be.bitmap_clear(self.ring_bits.reshape(-1), rows * (self.ring_bits.shape[1] * 8) + r_slots)
        for age in present:  # loop over buckets (at most K + 2): counts only
            kind, row = ("cold", -1) if age > K else ("ring", self.row(self.epoch - age))
            self._account(kind, row, slots.take(np.flatnonzero(ages == 0)) if age == 0 else None, -per_age[age])

    def refresh(self, be, slots: np.ndarray, stamps: np.ndarray) -> np.ndarray:
        """Move occupied slots (an access's hits) into the current bucket; those whose stamp is the current epoch are
        in it already and are left alone (most hits, while an epoch lasts). Returns the slots moved (their bucket
        writes pending until `flush`; their stamps are the caller's to set)."""
        if slots.size == 0:
            return slots
        st = stamps.take(slots)
        idx = (st != self.epoch).nonzero()[0]
        moved = slots.take(idx)
        n = idx.size
        if n:
            self.pending.append((moved, st.take(idx)))
            self.num_pending += n
            self._be = be
            self.count[self.current] += n  # the current bucket's counts now, its bits at `flush`
            per_rank = self.current_per_rank
            if per_rank.size == 1:
                per_rank[0] += n
            elif n <= _FEW_SLOTS:
                cap = max(self.pool.cap, 1)
                for s in moved.tolist():
                    per_rank[s // cap] += 1
            else:
                per_rank += np.bincount(self.pool.rank_of_idx(moved), minlength=per_rank.size)
        return moved

    def add(self, be, slots: np.ndarray) -> None:
        """Put slots (not in any bucket) into the current bucket (their stamps are set to `epoch`)."""
        if slots.size:
            self._write(be, 0, slots, True)

    def add_one(self, s: int) -> None:
        """`add` of one slot (storage position s, an int): its bit, flag and counts set in place on ints."""
        i = self.current
        self.ring_bits[i, s >> 3] |= 1 << (s & 7)
        self.ring_nz[i, s >> 6] = True
        self.count[i] += 1
        per_rank = self.current_per_rank
        per_rank[0 if per_rank.size == 1 else s // max(self.pool.cap, 1)] += 1

    def eviction_order(self) -> list[tuple[str, int]]:
        """(kind, row) of the candidate bitmaps in eviction order: cold, then ages K .. 1 (pending moves written:
        `size` and `take` read them)."""
        self.flush()
        return [("cold", -1)] + [("ring", self.row(self.epoch - age)) for age in range(self.num_recent, 0, -1)]

    def size(self, kind: str, row: int) -> int:
        return int(self.count[-1] if kind == "cold" else self.count[row])

    def take(self, be, kind: str, row: int, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Claim per rank the min(counts[r], members) lowest member slots of the bucket (summary-guided search)."""
        self.flush()
        bitmap, nz = self._bits(kind, row)
        bm = be.asarray(bitmap)
        slots, found = be.select_first(bm, be.asarray(pack_summary(nz)), max(self.pool.cap, 64), be.asarray(counts))
        slots, found = be.to_numpy(slots), be.to_numpy(found)
        if slots.size:
            out = be.to_numpy(be.bitmap_clear(bm, be.asarray(slots)))
            self._store(kind, row, None if out is bitmap else out, slots, -slots.size)
        return slots, found

    @property
    def ring(self) -> np.ndarray:
        """Ring rows over the full GPU place layout (R * seg slots), dense copies (UlaCache.device_state)."""
        self.flush()
        return np.stack([self.pool.dense(r, 0, 1 / 8) for r in self.ring_bits])

    @property
    def cold(self) -> np.ndarray:
        """Cold bitmap over the full GPU place layout, a dense copy (UlaCache.device_state)."""
        self.flush()
        return self.pool.dense(self.cold_bits, 0, 1 / 8)


__all__ = ["BucketBitmaps"]
