"""TP local buffers: per-rank GPU buffers of selected-KV copies, reused across access batches (DESIGN §2).

Every rank executes every access batch and needs all its selected entries. Entries homed on the rank are read from
its own GPU pool; the others are looked up in the rank's buffer (a hit: `num_local_hits`) and the misses are fetched
from their home rank's GPU pool (after any promotion from CPU) over NVLink (`num_peer_fetches`, counted per
receiving rank). Replacement per rank: free buffer slots first (lowest first), then exact LRU over buffer slots not
used by this batch, by (last-use step, slot); the i-th miss of a rank (ascending address) takes the i-th slot.
Copies are caches: they never count as capacity. Memory: one int32 map per rank over the address space.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import CapacityError
from .plan import Plan
from .pools import pad64


@dataclass
class _BufState:
    hit_places: np.ndarray  # buffer-local places (rank r's slot s is r * seg + s)
    miss_addrs: np.ndarray
    miss_rank: np.ndarray
    dests: np.ndarray
    victims: np.ndarray
    free_bm: np.ndarray


class LocalBuffers:
    def __init__(self, be, num_ranks: int, slots: int, space_size: int, slots_per_rank: int, base_place: int):
        self.be, self.R, self.slots = be, num_ranks, slots
        self.seg = pad64(slots)
        self.num_places = num_ranks * self.seg
        self.base = base_place  # unified place of buffer-local place 0
        self.slots_per_rank = slots_per_rank
        self.map = np.full((num_ranks, space_size), -1, dtype=np.int32)
        self.owner = np.full(self.num_places, -1, dtype=np.int64)
        self.stamps = np.zeros(self.num_places, dtype=np.int64)
        valid = np.zeros(self.num_places, dtype=bool)
        for r in range(num_ranks):
            valid[r * self.seg:r * self.seg + slots] = True
        self.valid = valid
        self.free_bm = np.packbits(valid, bitorder="little")

    def remote(self, uniq: np.ndarray, r: int) -> np.ndarray:
        """The ascending addresses of `uniq` (ascending) not homed on rank r."""
        lo, hi = np.searchsorted(uniq, [r * self.slots_per_rank, (r + 1) * self.slots_per_rank])
        return np.concatenate([uniq[:lo], uniq[hi:]])

    def plan(self, plan: Plan, old_places: np.ndarray) -> None:
        be, R, uniq = self.be, self.R, plan.addrs
        hits, miss, miss_rank = [], [], []
        for r in range(R):  # loop over ranks
            rem = self.remote(uniq, r)
            bs = self.map[r][rem].astype(np.int64)
            if rem.size > self.slots:
                raise CapacityError(
                    f"TP rank {r} needs {rem.size} remote entries in one batch; its local buffer holds {self.slots}"
                )
            hits.append(bs[bs >= 0] + r * self.seg)
            m = rem[bs < 0]
            miss.append(m)
            miss_rank.append(np.full(m.size, r, dtype=np.int64))
        hit_places, miss_addrs, miss_rank = np.concatenate(hits), np.concatenate(miss), np.concatenate(miss_rank)
        counts = np.bincount(miss_rank, minlength=R).astype(np.int64)
        bm = be.asarray(self.free_bm.copy())
        s0, f0 = be.select_first(bm, be.summary(bm), self.seg, be.asarray(counts))
        s0, f0 = be.to_numpy(s0), be.to_numpy(f0)
        free_bm = be.to_numpy(be.bitmap_clear(bm, be.asarray(s0)))
        parts = [s0]
        rest = counts - f0
        if rest.any():
            eligible = self.owner >= 0
            eligible[hit_places] = False
            s1, _ = be.lru_select(be.asarray(self.stamps), be.asarray(eligible), self.seg, be.asarray(rest))
            parts.append(be.to_numpy(s1))
        dests = np.concatenate(parts)
        dests = dests[np.argsort(dests // self.seg, kind="stable")]
        # The fetch reads the entry where it is now (its CPU place if it is being promoted: the same bytes).
        src = old_places[np.searchsorted(uniq, miss_addrs)]
        plan.num_local_hits = int(hit_places.size)
        plan.num_peer_fetches = int(miss_addrs.size)
        plan.peer_rows_per_rank = counts
        plan.move_src = np.concatenate([plan.move_src, src])
        plan.move_dst = np.concatenate([plan.move_dst, self.base + dests])
        plan.buffer_state = _BufState(hit_places, miss_addrs, miss_rank, dests, self.owner[dests], free_bm)

    def commit(self, plan: Plan) -> None:
        st = plan.buffer_state
        has_v = st.victims >= 0
        vrank = st.dests[has_v] // self.seg
        for r in range(self.R):  # loop over ranks
            self.map[r][st.victims[has_v][vrank == r]] = -1
            sel = st.miss_rank == r
            self.map[r][st.miss_addrs[sel]] = st.dests[sel] - r * self.seg
        self.owner[st.dests] = st.miss_addrs
        self.stamps[st.hit_places] = plan.now
        self.stamps[st.dests] = plan.now
        self.free_bm = st.free_bm

    def invalidate(self, addrs: np.ndarray) -> None:
        """Drop every rank's copies of freed addresses."""
        for r in range(self.R):  # loop over ranks
            bs = self.map[r][addrs]
            held = bs >= 0
            places = bs[held].astype(np.int64) + r * self.seg
            self.owner[places] = -1
            self.free_bm = self.be.to_numpy(self.be.bitmap_set(self.be.asarray(self.free_bm), self.be.asarray(places)))
            self.map[r][addrs[held]] = -1

    def copies(self, addrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into addrs, unified place) of every buffer copy of `addrs`."""
        idx, places = [], []
        for r in range(self.R):  # loop over ranks
            bs = self.map[r][addrs]
            held = np.flatnonzero(bs >= 0)
            idx.append(held)
            places.append(self.base + r * self.seg + bs[held].astype(np.int64))
        return np.concatenate(idx), np.concatenate(places)

    def check(self, phys: np.ndarray) -> None:
        occ = np.flatnonzero(self.owner >= 0)
        assert not (self.owner[~self.valid] >= 0).any(), "local-buffer padding slot used"
        free_bits = np.unpackbits(self.free_bm, bitorder="little").view(bool)
        assert (free_bits == (self.valid & (self.owner < 0))).all(), "local-buffer free bitmap disagrees with owners"
        rank = occ // self.seg
        owners = self.owner[occ]
        assert (phys[owners] >= 0).all(), "a local buffer holds a copy of a freed address"
        assert (owners // self.slots_per_rank != rank).all(), "a local buffer holds a copy of an entry homed there"
        for r in range(self.R):  # loop over ranks
            sel = rank == r
            assert (self.map[r][owners[sel]] == occ[sel] - r * self.seg).all(), "local-buffer map disagrees"
            assert int((self.map[r] >= 0).sum()) == int(sel.sum()), "local-buffer map has stale entries"


__all__ = ["LocalBuffers"]
