"""TP local buffers: per-rank GPU buffers of selected-KV copies, reused across access batches (DESIGN §2).

Every rank executes every access batch and needs all its selected entries. Entries homed on the rank are read from
its own GPU pool; the others are looked up in the rank's buffer (a hit: `num_local_hits`) and the misses are fetched
from their home rank's GPU pool (after any promotion from CPU) over NVLink (`num_peer_fetches`, counted per
receiving rank). Replacement per rank: free buffer slots first (lowest first), then exact LRU over buffer slots not
used by this batch, by (last-use access, slot); the i-th miss of a rank (ascending address) takes the i-th slot.
Copies are caches: they never count as capacity. Address -> buffer slot: one map per rank (slot_map.py: one dense
address-major table while the addresses in use keep it under slot_map.DENSE_LIMIT_BYTES, else hash tables), all
ranks looked up at once. The slots live in a `pools.Pool` (storage grows with the copies held); the LRU order is a
`lru_log.StampLog` of the access batches' addresses with one last-access stamp per address (every rank touches
every address of a batch not homed on it), so a selection reads the oldest batches, not the whole buffer.
The work is mostly random reads and writes of large tables, so each is done once per address where it can be: a
plan keeps the map rows it reads (the batch's, the victims'), changes its own copies of them, and its commit
writes them back whole (dense maps: one write per address, not per rank and key; a batch with fewer misses than
addresses sets their cells instead). The maps are the authority on
which address a slot holds: the pool's owner table is written from them when `check` reads it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import slot_map
from .errors import CapacityError, require
from .lru_log import StampLog
from .plan import Plan
from .pools import Pool, merge_by_rank

FILL_MIN_MISSES_PER_ADDRESS = 1  # a batch's rows are written back whole (`fill`) from this many misses per address


def _nonzero_rows(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.nonzero of a 2-D mask with few rows (row-major order), through flatnonzero (2-D nonzero is ~4x slower)."""
    flat = np.flatnonzero(mask)
    rows = np.repeat(np.arange(mask.shape[0], dtype=np.int64), np.count_nonzero(mask, axis=1))
    return rows, flat - rows * mask.shape[1]


@dataclass
class _BufState:
    miss_addrs: np.ndarray  # grouped by rank
    miss_idx: np.ndarray  # their indices into the batch
    counts: np.ndarray  # misses per rank
    miss_rank: np.ndarray  # receiving rank of each miss
    dests: np.ndarray  # buffer-local places
    dest_idx: np.ndarray  # pool storage positions of the dests
    uix: np.ndarray  # the batch's address-storage positions
    writes: list  # map writes at commit (slot_map `drop`s of the victims, then the `fill` of the misses)
    fill: bool  # whether `writes` inserts the misses (else they are inserted key by key)


class LocalBuffers:
    def __init__(self, be, num_ranks: int, slots: int, space, base_place: int, dense_limit: int | None = None):
        self.be, self.R, self.slots = be, num_ranks, slots
        # places r * seg + s; victims from the stamp log (lru_log.StampLog: one stamp per access batch and address,
        # read from the oldest batch; the pinned-keys TP replay touches ~1/7 of each buffer per batch and evicts
        # ~1/30). The pool's own per-slot stamps are not used.
        self.pool = Pool(num_ranks, slots, address_limit=space.size, stamp_dtype=np.int32)
        self.log = StampLog(self.pool, space)
        self.seg = self.pool.seg
        self.num_places = self.pool.num_places
        self.base = base_place  # unified place of buffer-local place 0
        self.space = space
        self.slots_per_rank = space.slots_per_rank
        self.dense_limit = slot_map.DENSE_LIMIT_BYTES if dense_limit is None else dense_limit
        self.maps = slot_map.make_slot_maps(num_ranks, space, slots, self.dense_limit)
        space.listeners.append(self._refit_maps)  # after the dense table's own listener
        self._cuts = np.arange(num_ranks + 1, dtype=np.int64) * self.slots_per_rank  # home bounds of addresses
        # The maps are the authority on which address each slot holds: the pool's owner table is written from them
        # only when read (`_sync_owners`, by `check`), not per batch (a random write per miss). Slots claimed by the
        # pending plan's misses (free ones; victims' slots stay taken) count as held from its commit on.
        self._owners_stale = False
        self._pending_claims = 0
        self._checked = (None, [])  # the last batch checked and its home bounds

    def _refit_maps(self, old: int) -> None:
        self.maps = slot_map.fits(self.maps, self.slots, self.dense_limit)

    def check_fits(self, uniq: np.ndarray) -> list[int]:
        """Home bounds of the ascending batch `uniq`; CapacityError when a rank's remote entries exceed its buffer
        (checked before the policy plans, so that a refused batch changes nothing)."""
        if self._checked[0] is uniq:  # the facade checked this batch before the policy planned it
            return self._checked[1]
        bounds = np.searchsorted(uniq, self._cuts).tolist()
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
        be, R, uniq, pool = self.be, self.R, plan.addrs, self.pool
        bounds = self.check_fits(uniq)  # homes
        uix = self.space.index(uniq)
        h_counts, miss_idx, counts, rows = self.maps.remote(uniq, uix, bounds)
        miss_rank = np.repeat(np.arange(R, dtype=np.int64), counts)
        miss_addrs = uniq.take(miss_idx)  # grouped by rank, ascending within a rank
        pool.reserve(counts)  # any storage growth before positions are taken
        if self.log.stamps and self.log.stamps[-1] == plan.now:  # a batch of this stamp is logged: the victims'
            rows = None  # rows may be the batch's own, so its misses are inserted key by key after the drops
        elif miss_idx.size * FILL_MIN_MISSES_PER_ADDRESS < uniq.size:  # few misses (batch size 1, b300: most steps
            rows = None  # miss a handful): their cells are set at commit, not every row of the batch written back
        self.log.stamp(uix, plan.now)  # the batch's hits are no victims of this selection
        s0, f0 = pool.take_free(be, counts)
        self._pending_claims = int(f0.sum())
        rest = counts - f0
        writes = []
        if rest.any():
            got, found, writes = self.log.select(rest, self.maps)
            dest_idx = merge_by_rank([s0, got], [f0, found])
        else:
            dest_idx = s0
        self.log.append(uix, plan.now, h_counts + counts)
        dests = pool.places(dest_idx)
        # The fetch reads the entry where it is now (its CPU place if it is being promoted: the same bytes).
        src = old_places.take(miss_idx)
        plan.num_local_hits = int(h_counts.sum())
        plan.num_peer_fetches = int(miss_addrs.size)
        plan.peer_rows_per_rank = counts
        plan.move_src = np.concatenate([plan.move_src, src])
        plan.move_dst = np.concatenate([plan.move_dst, self.base + dests])
        if rows is not None:  # the batch's rows with the misses in (a copy: the maps change at commit)
            writes.append(self.maps.fill(uix, rows, miss_rank, miss_idx, dests - miss_rank * self.seg))
        plan.buffer_state = _BufState(miss_addrs, miss_idx, counts, miss_rank, dests, dest_idx, uix, writes,
                                      rows is not None)

    def commit(self, plan: Plan) -> None:
        st = plan.buffer_state
        # All ranks at once (each rank's row of the maps is its own): victims out, then the misses in (a rank's
        # victim is never one of its misses). The rows a plan read are unchanged until its commit (no access, alloc
        # or free runs in between) and the victims' rows are not the batch's (their last stamp is older), so both
        # are written back whole.
        for change in st.writes:  # loop over the batches the selection read, then this batch
            self.maps.write(change)
        if not st.fill:
            self.maps.set(st.miss_rank, st.miss_addrs, st.dests - st.miss_rank * self.seg, st.uix.take(st.miss_idx))
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
        self.maps.delete(r, addrs.take(i))  # their log entries are no candidates

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
        self.log.check(require, self.space.index(held))


__all__ = ["LocalBuffers"]
