"""Exact LRU over the shared GPU pool (the ablation baseline): step-counter timestamps, ties by lowest slot.

Replacement order per rank: free slots (lowest first), then occupied slots not touched by this batch by
(last-touch step, slot) ascending -- `Pool.select_free_then_lru`, shared with the TP local buffers.
"""
from __future__ import annotations

from ..errors import require
from .exclusive import ExclusivePolicy


class LruPolicy(ExclusivePolicy):
    name = "lru"
    exact_lru = True

    def _select(self, hit_gidx, m_counts, n_miss, now, addrs):
        dests, found = self.gpu.select_free_then_lru(self.be, m_counts, hit_gidx)  # this batch's hits are protected
        require((found == m_counts).all(), "capacity was checked before selection")
        return dests


__all__ = ["LruPolicy"]
