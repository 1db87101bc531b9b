"""Exact LRU over the shared GPU pool (the ablation baseline): step-counter timestamps, ties by lowest slot.

Replacement order per rank: free slots (lowest first), then occupied slots not touched by this batch by
(last-touch step, slot) ascending.
"""
from __future__ import annotations

from ..errors import require
from .exclusive import ExclusivePolicy


class LruPolicy(ExclusivePolicy):
    name = "lru"

    def _select(self, hit_places, m_counts, now):
        be, gpu = self.be, self.gpu
        bm = be.asarray(gpu.free_bm.copy())
        s0, f0 = be.select_first(bm, be.summary(bm), gpu.seg, be.asarray(m_counts))
        s0, f0 = be.to_numpy(s0), be.to_numpy(f0)
        free_bm = be.to_numpy(be.bitmap_clear(bm, be.asarray(s0)))
        parts = [s0]
        remaining = m_counts - f0
        if remaining.any():
            eligible = gpu.owner >= 0
            eligible[hit_places] = False  # the current batch's hits are protected
            s1, f1 = be.lru_select(be.asarray(gpu.stamps), be.asarray(eligible), gpu.seg, be.asarray(remaining))
            parts.append(be.to_numpy(s1))
            require((be.to_numpy(f1) == remaining).all(), "capacity was checked before selection")
        return self._by_rank(parts), free_bm

    def _apply(self, selection) -> None:
        self.gpu.free_bm = selection


__all__ = ["LruPolicy"]
