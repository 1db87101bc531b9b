"""TP local buffers: per-rank GPU buffers of selected-KV copies, reused across access batches (DESIGN §2).

Every rank executes every access batch and needs all its selected entries. Entries homed on the rank are read from
its own GPU pool; the others are looked up in the rank's buffer (a hit: `num_local_hits`) and the misses are fetched
from their home rank's GPU pool (after any promotion from CPU) over NVLink (`num_peer_fetches`, counted per
receiving rank). Replacement per rank: free buffer slots first (lowest first), then exact LRU over buffer slots not
used by this batch, by (last-use step, slot); the i-th miss of a rank (ascending address) takes the i-th slot.
Copies are caches: they never count as capacity. Address -> buffer slot: one map per rank (slot_map.py: one dense
table while the addresses in use keep it under slot_map.DENSE_LIMIT_BYTES, else hash tables), all ranks looked up
at once. The slots live in a `pools.Pool` (storage grows with the copies held; the free-then-LRU replacement is the
pool's, shared with the exact-LRU policy).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import slot_map
from .errors import CapacityError, require
from .plan import Plan
from .pools import Pool


def _nonzero_rows(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.nonzero of a 2-D mask with few rows (row-major order), through flatnonzero (2-D nonzero is ~4x slower)."""
    flat = np.flatnonzero(mask)
    rows = np.repeat(np.arange(mask.shape[0], dtype=np.int64), np.count_nonzero(mask, axis=1))
    return rows, flat - rows * mask.shape[1]


@dataclass
class _BufState:
    hit_places: np.ndarray  # buffer-local places (rank r's slot s is r * seg + s)
    miss_addrs: np.ndarray  # grouped by rank
    counts: np.ndarray  # misses per rank
    miss_rank: np.ndarray  # receiving rank of each miss
    dests: np.ndarray  # buffer-local places
    victims: np.ndarray
    hit_idx: np.ndarray  # pool storage positions of the hits and the dests
    dest_idx: np.ndarray


class LocalBuffers:
    def __init__(self, be, num_ranks: int, slots: int, space, base_place: int, dense_limit: int | None = None):
        self.be, self.R, self.slots = be, num_ranks, slots
        # places r * seg + s; victims by scanning, never the stamp log: each batch touches a large share of a
        # buffer, and the log's sorts and rebuilds cost more than the counting scan (pinned-keys TP replay, 2482
        # steps: 193-197 CPU-s in "auto", where the log runs 1,556 selections, vs 139 scanning; same victims)
        self.pool = Pool(num_ranks, slots, exact_lru=True, address_limit=space.size, lru_log_mode="scan")
        self.seg = self.pool.seg
        self.num_places = self.pool.num_places
        self.base = base_place  # unified place of buffer-local place 0
        self.space = space
        self.slots_per_rank = space.slots_per_rank
        self.dense_limit = slot_map.DENSE_LIMIT_BYTES if dense_limit is None else dense_limit
        self.maps = slot_map.make_slot_maps(num_ranks, space, slots, self.dense_limit)
        space.listeners.append(self._refit_maps)  # after the dense table's own listener

    def _refit_maps(self, old: int) -> None:
        self.maps = slot_map.fits(self.maps, self.slots, self.dense_limit)

    def check_fits(self, uniq: np.ndarray) -> list[int]:
        """Home bounds of the ascending batch `uniq`; CapacityError when a rank's remote entries exceed its buffer
        (checked before the policy plans, so that a refused batch changes nothing)."""
        bounds = np.searchsorted(uniq, np.arange(self.R + 1, dtype=np.int64) * self.slots_per_rank).tolist()
        remote = uniq.size - np.diff(bounds)
        over = np.flatnonzero(remote > self.slots)
        if over.size:
            r = int(over[0])
            raise CapacityError(
                f"TP rank {r} needs {int(remote[r])} remote entries in one batch; its local buffer holds {self.slots}"
            )
        return bounds

    def plan(self, plan: Plan, old_places: np.ndarray) -> None:
        """Every rank looks up the entries homed elsewhere (two slices of the ascending batch) in its map."""
        be, R, uniq, pool = self.be, self.R, plan.addrs, self.pool
        bounds = self.check_fits(uniq)  # homes
        uix = self.space.index(uniq)
        hits, miss_idx, counts = [], [], np.zeros(R, dtype=np.int64)
        for r in range(R):  # loop over ranks; per rank, slices [0, lo) and [hi, U) (views, no index arrays)
            if self.maps.one_lookup_per_rank:
                rem = np.concatenate([np.arange(bounds[r]), np.arange(bounds[r + 1], uniq.size)])
                bs = self.maps.get(r, uniq.take(rem))
                held = bs >= 0
                hits.append(bs.take(np.flatnonzero(held)) + r * self.seg)
                m = rem.take(np.flatnonzero(~held))
                miss_idx.append(m)
                counts[r] += m.size
                continue
            for off, end in ((0, bounds[r]), (bounds[r + 1], uniq.size)):
                bs = self.maps.lookup(r, uniq[off:end], uix[off:end])
                held = bs >= 0
                hits.append(bs.take(np.flatnonzero(held)) + r * self.seg)
                m = np.flatnonzero(~held)
                miss_idx.append(m + off if off else m)
                counts[r] += m.size
        hit_places, miss_idx = np.concatenate(hits), np.concatenate(miss_idx)
        miss_rank = np.repeat(np.arange(R, dtype=np.int64), counts)
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
        plan.buffer_state = _BufState(hit_places, miss_addrs, counts, miss_rank, dests, pool.own.take(dest_idx),
                                      hit_idx, dest_idx)

    def commit(self, plan: Plan) -> None:
        st, pool = plan.buffer_state, self.pool
        # All ranks at once (each rank's row of the maps is its own): victims out, then the misses in (a rank's
        # victim is never one of its misses).
        has_v = np.flatnonzero(st.victims >= 0)
        self.maps.delete(st.miss_rank.take(has_v), st.victims.take(has_v))
        self.maps.set(st.miss_rank, st.miss_addrs, st.dests - st.miss_rank * self.seg)
        pool.own[st.dest_idx] = st.miss_addrs
        pool.touch(st.hit_idx, plan.now)
        pool.touch(st.dest_idx, plan.now)

    def _held(self, addrs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rank, index into addrs, buffer-local place) of every copy of `addrs`, grouped by rank."""
        bs = self.maps.get_all(addrs)
        r, i = _nonzero_rows(bs >= 0)
        return r, i, bs[r, i].astype(np.int64) + r * self.seg

    def invalidate(self, addrs: np.ndarray) -> None:
        """Drop every rank's copies of freed addresses."""
        r, i, places = self._held(addrs)
        self.pool.give_back(self.be, self.pool.idx(places))
        self.maps.delete(r, addrs.take(i))

    def slots_of(self, addrs: np.ndarray, r: int) -> np.ndarray:
        """Rank r's buffer slot of each address, -1 where it holds no copy."""
        return self.maps.get(r, addrs)

    def copies(self, addrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into addrs, unified place) of every buffer copy of `addrs`."""
        _, i, places = self._held(addrs)
        return i, self.base + places

    def held(self) -> int:
        """Copies held now, all ranks."""
        return int(np.count_nonzero(self.pool.own >= 0))

    def check(self) -> None:
        pool = self.pool
        pool.check(require, "local-buffer")
        occ_idx = np.flatnonzero(pool.own >= 0)
        occ = pool.places(occ_idx)
        rank = occ // self.seg
        owners = pool.own[occ_idx]
        require((self.space.places(owners) >= 0).all(), "a local buffer holds a copy of a freed address")
        require((owners // self.slots_per_rank != rank).all(), "a local buffer holds a copy of an entry homed there")
        for r in range(self.R):  # loop over ranks
            sel = rank == r
            keys, vals = self.maps.items(r)
            order = np.argsort(owners[sel])
            require(np.array_equal(keys, owners[sel][order]), "local-buffer map keys disagree with the owners")
            require(np.array_equal(vals, occ[sel][order] - r * self.seg), "local-buffer map slots disagree")


__all__ = ["LocalBuffers"]
