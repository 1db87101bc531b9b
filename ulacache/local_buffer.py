"""TP local buffers: per-rank GPU buffers of selected-KV copies, reused across access batches (DESIGN §2).

Every rank executes every access batch and needs all its selected entries. Entries homed on the rank are read from
its own GPU pool; the others are looked up in the rank's buffer (a hit: `num_local_hits`) and the misses are fetched
from their home rank's GPU pool (after any promotion from CPU) over NVLink (`num_peer_fetches`, counted per
receiving rank). Replacement per rank: free buffer slots first (lowest first), then exact LRU over buffer slots not
used by this batch, by (last-use step, slot); the i-th miss of a rank (ascending address) takes the i-th slot.
Copies are caches: they never count as capacity. Address -> buffer slot: one map per rank (slot_map.py: a dense
table when small, else a hash table sized by the buffer).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import CapacityError, require
from .plan import Plan
from .pools import pad64
from .slot_map import make_slot_maps


@dataclass
class _BufState:
    hit_places: np.ndarray  # buffer-local places (rank r's slot s is r * seg + s)
    miss_addrs: np.ndarray  # grouped by rank
    counts: np.ndarray  # misses per rank
    dests: np.ndarray
    victims: np.ndarray
    free_bm: np.ndarray


class LocalBuffers:
    def __init__(self, be, num_ranks: int, slots: int, space_size: int, slots_per_rank: int, base_place: int,
                 dense_limit: int | None = None):
        self.be, self.R, self.slots = be, num_ranks, slots
        self.seg = pad64(slots)
        self.num_places = num_ranks * self.seg
        self.base = base_place  # unified place of buffer-local place 0
        self.slots_per_rank = slots_per_rank
        self.maps = make_slot_maps(num_ranks, space_size, slots, dense_limit)
        self.owner = np.full(self.num_places, -1, dtype=np.int64)
        self.stamps = np.zeros(self.num_places, dtype=np.int64)
        valid = np.zeros(self.num_places, dtype=bool)
        for r in range(num_ranks):
            valid[r * self.seg:r * self.seg + slots] = True
        self.valid = valid
        self.free_bm = np.packbits(valid, bitorder="little")

    def remote(self, uniq: np.ndarray, r: int) -> np.ndarray:
        """Indices into `uniq` (ascending addresses) of the addresses not homed on rank r: all but one slice."""
        lo, hi = np.searchsorted(uniq, [r * self.slots_per_rank, (r + 1) * self.slots_per_rank])
        return np.concatenate([np.arange(lo, dtype=np.int64), np.arange(hi, uniq.size, dtype=np.int64)])

    def plan(self, plan: Plan, old_places: np.ndarray) -> None:
        be, R, uniq = self.be, self.R, plan.addrs
        hits, miss_idx = [], []
        for r in range(R):  # loop over ranks
            rem = self.remote(uniq, r)
            if rem.size > self.slots:
                raise CapacityError(
                    f"TP rank {r} needs {rem.size} remote entries in one batch; its local buffer holds {self.slots}"
                )
            bs = self.maps[r].get(uniq.take(rem))
            held = bs >= 0
            hits.append(bs.take(np.flatnonzero(held)) + r * self.seg)
            miss_idx.append(rem.take(np.flatnonzero(~held)))
        counts = np.array([m.size for m in miss_idx], dtype=np.int64)
        hit_places, miss_idx = np.concatenate(hits), np.concatenate(miss_idx)
        miss_addrs = uniq.take(miss_idx)  # grouped by rank, ascending within a rank
        bm = be.asarray(self.free_bm.copy())
        s0, f0 = be.select_first(bm, be.summary(bm), self.seg, be.asarray(counts))
        s0, f0 = be.to_numpy(s0), be.to_numpy(f0)
        free_bm = be.to_numpy(be.bitmap_clear(bm, be.asarray(s0)))
        dests = s0
        rest = counts - f0
        if rest.any():
            eligible = self.owner >= 0
            eligible[hit_places] = False
            s1, _ = be.lru_select(be.asarray(self.stamps), be.asarray(eligible), self.seg, be.asarray(rest))
            dests = np.concatenate([s0, be.to_numpy(s1)])
            if R > 1 and s0.size:
                dests = dests.take(np.argsort(dests // self.seg, kind="stable"))
        # The fetch reads the entry where it is now (its CPU place if it is being promoted: the same bytes).
        src = old_places.take(miss_idx)
        plan.num_local_hits = int(hit_places.size)
        plan.num_peer_fetches = int(miss_addrs.size)
        plan.peer_rows_per_rank = counts
        plan.move_src = np.concatenate([plan.move_src, src])
        plan.move_dst = np.concatenate([plan.move_dst, self.base + dests])
        plan.buffer_state = _BufState(hit_places, miss_addrs, counts, dests, self.owner.take(dests), free_bm)

    def commit(self, plan: Plan) -> None:
        st = plan.buffer_state
        ends = np.cumsum(st.counts)
        for r in range(self.R):  # loop over ranks: each rank's misses, dests and victims are one slice
            sl = slice(int(ends[r] - st.counts[r]), int(ends[r]))
            v = st.victims[sl]
            self.maps[r].delete(v.take(np.flatnonzero(v >= 0)))
            self.maps[r].set(st.miss_addrs[sl], st.dests[sl] - r * self.seg)
        self.owner[st.dests] = st.miss_addrs
        self.stamps[st.hit_places] = plan.now
        self.stamps[st.dests] = plan.now
        self.free_bm = st.free_bm

    def invalidate(self, addrs: np.ndarray) -> None:
        """Drop every rank's copies of freed addresses."""
        for r in range(self.R):  # loop over ranks
            bs = self.maps[r].get(addrs)
            held = np.flatnonzero(bs >= 0)
            places = bs.take(held) + r * self.seg
            self.owner[places] = -1
            self.free_bm = self.be.to_numpy(self.be.bitmap_set(self.be.asarray(self.free_bm), self.be.asarray(places)))
            self.maps[r].delete(addrs.take(held))

    def slots_of(self, addrs: np.ndarray, r: int) -> np.ndarray:
        """Rank r's buffer slot of each address, -1 where it holds no copy."""
        return self.maps[r].get(addrs)

    def copies(self, addrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into addrs, unified place) of every buffer copy of `addrs`."""
        idx, places = [], []
        for r in range(self.R):  # loop over ranks
            bs = self.maps[r].get(addrs)
            held = np.flatnonzero(bs >= 0)
            idx.append(held)
            places.append(self.base + r * self.seg + bs.take(held))
        return np.concatenate(idx), np.concatenate(places)

    def check(self, phys: np.ndarray) -> None:
        occ = np.flatnonzero(self.owner >= 0)
        require(not (self.owner[~self.valid] >= 0).any(), "local-buffer padding slot used")
        free_bits = np.unpackbits(self.free_bm, bitorder="little").view(bool)
        require((free_bits == (self.valid & (self.owner < 0))).all(), "local-buffer free bitmap disagrees with owners")
        rank = occ // self.seg
        owners = self.owner[occ]
        require((phys[owners] >= 0).all(), "a local buffer holds a copy of a freed address")
        require((owners // self.slots_per_rank != rank).all(), "a local buffer holds a copy of an entry homed there")
        for r in range(self.R):  # loop over ranks
            sel = rank == r
            keys, vals = self.maps[r].items()
            order = np.argsort(owners[sel])
            require(np.array_equal(keys, owners[sel][order]), "local-buffer map keys disagree with the owners")
            require(np.array_equal(vals, occ[sel][order] - r * self.seg), "local-buffer map slots disagree")


__all__ = ["LocalBuffers"]
