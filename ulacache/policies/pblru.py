"""PB-LRU (docs/architecture.md): bucketed LRU over the shared GPU pool with membership bitmaps and summary-guided search.

Replacement order per rank: free slots, the cold bucket, then recent buckets oldest -> newest, lowest slot first
inside each bitmap. Hits, the slots the misses take and newly allocated slots join the current bucket, which is
never a candidate. The buckets are updated in place when the plan is made (the facade commits every plan it hands out).

Buckets age by volume, not by call: an epoch (the current bucket's lifetime) ends before an access once the slots
inserted into the GPU pool during it (misses placed + tokens allocated on the GPU) reach a (K + 1)-th of the GPU
slots of all ranks. An entry nobody touches is evicted by exact LRU after about one pool's worth of insertions, so the
K + 1 ring buckets span that eviction age whatever the pool, batch and miss rate, and the eviction frontier falls
in the oldest recent buckets, ordered by age to a (K + 1)-th of the turnover. (Rotating per access made the ring
span K accesses: a pool that turns over in more accesses than that sat mostly in the cold bucket, where eviction
goes by slot index, not age.) An epoch also ends before an access that might otherwise have to take a replacement
slot from the current bucket (on some rank, current members + this batch's hits and misses exceed its slots), so
only what this access uses is protected. Stamps are epochs.
"""
from __future__ import annotations

import numpy as np

from ..bitmaps import BucketBitmaps
from ..errors import require
from .exclusive import NO_INDICES, ExclusivePolicy


def epoch_volume(num_ranks: int, gpu_slots: int, num_recent: int) -> int:
    """GPU insertions that end an epoch: a (K + 1)-th of the GPU slots of all ranks, rounded up."""
    return -(-num_ranks * gpu_slots // (num_recent + 1))


class PbLruPolicy(ExclusivePolicy):
    name = "pb-lru"
    stamp_dtype = np.int16  # stamps are epochs: few (82 in the pinned DP replay); widened as the clock passes

    def __init__(self, cfg, be):
        super().__init__(cfg, be)
        self.buckets = BucketBitmaps(self.gpu, cfg.num_recent_buckets)
        self.epoch_volume = epoch_volume(cfg.num_ranks, cfg.gpu_slots, cfg.num_recent_buckets)
        self.inserted = 0  # slots inserted into the GPU pool during the current epoch
        self.moved_hits = np.zeros(0, dtype=np.int64)  # the last access's hits that changed bucket (`_select`)

    def _clock(self, step):
        return self.buckets.epoch

    def _ends_epoch(self, addrs) -> bool:
        """The rotation rule (module docstring), evaluated before the access's recency update (addrs: the batch's
        distinct addresses, ascending)."""
        b, slots = self.buckets, self.cfg.gpu_slots
        if self.inserted >= self.epoch_volume:
            return True
        cur = b.current_per_rank.tolist()
        if max(cur) + addrs.size <= slots:  # no rank can run short (sufficient test: hits + misses)
            return False
        # Each address is a hit or a miss in its home rank's GPU pool, and homes are ascending address ranges: a
        # rank's hits + misses are its addresses, counted by cutting the batch at the homes' first addresses (as the
        # facade cut it when it located the batch).
        cuts = self.space.home_bounds(addrs)
        return any(c + hi - lo > slots for c, lo, hi in zip(cur, cuts, cuts[1:]))

    def _select(self, hit_gidx, m_counts, n_miss, now, addrs):
        be, buckets = self.be, self.buckets
        if self._ends_epoch(addrs):
            buckets.rotate()
            self.gpu.fit_stamp(buckets.epoch)  # before bucket_of compares the clock with the stamps
            self.inserted = 0
        self.inserted += n_miss
        self.moved_hits = buckets.refresh(be, hit_gidx, self.gpu.stamp)  # recency update: hits join the current bucket
        if not n_miss:  # a warm batch: no replacement slots
            return NO_INDICES
        slots, found = self.gpu.take_free(be, m_counts)
        parts, founds = [slots], [found]
        left = n_miss - slots.size  # slots still to find (counted as an int: no reductions per bucket)
        if left:
            remaining = m_counts - found
            for kind, row in buckets.eviction_order():
                if buckets.size(kind, row) == 0:
                    continue
                slots, found = buckets.take(be, kind, row, remaining)
                if slots.size:
                    parts.append(slots)
                    founds.append(found)
                    remaining = remaining - found
                    left -= slots.size
                    if not left:
                        break
            require(not left, "capacity was checked before selection")
        dests = self._by_rank(parts, founds)
        buckets.add(be, dests)
        return dests

    def _touched_hits(self, hit_gidx):
        """Only the hits `_select` moved get a new stamp: the others carry the current epoch already."""
        return self.moved_hits

    def _on_alloc(self, gidx):
        self.buckets.add(self.be, gidx)
        self.inserted += int(gidx.size)

    def _on_alloc_one(self, g):
        """`_on_alloc` of one slot, on ints: its stamp is the epoch, and it joins the current bucket."""
        self.gpu.touch_one(g, self.buckets.epoch)
        self.buckets.add_one(g)
        self.inserted += 1

    def _on_release(self, gidx):
        self.buckets.remove(self.be, gidx, self.gpu.stamp)

    def _check_policy(self, alloc, places, on_gpu):
        """Each occupied GPU slot sits in exactly the bucket its stamp (epoch) says; free slots in none; summaries
        current; no stamp ahead of the clock."""
        gpu, b, K, epoch = self.gpu, self.buckets, self.buckets.num_recent, self.buckets.epoch
        b.flush()
        n = gpu.own.size
        member = np.zeros(n, dtype=np.int64)
        expect = np.full(n, -1, dtype=np.int64)
        occ = np.flatnonzero(gpu.own >= 0)
        age = epoch - gpu.stamp[occ]
        require((age >= 0).all(), "a slot's stamp is ahead of the bucket clock")
        expect[occ] = np.where(age > K, -2, gpu.stamp[occ] % (K + 1))
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
        require((b.rank_counts(b.current) == b.current_per_rank).all(), "current bucket's per-rank counts drifted")
        require((member.sum() == occ.size), "a free slot is in a bucket")


__all__ = ["PbLruPolicy", "epoch_volume"]
