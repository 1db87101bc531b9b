"""TP local buffers: per-rank GPU buffers of selected-KV copies, reused across access batches (docs/architecture.md).

Every rank executes every access batch and needs all its selected entries. Entries homed on the rank are read from
its own GPU pool; the others are looked up in the rank's buffer (a hit: `num_local_hits`) and the misses are fetched
from their home rank's GPU pool (after any promotion from CPU) over NVLink (`num_peer_fetches`, counted per
receiving rank). Replacement per rank: free buffer slots first (lowest first), then exact LRU over buffer slots not
used by this batch, by (last-use access, slot); the i-th miss of a rank (ascending address) takes the i-th slot.
Copies are caches: they never count as capacity. Address -> buffer slot: one map per rank (slot_map.py: one dense
address-major table while the addresses in use keep it within slot_map.dense_rule, or within the caller's
CacheConfig.dense_map_bytes, else hash tables), all
ranks looked up at once. The slots live in a `pools.Pool` (storage grows with the copies held); the LRU order is a
`lru_log.StampLog` of the access batches' addresses with one last-access stamp per address (every rank touches
every address of a batch not homed on it), so a selection reads the oldest batches, not the whole buffer.
The work is mostly random reads and writes of large tables, so each is done once per address where it can be: the
hits come from the stamp log's per-address stamps and per-rank fronts (lru_log.StampLog.lookup: a rank holds every
address last touched after its front and none before), so the maps are read only for the few addresses last
touched at a front and for the victims' batches; a plan keeps the victims' rows it read, changes its own copies of
them, and its commit writes them back whole, then sets the misses' cells. The maps are the authority on which
address a slot holds: the pool's owner table is written from them when `check` reads it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import slot_map, threads
from .errors import CapacityError, require
from .lru_log import StampLog
from .plan import Plan
from .pools import Pool, merge_by_rank


def _nonzero_rows(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.nonzero of a 2-D mask with few rows (row-major order), through flatnonzero (2-D nonzero is ~4x slower)."""
    flat = np.flatnonzero(mask)
    rows = np.repeat(np.arange(mask.shape[0], dtype=np.int64), np.count_nonzero(mask, axis=1))
    return rows, flat - rows * mask.shape[1]


@dataclass
class _BufState:
    addrs: np.ndarray  # the batch's addresses
    miss_idx: np.ndarray  # the misses' indices into the batch, grouped by rank
    counts: np.ndarray  # misses per rank
    dests: np.ndarray  # buffer-local places
    uix: np.ndarray  # the batch's address-storage positions
    writes: list  # map writes at commit before the misses go in (slot_map `drop_rows`/`drop` of the victims)

    @property
    def miss_addrs(self) -> np.ndarray:
        """The misses' addresses, grouped by rank, ascending within a rank."""
        return self.addrs.take(self.miss_idx)

    @property
    def miss_rank(self) -> np.ndarray:
        """The receiving rank of each miss."""
        return np.repeat(np.arange(self.counts.size, dtype=np.int64), self.counts)


class LocalBuffers:
    def __init__(self, be, num_ranks: int, slots: int, space, base_place: int, dense_map_bytes: int = 0):
        self.be, self.R, self.slots = be, num_ranks, slots
        # places r * seg + s; victims from the stamp log (lru_log.StampLog: one stamp per access batch and address,
        # read from the oldest batch; the pinned-keys TP replay touches ~1/7 of each buffer per batch and evicts
        # ~1/30). The pool's own per-slot stamps are never read or written: the narrowest dtype (its storage is
        # re-laid at every growth).
        self.pool = Pool(num_ranks, slots, address_limit=space.size, stamp_dtype=np.int8)
        self.log = StampLog(self.pool, space)
        self.seg = self.pool.seg
        self.num_places = self.pool.num_places
        self.base = base_place  # unified place of buffer-local place 0
        self.space = space
        self.slots_per_rank = space.slots_per_rank
        self.dense_rule = slot_map.dense_rule(dense_map_bytes)  # (limit, over_hash): CacheConfig.dense_map_bytes
        self.maps = slot_map.make_slot_maps(num_ranks, space, slots, *self.dense_rule)
        space.listeners.append(self._refit_maps)  # after the dense table's own listener
        # The maps are the authority on which address each slot holds: the pool's owner table is written from them
        # only when read (`_sync_owners`, by `check`), not per batch (a random write per miss). Slots claimed by the
        # pending plan's misses (free ones; victims' slots stay taken) count as held from its commit on.
        self._owners_stale = False
        self._pending_claims = 0
        self._checked = (None, [])  # the last batch checked and its home bounds

    def _refit_maps(self, old: int) -> None:
        self.maps = slot_map.fits(self.maps, self.slots, *self.dense_rule)

    def check_fits(self, uniq: np.ndarray) -> list[int]:
        """Home bounds of the ascending batch `uniq`; CapacityError when a rank's remote entries exceed its buffer
        (checked before the policy plans, so that a refused batch changes nothing)."""
        if self._checked[0] is uniq:  # the facade checked this batch before the policy planned it
            return self._checked[1]
        bounds = self.space.home_bounds(uniq)  # (the facade's cut of the pending batch)
        remote = [uniq.size - (b - a) for a, b in zip(bounds, bounds[1:])]
        if max(remote) > self.slots:
            r = next(r for r, n in enumerate(remote) if n > self.slots)
            raise CapacityError(
                f"TP rank {r} needs {remote[r]} remote entries in one batch; its local buffer holds {self.slots}"
            )
        self._checked = (uniq, bounds)
        return bounds

    def plan(self, plan: Plan, old_places: np.ndarray) -> None:
        """Every rank looks up the entries homed elsewhere (all ranks at once); its misses take free buffer slots,
        then its least recently used ones. Stamps are written here (the hits first: they protect them from this
        selection), the maps and owners at commit."""
        be, uniq, pool = self.be, plan.addrs, self.pool
        bounds = self.check_fits(uniq)  # homes
        uix = self.space.index(uniq)
        log = self.log
        if log.stamps and log.stamps[-1] >= plan.now:  # a batch of this stamp is logged (its hits may be victims
            h_counts, miss_idx, counts, _ = self.maps.remote(uniq, uix, bounds)  # of this selection): the maps
            log.stamp(uix, plan.now)
        else:  # the stamps tell the copies held (lru_log.StampLog.lookup)
            h_counts, miss_idx, counts = log.lookup(uniq, uix, bounds, plan.now, self.maps)
        pool.reserve(counts)  # any storage growth before positions are taken
        s0, f0 = pool.take_free(be, counts)
        self._pending_claims = int(f0.sum())
        rest = counts - f0
        writes = []
        dests = pool.places(s0)
        if rest.any():
            got, found, writes = log.select(rest, self.maps)
            dests = merge_by_rank([dests, got], [f0, found])
        log.append(uix, plan.now, h_counts + counts)
        n0, n = plan.move_src.size, miss_idx.size
        # The fetch reads the entry where it is now (its CPU place if it is being promoted: the same bytes).
        move_src = np.empty(n0 + n, dtype=np.int64)
        move_src[:n0] = plan.move_src
        move_src[n0:] = old_places.take(miss_idx)
        move_dst = np.empty(n0 + n, dtype=np.int64)
        move_dst[:n0] = plan.move_dst
        np.add(dests, self.base, out=move_dst[n0:])
        plan.num_local_hits = int(h_counts.sum())
        plan.num_peer_fetches = int(n)
        plan.peer_rows_per_rank = counts
        plan.move_src, plan.move_dst = move_src, move_dst
        plan.buffer_state = _BufState(uniq, miss_idx, counts, dests, uix, writes)

    def commit(self, plan: Plan) -> None:
        st = plan.buffer_state
        # All ranks at once (each rank's row of the maps is its own): victims out, then the misses in (a rank's
        # victim is never one of its misses). The rows a plan read are unchanged until its commit (no access, alloc
        # or free runs in between), so the victims' rows are written back whole.
        for change in st.writes:  # loop over the batches the selection read
            self.maps.write(change)
        self.maps.insert_grouped(threads.take(st.uix, st.miss_idx), st.counts,
                                 None if self.maps.by_index else st.miss_addrs, st.dests, self.seg)
        self._pending_claims = 0
        self._owners_stale = True  # the new copies' slots in the pool's owner table: at the next `_sync_owners`

    def _sync_owners(self) -> None:
        """Write the pool's owner table from the maps (every rank's address -> slot)."""
        if not self._owners_stale:
            return
        pool = self.pool
        pool.own[:] = -1
        for r in range(self.R):  # loop over ranks
            keys, vals = self.maps.items(r)
            pool.own[pool.idx(r * self.seg + vals)] = keys
        self._owners_stale = False

    def _held(self, addrs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rank, index into addrs, buffer-local place) of every copy of `addrs`, grouped by rank."""
        held = self.maps.rank_major(addrs, self.space.index(addrs))  # (R, len(addrs)) slot + 1, 0: none
        r, i = _nonzero_rows(held != 0)
        places = held[r, i].astype(np.int64)
        places += r * self.seg - 1
        return r, i, places

    def invalidate(self, addrs: np.ndarray) -> None:
        """Drop every rank's copies of freed addresses."""
        r, i, places = self._held(addrs)
        idx = self.pool.idx(places)
        self.pool.give_back(self.be, idx)
        self.maps.delete(r, addrs.take(i))
        self.log.forget(self.space.index(addrs))  # held nowhere now: their log entries are no candidates

    def slots_of(self, addrs: np.ndarray, r: int) -> np.ndarray:
        """Rank r's buffer slot of each address, -1 where it holds no copy."""
        return self.maps.get(r, addrs)

    def copies(self, addrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into addrs, unified place) of every buffer copy of `addrs`."""
        _, i, places = self._held(addrs)
        return i, self.base + places

    def held(self) -> int:
        """Copies held now, all ranks: the slots taken, less those the pending plan claimed."""
        return int(self.pool.in_use.sum()) - self._pending_claims

    def check(self) -> None:
        pool = self.pool
        self._sync_owners()
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
        held = np.unique(owners)
        self.log.check(require, self.space.index(held), self.maps)
        last, front = self.log.last, self.log.front
        for r in range(self.R):  # loop over ranks: the copies held are those `lookup` reads from the stamps
            keys, _ = self.maps.items(r)
            require((last.take(self.space.index(keys)) >= front[r]).all(), "a local buffer holds a copy older than its "
                    "front")
            touched = self.space.rows.ids(np.flatnonzero(last > front[r]))
            touched = touched[touched // self.slots_per_rank != r]
            require(np.isin(touched, keys).all(), "a rank lacks a copy of an address touched after its front")


__all__ = ["LocalBuffers"]
