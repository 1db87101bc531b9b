"""PB-LRU (DESIGN §3): bucketed LRU over the shared GPU pool with membership bitmaps and summary-guided search.

Replacement order per rank: free slots, the cold bucket, then recent buckets oldest -> newest, lowest slot first
inside each bitmap. Hits (and the slots the misses take) join the current bucket, which is never a candidate.
The buckets are updated in place when the plan is made (the facade commits every plan it hands out).
"""
from __future__ import annotations

import numpy as np

from ..bitmaps import BucketBitmaps
from ..errors import require
from .exclusive import ExclusivePolicy


class PbLruPolicy(ExclusivePolicy):
    name = "pb-lru"

    def __init__(self, cfg, be):
        super().__init__(cfg, be)
        self.buckets = BucketBitmaps(self.gpu, cfg.num_recent_buckets)
        self._rotate(1)

    def _select(self, hit_gidx, m_counts, now):
        be, buckets = self.be, self.buckets
        buckets.remove(be, hit_gidx, self.gpu.stamp, now)  # recency update: hits move to the current bucket
        buckets.add(be, hit_gidx, now, now)
        parts, founds = [], []
        remaining = m_counts
        if remaining.any():
            slots, found = self.gpu.take_free(be, remaining)
            parts.append(slots)
            founds.append(found)
            remaining = remaining - found
        for kind, row in buckets.eviction_order(now):
            if not remaining.any():
                break
            if buckets.size(kind, row) == 0:
                continue
            slots, found = buckets.take(be, kind, row, remaining)
            if slots.size:
                parts.append(slots)
                founds.append(found)
            remaining = remaining - found
        require(not remaining.any(), "capacity was checked before selection")
        dests = self._by_rank(parts, founds)
        buckets.add(be, dests, now, now)
        return dests

    def _on_alloc(self, gidx):
        self.buckets.add(self.be, gidx, self.step, self.step + 1)

    def _on_release(self, gidx):
        self.buckets.remove(self.be, gidx, self.gpu.stamp, self.step + 1)

    def _rotate(self, now):
        self.buckets.rotate(now)

    def _check_policy(self, alloc, places, on_gpu):
        """Each occupied GPU slot sits in exactly the bucket its stamp says; free slots in none; summaries current."""
        gpu, b, K, now = self.gpu, self.buckets, self.buckets.num_recent, self.step + 1
        n = gpu.own.size
        member = np.zeros(n, dtype=np.int64)
        expect = np.full(n, -1, dtype=np.int64)
        occ = np.flatnonzero(gpu.own >= 0)
        age = np.clip(now - gpu.stamp[occ], 0, K + 1)
        require((age >= 1).all(), "a slot is in the current bucket between accesses")
        expect[occ] = np.where(age > K, -2, (now - age) % (K + 1))
        for row in range(K + 1):
            bits = np.unpackbits(b.ring_bits[row], bitorder="little").astype(np.int64)
            member += bits
            require((expect[bits.astype(bool)] == row).all(), f"bucket row {row} holds a slot of another bucket")
            require(not ((b.ring_bits[row].view("<u8") != 0) & ~b.ring_nz[row]).any(), f"bucket row {row} summary")
        cold = np.unpackbits(b.cold_bits, bitorder="little").astype(np.int64)
        member += cold
        require((expect[cold.astype(bool)] == -2).all(), "cold bucket holds a recent or free slot")
        require(not ((b.cold_bits.view("<u8") != 0) & ~b.cold_nz).any(), "cold bucket summary misses a word")
        require((member[occ] == 1).all(), "an occupied slot is in no bucket or in two")
        sizes = [int(np.unpackbits(r).sum()) for r in b.ring_bits] + [int(cold.sum())]
        require(sizes == b.count.tolist(), "bucket member counts drifted")
        require((member.sum() == occ.size), "a free slot is in a bucket")


__all__ = ["PbLruPolicy"]
