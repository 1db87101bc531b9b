"""Physical pools: per-rank GPU pools (free bitmap, owners, recency stamps) and per-rank CPU pools (free lists)."""
from __future__ import annotations

import numpy as np

from .address_space import IdStack


def pad64(n: int) -> int:
    return -(-n // 64) * 64


class GpuPools:
    """All ranks' GPU pools as one array of places; rank r owns [r * seg, r * seg + slots) (seg = slots padded to 64).

    `owner[p]` is the address held by place p (-1 free or padding); `stamps[p]` the step of its last touch;
    `free_bm` the free-slot bitmap (padding bits are never set)."""

    def __init__(self, num_ranks: int, slots: int):
        self.num_ranks, self.slots, self.seg = num_ranks, slots, pad64(slots)
        self.num_places = num_ranks * self.seg
        self.owner = np.full(self.num_places, -1, dtype=np.int64)
        self.stamps = np.zeros(self.num_places, dtype=np.int64)
        valid = np.zeros(self.num_places, dtype=bool)
        for r in range(num_ranks):
            valid[r * self.seg:r * self.seg + slots] = True
        self.valid = valid
        self.free_bm = np.packbits(valid, bitorder="little")
        self.num_free = np.full(num_ranks, slots, dtype=np.int64)

    def rank_of(self, places: np.ndarray) -> np.ndarray:
        return places // self.seg


class CpuPools:
    """All ranks' CPU pools; rank r's slot c is place base + r * slots + c; free lists per rank."""

    def __init__(self, num_ranks: int, slots: int, base: int):
        self.num_ranks, self.slots, self.base = num_ranks, slots, base
        self.num_places = num_ranks * slots
        self.free = [IdStack(base + r * slots, base + (r + 1) * slots) for r in range(num_ranks)]

    def num_free(self) -> np.ndarray:
        return np.array([len(f) for f in self.free], dtype=np.int64)

    def rank_of(self, places: np.ndarray) -> np.ndarray:
        return (places - self.base) // max(self.slots, 1)

    def release(self, places: np.ndarray) -> None:
        ranks = self.rank_of(places)
        for r in np.unique(ranks).tolist():  # loop over ranks
            self.free[r].push(places[ranks == r])


__all__ = ["CpuPools", "GpuPools", "pad64"]
