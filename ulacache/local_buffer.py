"""TP local buffers: per-rank GPU buffers of selected-KV copies, reused across access batches (DESIGN §2).

Every rank executes every access batch and needs all its selected entries. Entries homed on the rank are read from
its own GPU pool; the others are looked up in the rank's buffer (a hit: `num_local_hits`) and the misses are fetched
from their home rank's GPU pool (after any promotion from CPU) over NVLink (`num_peer_fetches`, counted per
receiving rank). Replacement per rank: free buffer slots first (lowest first), then exact LRU over buffer slots not
used by this batch, by (last-use step, slot); the i-th miss of a rank (ascending address) takes the i-th slot.
Copies are caches: they never count as capacity. Address -> buffer slot: one map per rank (slot_map.py: a dense
table when small, else a hash table). The slots live in a `pools.Pool` (storage grows with the copies held; the
free-then-LRU replacement is the pool's, shared with the exact-LRU policy).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import CapacityError, require
from .plan import Plan
from .pools import Pool
from .slot_map import make_slot_maps


@dataclass
class _BufState:
    hit_places: np.ndarray  # buffer-local places (rank r's slot s is r * seg + s)
    miss_addrs: np.ndarray  # grouped by rank
    counts: np.ndarray  # misses per rank
    dests: np.ndarray  # buffer-local places
    victims: np.ndarray
    hit_idx: np.ndarray  # pool storage positions of the hits and the dests
    dest_idx: np.ndarray


class LocalBuffers:
    def __init__(self, be, num_ranks: int, slots: int, space, base_place: int, dense_limit: int | None = None):
        self.be, self.R, self.slots = be, num_ranks, slots
        self.pool = Pool(num_ranks, slots)  # buffer-local places r * seg + s
        self.seg = self.pool.seg
        self.num_places = self.pool.num_places
        self.base = base_place  # unified place of buffer-local place 0
        self.space = space
        self.slots_per_rank = space.slots_per_rank
        self.maps = make_slot_maps(num_ranks, space, slots, dense_limit)

    def remote(self, uniq: np.ndarray, r: int) -> np.ndarray:
        """Indices into `uniq` (ascending addresses) of the addresses not homed on rank r: all but one slice."""
        lo, hi = np.searchsorted(uniq, [r * self.slots_per_rank, (r + 1) * self.slots_per_rank])
        return np.concatenate([np.arange(lo, dtype=np.int64), np.arange(hi, uniq.size, dtype=np.int64)])

    def plan(self, plan: Plan, old_places: np.ndarray) -> None:
        be, R, uniq, pool = self.be, self.R, plan.addrs, self.pool
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
        pool.reserve(counts)  # any storage growth before positions are taken
        hit_idx = pool.idx(hit_places)
        dest_idx, _ = pool.select_free_then_lru(be, counts, hit_idx)
        dests = pool.places(dest_idx)
        # The fetch reads the entry where it is now (its CPU place if it is being promoted: the same bytes).
        src = old_places.take(miss_idx)
        plan.num_local_hits = int(hit_places.size)
        plan.num_peer_fetches = int(miss_addrs.size)
        plan.peer_rows_per_rank = counts
        plan.move_src = np.concatenate([plan.move_src, src])
        plan.move_dst = np.concatenate([plan.move_dst, self.base + dests])
        plan.buffer_state = _BufState(hit_places, miss_addrs, counts, dests, pool.owner.take(dest_idx), hit_idx,
                                      dest_idx)

    def commit(self, plan: Plan) -> None:
        st, pool = plan.buffer_state, self.pool
        ends = np.cumsum(st.counts)
        for r in range(self.R):  # loop over ranks: each rank's misses, dests and victims are one slice
            sl = slice(int(ends[r] - st.counts[r]), int(ends[r]))
            v = st.victims[sl]
            self.maps[r].delete(v.take(np.flatnonzero(v >= 0)))
            self.maps[r].set(st.miss_addrs[sl], st.dests[sl] - r * self.seg)
        pool.owner[st.dest_idx] = st.miss_addrs
        pool.stamps[st.hit_idx] = plan.now
        pool.stamps[st.dest_idx] = plan.now

    def invalidate(self, addrs: np.ndarray) -> None:
        """Drop every rank's copies of freed addresses."""
        for r in range(self.R):  # loop over ranks
            bs = self.maps[r].get(addrs)
            held = np.flatnonzero(bs >= 0)
            self.pool.give_back(self.be, self.pool.idx(bs.take(held) + r * self.seg))
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

    def held(self) -> int:
        """Copies held now, all ranks."""
        return int(np.count_nonzero(self.pool.owner >= 0))

    @property
    def owner(self) -> np.ndarray:
        """Owner of each buffer-local place (dense over R * seg). TODO(H6): remove after hw/ uses layout()."""
        return self.pool.dense(self.pool.owner, -1)

    def check(self) -> None:
        pool = self.pool
        pool.check(require, "local-buffer")
        occ_idx = np.flatnonzero(pool.owner >= 0)
        occ = pool.places(occ_idx)
        rank = occ // self.seg
        owners = pool.owner[occ_idx]
        require((self.space.places(owners) >= 0).all(), "a local buffer holds a copy of a freed address")
        require((owners // self.slots_per_rank != rank).all(), "a local buffer holds a copy of an entry homed there")
        for r in range(self.R):  # loop over ranks
            sel = rank == r
            keys, vals = self.maps[r].items()
            order = np.argsort(owners[sel])
            require(np.array_equal(keys, owners[sel][order]), "local-buffer map keys disagree with the owners")
            require(np.array_equal(vals, occ[sel][order] - r * self.seg), "local-buffer map slots disagree")


__all__ = ["LocalBuffers"]
