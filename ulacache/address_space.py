"""The logical address space: stable int64 addresses, the mapping to physical places, requests' address lists.

Address `a` belongs to home rank `a // slots_per_rank`: in DP that is the request's rank, in TP the rank whose pools
store the entry. A place is one int64 over all tiers: GPU places [0, num_gpu_places) (rank r's GPU slot s is
r * gpu_seg + s), then CPU places (rank r's CPU slot c is num_gpu_places + r * cpu_slots + c), then TP local-buffer
places. `phys[a]` is the entry's current place, -1 when `a` is not allocated.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


class IdStack:
    """Free list of integer ids in [lo, hi): never-used ids come out ascending, freed ids are reused LIFO.

    Memory grows with the ids freed, not with the range (pools of tens of millions of slots stay cheap)."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi, self.fresh = lo, hi, lo
        self._buf = np.zeros(0, dtype=np.int64)
        self._len = 0

    def __len__(self) -> int:
        return self._len + (self.hi - self.fresh)

    def pop(self, n: int) -> np.ndarray:
        if n > len(self):
            raise AssertionError("IdStack.pop beyond capacity (callers check first)")
        k = min(n, self._len)
        reused = self._buf[self._len - k:self._len][::-1].copy()
        self._len -= k
        fresh = np.arange(self.fresh, self.fresh + (n - k), dtype=np.int64)
        self.fresh += n - k
        return np.concatenate([reused, fresh]) if k else fresh

    def push(self, ids: np.ndarray) -> None:
        need = self._len + ids.size
        if need > self._buf.size:
            grown = np.zeros(max(need, 2 * self._buf.size, 1024), dtype=np.int64)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len:need] = ids[::-1]
        self._len = need


@dataclass
class Request:
    """One request's addresses (chunks appended per allocation) and its rank."""

    index: int
    rank: int
    chunks: list = field(default_factory=list)
    num_tokens: int = 0

    def addresses(self) -> np.ndarray:
        if len(self.chunks) > 1:
            self.chunks = [np.concatenate(self.chunks)]
        return self.chunks[0] if self.chunks else np.zeros(0, dtype=np.int64)


class AddressSpace:
    """Logical ids per home rank, the address -> place table and the address -> request table."""

    def __init__(self, num_ranks: int, slots_per_rank: int, num_places: int):
        self.num_ranks = num_ranks
        self.slots_per_rank = slots_per_rank
        self.size = num_ranks * slots_per_rank
        # int32 places when they fit: the translate gather is memory-bound (measured 7 ms vs 11.5 ms for 1.9M).
        place_dtype = np.int32 if num_places < 2**31 - 1 else np.int64
        self.phys = np.full(self.size, -1, dtype=place_dtype)
        self.req_of = np.full(self.size, -1, dtype=np.int32)
        self.marker = np.zeros(self.size + 1, dtype=bool)  # dedup scratch (+1: where -1 padding lands)
        self.ids = [IdStack(r * slots_per_rank, (r + 1) * slots_per_rank) for r in range(num_ranks)]
        self.requests: dict[int, Request] = {}
        self._next_index = 0
        self.num_allocated = 0

    def home(self, addrs: np.ndarray) -> np.ndarray:
        return addrs // self.slots_per_rank

    def free_ids(self, rank: int) -> int:
        return len(self.ids[rank])

    def request(self, request_id: int, rank: int) -> Request:
        """The request's record, created on first use (not yet registered: call `register`)."""
        req = self.requests.get(request_id)
        if req is None:  # a fresh index each time (an allocation that fails only skips an index)
            req = Request(index=self._next_index, rank=rank)
            self._next_index += 1
        return req

    def register(self, request_id: int, req: Request, addrs: np.ndarray) -> None:
        if request_id not in self.requests:
            self.requests[request_id] = req
        req.chunks.append(addrs)
        req.num_tokens += addrs.size
        self.req_of[addrs] = req.index
        self.num_allocated += addrs.size

    def release(self, request_id: int) -> np.ndarray:
        """Forget the request; return its addresses (their ids go back to the free lists, phys to -1)."""
        req = self.requests.pop(request_id)
        addrs = req.addresses()
        self.phys[addrs] = -1
        self.req_of[addrs] = -1
        homes = self.home(addrs)
        for r in np.unique(homes).tolist():  # loop over ranks
            self.ids[r].push(addrs[homes == r])
        self.num_allocated -= addrs.size
        return addrs


def water_fill(free: np.ndarray, n: int) -> np.ndarray:
    """Split n items over bins with `free` room so that the room left is as even as possible (ties: lower bin).

    Returns int64 counts, each <= free, summing to n (callers ensure n <= free.sum())."""
    free = np.asarray(free, dtype=np.int64)
    if n <= 0:
        return np.zeros_like(free)
    lo, hi = 0, int(free.max())  # smallest level L with sum(max(free - L, 0)) <= n
    while lo < hi:
        mid = (lo + hi) // 2
        if int(np.maximum(free - mid, 0).sum()) <= n:
            hi = mid
        else:
            lo = mid + 1
    take = np.maximum(free - lo, 0)
    rest = n - int(take.sum())
    if rest:
        extra = np.flatnonzero(free >= lo)[:rest]  # the bins whose room left is the highest (lo)
        take[extra] += 1
    return take


__all__ = ["AddressSpace", "IdStack", "Request", "water_fill"]
