"""PB-LRU (DESIGN §3): bucketed LRU over the shared GPU pool with membership bitmaps and summary-guided search.

Replacement order per rank: free slots, the cold bucket, then recent buckets oldest -> newest, lowest slot first
inside each bitmap. Hits (and the slots the misses take) join the current bucket, which is never a candidate.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bitmaps import BucketBitmaps
from ..errors import require
from .exclusive import ExclusivePolicy


@dataclass
class _Selection:
    free_bm: np.ndarray
    buckets: BucketBitmaps


class PbLruPolicy(ExclusivePolicy):
    name = "pb-lru"

    def __init__(self, cfg, be):
        super().__init__(cfg, be)
        self.buckets = BucketBitmaps(self.gpu.num_places, cfg.num_recent_buckets)
        self._rotate(1)

    def _select(self, hit_places, m_counts, now):
        be, gpu = self.be, self.gpu
        buckets = self.buckets.copy()
        free_bm = gpu.free_bm.copy()
        buckets.remove(be, hit_places, gpu.stamps, now)  # recency update: hits move to the current bucket
        buckets.add(be, hit_places, now, now)
        remaining = m_counts.copy()
        parts = []
        sources = [("free", -1)] + buckets.eviction_order(now)
        for kind, row in sources:
            if not remaining.any():
                break
            if kind != "free" and buckets.size(kind, row) == 0:
                continue
            bitmap = free_bm if kind == "free" else buckets.get(kind, row)
            bm = be.asarray(bitmap)
            slots, found = be.select_first(bm, be.summary(bm), gpu.seg, be.asarray(remaining))
            slots, found = be.to_numpy(slots), be.to_numpy(found)
            if slots.size:
                bitmap = be.to_numpy(be.bitmap_clear(bm, be.asarray(slots)))
                if kind == "free":
                    free_bm = bitmap
                else:
                    buckets.put(kind, row, bitmap, slots.size)
                parts.append(slots)
            remaining = remaining - found
        require(not remaining.any(), "capacity was checked before selection")
        dests = self._by_rank(parts)
        buckets.add(be, dests, now, now)
        return dests, _Selection(free_bm, buckets)

    def _apply(self, selection: _Selection) -> None:
        self.gpu.free_bm = selection.free_bm
        self.buckets = selection.buckets

    def _on_alloc(self, gslots):
        self.buckets.add(self.be, gslots, self.step, self.step + 1)

    def _on_release(self, gslots):
        self.buckets.remove(self.be, gslots, self.gpu.stamps, self.step + 1)

    def _rotate(self, now):
        self.buckets.rotate(now)

    def _check_policy(self, alloc, places, on_gpu):
        """Each occupied GPU slot sits in exactly the bucket its stamp says; free slots in none."""
        gpu, K, now = self.gpu, self.buckets.num_recent, self.step + 1
        member = np.zeros(gpu.num_places, dtype=np.int64)
        expect = np.full(gpu.num_places, -1, dtype=np.int64)
        occ = np.flatnonzero(gpu.owner >= 0)
        age = np.clip(now - gpu.stamps[occ], 0, K + 1)
        require((age >= 1).all(), "a slot is in the current bucket between accesses")
        expect[occ] = np.where(age > K, -2, (now - age) % (K + 1))
        for row in range(K + 1):
            bits = np.unpackbits(self.buckets.ring[row], bitorder="little").astype(np.int64)
            member += bits
            require((expect[bits.astype(bool)] == row).all(), f"bucket row {row} holds a slot of another bucket")
        cold = np.unpackbits(self.buckets.cold, bitorder="little").astype(np.int64)
        member += cold
        require((expect[cold.astype(bool)] == -2).all(), "cold bucket holds a recent or free slot")
        require((member[occ] == 1).all(), "an occupied slot is in no bucket or in two")
        sizes = [int(np.unpackbits(r).sum()) for r in self.buckets.ring] + [int(cold.sum())]
        require(sizes == self.buckets.count.tolist(), "bucket member counts drifted")
        require((member.sum() == occ.size), "a free slot is in a bucket")


__all__ = ["PbLruPolicy"]
