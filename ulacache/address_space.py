"""The logical address space: stable int64 addresses, the mapping to physical places, requests' address lists.

Address `a` belongs to home rank `a // slots_per_rank`: in DP that is the request's rank, in TP the rank whose pools
store the entry. A place is one int64 over all tiers: GPU places [0, num_gpu_places) (rank r's GPU slot s is
r * gpu_seg + s), then CPU places (rank r's CPU slot c is num_gpu_places + r * cpu_slots + c), then TP local-buffer
places (layout.PlaceLayout). `places(a)` is the entry's current place; the table behind it holds rows only for the
addresses handed out, one row per home rank grown on its own (rows.RaggedRows), so its memory follows the
allocated history of each rank, not the budget nor ranks x the fullest rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .rows import IdStack, RaggedRows, id_dtype

_MARKER = [np.zeros(1, dtype=bool)]  # the shared dedup marker (AddressSpace.scratch)


@dataclass
class Request:
    """One request's addresses and its rank. The addresses are kept as runs: consecutive ascending addresses (a
    prompt's fresh ids, a lone decode token) as (first, count), merged with the run before when they continue it;
    any other chunk as a copy at the space's id width. A long history costs a few ints, not 8 bytes a token."""

    index: int
    rank: int
    runs: list = field(default_factory=list)  # (first, count) or an array of addresses, in allocation order
    num_tokens: int = 0

    def append(self, addrs: np.ndarray, dtype) -> None:
        n = addrs.size
        if n == 0:
            return
        first = int(addrs[0])
        if n == 1 or (int(addrs[-1]) - first == n - 1 and bool((np.diff(addrs) == 1).all())):
            last = self.runs[-1] if self.runs else None
            if isinstance(last, tuple) and last[0] + last[1] == first:
                self.runs[-1] = (last[0], last[1] + n)
            else:
                self.runs.append((first, n))
        else:
            self.runs.append(addrs.astype(dtype))
        self.num_tokens += n

    def append_one(self, addr: int) -> None:
        """`append` of one address (a decode token) given as an int: no array."""
        last = self.runs[-1] if self.runs else None
        if isinstance(last, tuple) and last[0] + last[1] == addr:
            self.runs[-1] = (last[0], last[1] + 1)
        else:
            self.runs.append((addr, 1))
        self.num_tokens += 1

    def addresses(self) -> np.ndarray:
        """The request's addresses in allocation order (a fresh int64 array)."""
        parts = [np.arange(r[0], r[0] + r[1], dtype=np.int64) if isinstance(r, tuple) else r.astype(np.int64)
                 for r in self.runs]
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


class AddressSpace:
    """Logical ids per home rank and the address -> place table (requests keep their own address runs).

    The tables hold rows only for the ids handed out (RaggedRows: rank r's addresses in row r, each row grown on
    its own), so a space of billions of addresses costs nothing until it is used. `index(addrs)` gives the storage
    position of addresses; storage order is address order. Listeners get the old layout to re-lay their tables."""

    def __init__(self, num_ranks: int, slots_per_rank: int, num_places: int):
        self.num_ranks = num_ranks
        self.slots_per_rank = slots_per_rank
        self.size = num_ranks * slots_per_rank
        # int32 places when they fit: the translate gather is memory-bound (measured 7 ms vs 11.5 ms for 1.9M).
        self.place_dtype = np.int32 if num_places < 2**31 - 1 else np.int64
        self.id_dtype = id_dtype(self.size)  # addresses kept in requests' lists
        self.rows = RaggedRows(num_ranks, slots_per_rank, slots_per_rank)
        self.table = np.zeros(0, dtype=self.place_dtype)  # place of each address in storage, -1 unallocated
        self.ids = [IdStack(r * slots_per_rank, (r + 1) * slots_per_rank) for r in range(num_ranks)]
        self.requests: dict[int, Request] = {}
        self._next_index = 0
        self.num_allocated = 0
        self.listeners: list = []  # grow(old_layout) of tables laid out like the addresses (hisparse, buffer maps)
        self._known = (None, None, None)  # (addresses, storage positions, home bounds) of the pending access batch
        # Each home's first address (R + 1, read-only): homes are ascending address ranges, so cutting an ascending
        # batch at these counts it per home rank (the facade, the policies and `home_bounds` cut by them).
        self.home_starts = np.arange(num_ranks + 1, dtype=np.int64) * slots_per_rank
        self.home_starts.setflags(write=False)

    def index(self, addrs: np.ndarray) -> np.ndarray:
        if addrs is self._known[0]:  # the pending batch (the facade located it): no second pass
            return self._known[1]
        return self.rows.index(addrs)

    def remember(self, addrs: np.ndarray, ix: np.ndarray, bounds: list | None = None) -> None:
        """Note the storage positions `ix` of an access batch's addresses (read-only arrays, kept unchanged until
        `forget`), and their home bounds when known: `index` and `home_bounds` of that very array return them (the
        policy and the TP local buffers locate and cut the batch again)."""
        self._known = (addrs, ix, bounds)

    def forget(self) -> None:
        self._known = (None, None, None)

    def home_bounds(self, addrs: np.ndarray) -> list:
        """Position of each home rank's first address in the ascending `addrs`, and its size: R + 1 ints (homes are
        ascending address ranges, so home r's addresses are addrs[bounds[r]:bounds[r + 1]])."""
        known = self._known
        if addrs is known[0] and known[2] is not None:  # the pending batch, cut when the facade located it
            return known[2]
        return addrs.searchsorted(self.home_starts).tolist()

    @property
    def scratch(self) -> np.ndarray:
        """The dedup marker over storage (+1: where -1 padding lands), all False between accesses: one buffer shared
        by every space of the process (accesses run one at a time), so many caches cost one marker."""
        n = self.rows.size + 1
        if _MARKER[0].size < n:
            _MARKER[0] = np.zeros(max(n, 2 * _MARKER[0].size), dtype=bool)
        return _MARKER[0][:n]

    def home(self, addrs: np.ndarray) -> np.ndarray:
        return addrs // self.slots_per_rank

    def free_ids(self, rank: int) -> int:
        return len(self.ids[rank])

    def reserve(self, counts) -> None:
        """Grow the tables (every rank at once: one re-layout) so that counts[r] more ids of each rank fit."""
        counts = [int(n) for n in counts]
        caps, spr = self.rows.caps, self.slots_per_rank
        if all(n <= 0 or self.ids[r].high_after(n) - r * spr <= caps[r] for r, n in enumerate(counts)):
            return  # every row holds its ids already (the others' ids in use always fit their rows)
        need = [s.high_after(n) - r * spr for r, (s, n) in enumerate(zip(self.ids, counts))]
        old = self.rows.grow(np.array(need, dtype=np.int64))
        if old is None:
            return
        self.forget()  # storage positions change
        self.table = self.rows.relayout(self.table, old, -1)
        for grow in self.listeners:
            grow(old)

    def pop_ids(self, rank: int, n: int) -> np.ndarray:
        """n fresh or reused addresses of a home rank (tables grown to hold them)."""
        if self.ids[rank].high_after(n) - rank * self.slots_per_rank > int(self.rows.caps[rank]):
            counts = np.zeros(self.num_ranks, dtype=np.int64)
            counts[rank] = n
            self.reserve(counts)
        return self.ids[rank].pop(n)

    def index_one(self, addr: int) -> int:
        """`index` of one allocated address, as an int (row r of the storage starts at rows.offs[r])."""
        if self.rows.identity:
            return addr
        r = addr // self.slots_per_rank
        return addr + int(self.rows.offs[r]) - r * self.slots_per_rank

    def pop_one(self, rank: int) -> int:
        """`pop_ids(rank, 1)` as an int (a decode token's address: no array passes)."""
        ids = self.ids[rank]
        if ids.high_after(1) - rank * self.slots_per_rank > int(self.rows.caps[rank]):
            counts = [0] * self.num_ranks
            counts[rank] = 1
            self.reserve(counts)
        return ids.pop_few(1)[0]

    def places(self, addrs: np.ndarray) -> np.ndarray:
        """Current place of each (allocated, in-range) address."""
        return self.table[self.index(addrs)]

    def set_places(self, addrs: np.ndarray, places: np.ndarray) -> None:
        self.table[self.index(addrs)] = places

    def allocated(self) -> np.ndarray:
        """Every allocated address, ascending."""
        return self.rows.ids(np.flatnonzero(self.table >= 0))

    @property
    def phys(self) -> np.ndarray:
        """The address -> place table over the whole address space: a dense copy, sized by the budget (for snapshots
        such as UlaCache.device_state and for tests; the library itself uses `places`)."""
        out = np.full((self.num_ranks, self.slots_per_rank), -1, dtype=self.place_dtype)
        caps, offs = self.rows.caps.tolist(), self.rows.offs.tolist()
        for r in range(self.num_ranks):  # loop over ranks
            out[r, : caps[r]] = self.table[offs[r]:offs[r] + caps[r]]
        return out.ravel()

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
        req.append(addrs, self.id_dtype)
        self.num_allocated += addrs.size

    def register_one(self, request_id: int, req: Request, addr: int) -> None:
        """`register` of one address given as an int (a decode token)."""
        if request_id not in self.requests:
            self.requests[request_id] = req
        req.append_one(addr)
        self.num_allocated += 1

    def release(self, request_id: int) -> np.ndarray:
        """Forget the request; return its addresses (their ids go back to the free lists, places to -1)."""
        req = self.requests.pop(request_id)
        addrs = req.addresses()
        ix = self.index(addrs)
        self.table[ix] = -1
        homes = self.home(addrs)
        for r in np.flatnonzero(np.bincount(homes, minlength=self.num_ranks)).tolist():  # loop over ranks
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
