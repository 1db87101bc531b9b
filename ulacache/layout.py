"""The public, typed view of a cache's physical side for executors outside the library (GPU twins, validators).

- `PlaceLayout` (`UlaCache.layout()`): how a unified place (one int64 over every tier) maps to (tier, rank, slot).
- `Exchanges` (`Plan.exchanges`): a plan's transfers as typed arrays of unified places.
- `DeviceState` (`UlaCache.device_state()`): a read-only dense snapshot of what a device twin of pb-lru/lru mirrors.
Executors read these instead of the library's private state (see backends/README.md, "Executor API").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np


@dataclass(frozen=True)
class PlaceLayout:
    """Unified places: GPU [0, cpu_base) with rank r's slot s at r * gpu_seg + s; CPU [cpu_base, buffer_base) with
    rank r's slot c at cpu_base + r * cpu_slots + c; TP local buffers [buffer_base, num_places) with rank r's slot b
    at buffer_base + r * buffer_seg + b. Segments are padded to 64 slots (bitmap words); padding places are never
    used. `num_ranks` counts the ranks the cache tracks (hisparse in TP tracks one replica)."""

    GPU: ClassVar[int] = 0
    CPU: ClassVar[int] = 1
    BUFFER: ClassVar[int] = 2

    num_ranks: int
    gpu_slots: int
    gpu_seg: int
    cpu_slots: int
    buffer_slots: int = 0
    buffer_seg: int = 0

    @property
    def cpu_base(self) -> int:
        return self.num_ranks * self.gpu_seg

    @property
    def buffer_base(self) -> int:
        return self.cpu_base + self.num_ranks * self.cpu_slots

    @property
    def num_places(self) -> int:
        return self.buffer_base + self.num_ranks * self.buffer_seg

    def decode(self, places) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tier int8, rank int64, slot int64) of each place, vectorized; (-1, -1, -1) where a place is < 0."""
        shape = np.shape(places)
        p = np.asarray(places, dtype=np.int64).reshape(-1)
        bases = (0, self.cpu_base, self.buffer_base)  # per tier: its first place and its slots per rank
        segs = (self.gpu_seg, max(self.cpu_slots, 1), max(self.buffer_seg, 1))
        if p.size:  # every place in one tier (a prompt placed on the CPU, a warm batch): scalar base and divisor
            lo, hi = int(p.min()), int(p.max())
            t = int(lo >= self.cpu_base) + int(lo >= self.buffer_base)
            if lo >= 0 and t == int(hi >= self.cpu_base) + int(hi >= self.buffer_base):
                d, seg = (p - bases[t]) if bases[t] else p, segs[t]
                rank = d // seg
                slot = rank * seg
                np.subtract(d, slot, out=slot)  # (in place: one temporary less on a prompt's places)
                return np.full(shape, t, dtype=np.int8), rank.reshape(shape), slot.reshape(shape)
        tier = (p >= self.cpu_base).view(np.int8) + (p >= self.buffer_base).view(np.int8)
        base = np.array(bases, dtype=np.int64).take(tier)
        seg = np.array(segs, dtype=np.int64).take(tier)
        rank, slot = np.divmod(p - base, seg)
        none = p < 0
        if none.any():
            tier[none] = rank[none] = slot[none] = -1
        return tier.reshape(shape), rank.reshape(shape), slot.reshape(shape)

    def encode(self, tier, rank, slot) -> np.ndarray:
        """Unified place of each (tier, rank, slot); ValueError for a tier, rank or slot out of range."""
        t, r, s = (np.asarray(x, dtype=np.int64) for x in (tier, rank, slot))
        if ((t < 0) | (t > 2)).any() or ((r < 0) | (r >= self.num_ranks)).any():
            raise ValueError("tier must be 0, 1 or 2 and rank in [0, num_ranks)")
        limit = np.choose(t, [self.gpu_slots, self.cpu_slots, self.buffer_slots])
        if ((s < 0) | (s >= limit)).any():
            raise ValueError("slot out of range for its tier")
        base = np.choose(t, [0, self.cpu_base, self.buffer_base])
        seg = np.choose(t, [self.gpu_seg, self.cpu_slots, self.buffer_seg])
        return base + r * seg + s


def _ro(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class Exchanges:
    """One plan's transfers, unified places (see PlaceLayout). Arrays are read-only.

    Tier exchange (`swap` True for pb-lru/lru): miss_addrs[i] moves miss_src[i] (CPU) -> miss_dst[i] (GPU, same home
    rank); if victims[i] >= 0 that entry moves miss_dst[i] -> miss_src[i] (the slot the miss vacated). hisparse
    (`swap` False): the CPU entry is copied into the request's device buffer; the victim copy is dropped.
    hit_places: GPU places of this batch's hits (pb-lru/lru; their recency is touched).
    TP local buffers: peer_addrs[i] is copied into rank peer_rank[i]'s buffer place peer_dst[i]; peer_src is its
    place before the plan (all reads first), peer_src_after its GPU place after the tier exchange (what a GPU
    executor gathers from once the exchange has run). Grouped by receiving rank, ascending address within a rank."""

    swap: bool
    miss_addrs: np.ndarray
    miss_src: np.ndarray
    miss_dst: np.ndarray
    victims: np.ndarray
    hit_places: np.ndarray
    peer_addrs: np.ndarray
    peer_rank: np.ndarray
    peer_src: np.ndarray
    peer_src_after: np.ndarray
    peer_dst: np.ndarray

    @classmethod
    def of(cls, swap, miss_addrs, miss_src, miss_dst, victims, hit_places, peer=None) -> Exchanges:
        """Build from the policy's lists; peer = (addrs, rank, src, dst) of the TP buffer fetches or None."""
        z = np.zeros(0, dtype=np.int64)
        pa, pr, ps, pd = peer if peer is not None else (z, z, z, z)
        after = ps
        if pa.size and swap and miss_addrs.size:  # miss_addrs ascending (grouped by home rank = by address)
            pos = np.minimum(np.searchsorted(miss_addrs, pa), miss_addrs.size - 1)
            promoted = miss_addrs[pos] == pa
            after = np.where(promoted, miss_dst[pos], ps)
        arrays = [miss_addrs, miss_src, miss_dst, victims, hit_places, pa, pr, ps, after, pd]
        return cls(bool(swap), *(_ro(np.asarray(a, dtype=np.int64)) for a in arrays))


def plan_exchanges(policy, buffers, plan) -> Exchanges:
    """A plan's `Exchanges` from its policy's and TP local buffers' private state (`Plan.exchanges` calls it, bound
    to the cache's policy and buffers by functools.partial: picklable, and no plan -> plan reference cycle)."""
    ps, bs = plan.policy_state, plan.buffer_state
    if not policy.exclusive:  # hisparse: copies into request buffers, victims' copies dropped
        return Exchanges.of(False, ps.miss_addrs, plan.move_src, ps.miss_slots, ps.victims, np.zeros(0, np.int64))
    peer = None
    if bs is not None:
        n = bs.miss_addrs.size
        peer = (bs.miss_addrs, bs.miss_rank, plan.move_src[plan.move_src.size - n:], buffers.base + bs.dests)
    return Exchanges.of(True, ps.miss_addrs, ps.miss_src, ps.dests, ps.victims, ps.hit_places, peer)


@dataclass(frozen=True)
class DeviceState:
    """Dense, read-only copies of what a device twin of pb-lru/lru mirrors, in the full place layout (so these are
    sized by the budget, unlike the library's own storage: for device mirrors and validation, not the simulator).

    step: committed access batches (the next access has now = step + 1). phys[a]: place of address a (-1 none).
    owner[g], stamps[g]: address held by / last-touch clock of GPU place g (lru: step; pb-lru: bucket epoch; -1 free
    or padding). free_bm: free-slot bitmap over GPU places (backends/README.md bit layout). ring[(K+1), G/8],
    cold[G/8]: pb-lru bucket bitmaps (ring row = stamp % (K + 1)); empty for lru. marker_size: length of the dedup
    marker (addresses + 1). pb-lru's bucket clock: epoch (current), epoch_inserted (GPU insertions during it) and
    epoch_volume (insertions that end it; policies/pblru.py has the rule); 0 for lru."""

    layout: PlaceLayout
    policy: str
    step: int
    num_recent: int
    phys: np.ndarray
    owner: np.ndarray
    stamps: np.ndarray
    free_bm: np.ndarray
    ring: np.ndarray
    cold: np.ndarray
    marker_size: int
    epoch: int = 0
    epoch_inserted: int = 0
    epoch_volume: int = 0


__all__ = ["DeviceState", "Exchanges", "PlaceLayout", "plan_exchanges"]
