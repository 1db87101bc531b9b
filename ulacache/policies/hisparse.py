"""HiSparse as SGLang implements it (DESIGN §1): per-request device buffers over a full CPU copy of the history.

Every token lives in the CPU pool (its place in the mapping). Each running request owns a GPU region of
`device_buffer_slots + 1` slots: an LRU buffer of D = device_buffer_slots token slots plus one slot for the newest
token, outside the LRU. Buffer entries are copies (duplicates) of CPU entries. Like SGLang's swap-in kernel
(`load_cache_to_device_buffer`), each request keeps an ordered LRU list of its slots (`lru[region]`, least recent
first); per access: hits keep their relative order and move to the MRU end, the misses take the least-recent
evictable slots and sit, in reverse order, just below the hits, the untouched evictable slots stay in front.
The j-th miss of a request (ascending address) gets the j-th evictable slot. While a request's history fits the
buffer (<= D + 1 tokens, token at position p in slot p) it takes the fast path: every reference hits, no IO, no LRU
update. Prefill KV is backed up whole to the host and each decode token once (counted as d2h rows of the next plan).
In TP mode SGLang replicates the history and the buffers on every rank: the cache tracks one replica and reports
every rank's (identical) transfers in the per-rank arrays.

Storage follows what is in use: LRU orders and device-buffer owners exist only for regions handed out (regions come
lowest first; RankRows rows per rank, grown x2), residency only for allocated addresses.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..address_space import AddressSpace
from ..errors import CapacityError, require
from ..plan import Plan
from ..pools import CpuPools, IdStack, RankRows, id_dtype, pad64


@dataclass
class _HsState:
    rows: np.ndarray  # regions whose LRU order changes
    new_order: np.ndarray
    miss_addrs: np.ndarray
    miss_slots: np.ndarray
    victims: np.ndarray


class HiSparsePolicy:
    name = "hisparse"
    exclusive = False

    def __init__(self, cfg, be):
        self.cfg, self.be = cfg, be
        self.tp = cfg.mode == "tp"
        self.replicas = cfg.num_ranks if self.tp else 1
        R = 1 if self.tp else cfg.num_ranks  # ranks tracked (one replica in TP)
        self.R = R
        self.D = D = cfg.device_buffer_slots
        self.regions_per_rank = cfg.gpu_slots // (D + 1)
        self.seg = pad64(cfg.gpu_slots)
        self.num_gpu_places = R * self.seg
        self.cpu = CpuPools(R, cfg.cpu_slots, base=self.num_gpu_places)
        self.num_places = self.num_gpu_places + self.cpu.num_places
        self.space = AddressSpace(R, cfg.cpu_slots, self.num_places, track_requests=True)
        self.regions = [IdStack(r * self.regions_per_rank, (r + 1) * self.regions_per_rank) for r in range(R)]
        self.regrows = RankRows(R, self.regions_per_rank, self.regions_per_rank, floor=8)  # region -> LRU storage row
        self.grows = RankRows(R, self.seg, self.seg)  # GPU place -> gowner storage position
        self.lru = np.zeros((0, D), dtype=np.int32)
        # by address storage: slot of a resident copy within its request's region (0..D), -1 none (int16 while D
        # fits: the place is the region's base + that slot); by GPU storage: the address held (int32 if it fits)
        self.slot_of = np.zeros(0, dtype=np.int16 if D < 2**15 - 1 else np.int32)
        self.gowner = np.zeros(0, dtype=id_dtype(self.space.size))
        self.space.listeners.append(self._grow_space)
        self.region_of = np.full(16, -1, dtype=np.int64)  # by request index
        self.hist_len = np.zeros(16, dtype=np.int64)
        self.newest = np.full(16, -1, dtype=np.int64)
        self.step = 0
        self.pending_d2h = np.zeros(R, dtype=np.int64)
        self.gpu_seg = self.seg
        self.alloc_moves = None  # (src, dst) GPU places whose bytes the last alloc moved (newest -> LRU slot)

    def _grow_space(self, old: int) -> None:
        self.slot_of = self.space.rows.relayout(self.slot_of, old, -1)

    def _grow_regions(self, regions: np.ndarray) -> None:
        """Storage for the LRU orders and device-buffer slots of newly claimed regions."""
        local = regions % self.regions_per_rank
        need = int(local.max()) + 1
        if need > self.regrows.cap:
            old = self.regrows.grow(need)
            self.lru = self.regrows.relayout(self.lru, old, 0)
            self.lru.reshape(self.R, self.regrows.cap, self.D)[:, old:] = np.arange(self.D, dtype=np.int32)
        need = need * (self.D + 1)
        if need > self.grows.cap:
            old = self.grows.grow(need)
            self.gowner = self.grows.relayout(self.gowner, old, -1)

    def _g(self, places: np.ndarray) -> np.ndarray:
        return self.grows.index(places)

    def resident_places(self, addrs: np.ndarray) -> np.ndarray:
        """GPU place of each allocated address's device-buffer copy, -1 where it has none."""
        ix = self.space.index(addrs)
        local = self.slot_of[ix].astype(np.int64)
        base = self.region_base(self.region_of[self.space.req_of[ix]])
        return np.where(local >= 0, base + local, -1)

    def _set_resident(self, ix: np.ndarray, places: np.ndarray) -> None:
        """Record copies at GPU places (stored as the slot within the region: place % seg % (D + 1))."""
        self.slot_of[ix] = places % self.seg % (self.D + 1)

    def region_base(self, regions: np.ndarray) -> np.ndarray:
        rank = regions // self.regions_per_rank
        return rank * self.seg + (regions % self.regions_per_rank) * (self.D + 1)

    # -- capacity ------------------------------------------------------------------------------------------------------
    def _per_rank(self, x: np.ndarray) -> np.ndarray:
        return np.repeat(x, self.replicas) if self.tp else x

    def free_slots(self) -> tuple[np.ndarray, np.ndarray]:
        g = np.array([len(s) for s in self.regions], dtype=np.int64) * (self.D + 1)
        return self._per_rank(g), self._per_rank(self.cpu.num_free())

    def capacity(self) -> tuple[np.ndarray, np.ndarray]:
        n = self.cfg.num_ranks
        return np.full(n, self.regions_per_rank * (self.D + 1), np.int64), np.full(n, self.cfg.cpu_slots, np.int64)

    def held_rows(self) -> tuple[int, int]:
        """(GPU copies, CPU entries) over every rank (TP: each rank holds a replica)."""
        return int((self.gowner >= 0).sum()) * self.replicas, int(self.space.num_allocated) * self.replicas

    def _grow(self, n: int) -> None:
        if n > self.region_of.size:
            size = max(n, 2 * self.region_of.size)
            for name, fill in (("region_of", -1), ("hist_len", 0), ("newest", -1)):
                old = getattr(self, name)
                new = np.full(size, fill, dtype=np.int64)
                new[: old.size] = old
                setattr(self, name, new)

    # -- allocation ----------------------------------------------------------------------------------------------------
    def alloc_many(self, request_ids, counts, ranks, tp):
        space, R, D = self.space, self.R, self.D
        ranks = np.zeros_like(ranks) if self.tp else ranks
        reqs = [space.request(rid, int(r)) for rid, r in zip(request_ids, ranks.tolist())]
        new = np.array([rid not in space.requests for rid in request_ids], dtype=bool)
        need_cpu = np.bincount(ranks, weights=counts, minlength=R).astype(np.int64)
        need_reg = np.bincount(ranks[new], minlength=R)
        cfree = self.cpu.num_free()
        for r in range(R):  # loop over ranks: all checks before any change
            if need_reg[r] > len(self.regions[r]):
                raise CapacityError(f"no free hisparse device buffer on rank {r} for {int(need_reg[r])} new requests")
            if need_cpu[r] > cfree[r]:
                raise CapacityError(f"cannot allocate {int(need_cpu[r])} tokens on rank {r}: {int(cfree[r])} CPU slots free")
        n = int(counts.sum())
        tok_rank = np.repeat(ranks, counts)
        addrs = np.empty(n, dtype=np.int64)
        places = np.empty(n, dtype=np.int64)
        space.reserve(need_cpu)  # one re-layout of the address tables for every rank that grows
        for r in range(R):  # loop over ranks
            idx = np.flatnonzero(tok_rank == r)
            addrs[idx] = space.pop_ids(r, idx.size)
            places[idx] = self.cpu.free[r].pop(idx.size)
            self.pending_d2h[r] += idx.size  # prefill backed up whole, each decode token once
        space.set_places(addrs, places)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for i, rid in enumerate(request_ids):  # loop over requests (bookkeeping only)
            space.register(rid, reqs[i], addrs[offsets[i]:offsets[i + 1]])
        idx = np.array([q.index for q in reqs], dtype=np.int64)
        self._grow(int(idx.max()) + 1 if idx.size else 0)
        for i in np.flatnonzero(new).tolist():  # loop over new requests: claim a device buffer
            self.region_of[idx[i]] = int(self.regions[int(ranks[i])].pop(1)[0])
            self._grow_regions(self.region_of[idx[i]: idx[i] + 1])
            base = int(self.region_base(self.region_of[idx[i]: idx[i] + 1])[0])
            self.lru[self.regrows.index(self.region_of[idx[i]])] = np.arange(D, dtype=np.int32)
            self.gowner[self._g(np.arange(base, base + D + 1))] = -1
        # Residency (the fast-path layout): the previous newest token and every new token but the last take LRU slot
        # `position` while position < D; the last new token takes the newest-token slot. Only <= D tokens per
        # request are touched, whatever the prefill length.
        has = counts > 0
        idx, cnt, first = idx[has], counts[has], offsets[:-1][has]
        base = self.region_base(self.region_of[idx])
        old_len, old_newest = self.hist_len[idx], self.newest[idx]
        prev = np.flatnonzero(old_len > 0)
        p_addr, p_slot = old_newest[prev], base[prev] + old_len[prev] - 1
        p_keep = np.flatnonzero(old_len[prev] - 1 < D)
        ix = space.index
        moved_src = self.resident_places(p_addr[p_keep])
        self.slot_of[ix(p_addr)] = -1
        self._set_resident(ix(p_addr[p_keep]), p_slot[p_keep])
        self.gowner[self._g(p_slot[p_keep])] = p_addr[p_keep]
        self.alloc_moves = (moved_src, p_slot[p_keep])  # newest slot -> LRU slot: the bytes move inside HBM
        fill = np.clip(np.minimum(old_len + cnt - 1, D) - old_len, 0, None)
        rep = np.repeat(np.arange(idx.size), fill)
        j = np.arange(rep.size) - np.repeat(np.cumsum(fill) - fill, fill)
        t_addr, t_slot = addrs[first[rep] + j], base[rep] + old_len[rep] + j
        self._set_resident(ix(t_addr), t_slot)
        self.gowner[self._g(t_slot)] = t_addr
        self.newest[idx] = addrs[first + cnt - 1]
        self.slot_of[ix(self.newest[idx])] = D
        self.gowner[self._g(base + D)] = self.newest[idx]
        self.hist_len[idx] = old_len + cnt
        return addrs

    # -- access --------------------------------------------------------------------------------------------------------
    def access(self, plan: Plan, places: np.ndarray) -> None:
        be, D, space = self.be, self.D, self.space
        uniq = plan.addrs
        uix = space.index(uniq)
        local = be.to_numpy(be.gather(be.asarray(self.slot_of), be.asarray(uix)))  # slot in the region, -1 none
        hit = local >= 0
        req = space.req_of[uix].astype(np.int64)
        miss_idx = np.flatnonzero(~hit)  # flatnonzero + take: much faster than boolean-mask indexing
        miss_addrs, miss_req = uniq.take(miss_idx), req.take(miss_idx)
        plan.num_hits, plan.num_misses = int(uniq.size - miss_idx.size), int(miss_idx.size)
        lru_hit = hit & (local != D) & (self.hist_len[req] > D + 1)  # fast path: no update
        lru_hit_idx = np.flatnonzero(lru_hit)
        miss_region = self.region_of[miss_req]
        lrow = self.regrows.index
        touched = np.zeros(self.lru.shape[0], dtype=bool)  # LRU rows whose order changes (ascending = by region)
        touched[lrow(self.region_of[req.take(lru_hit_idx)])] = True
        touched[lrow(miss_region)] = True
        rows = np.flatnonzero(touched)
        new_order, miss_slots, victims = self.lru[rows], np.zeros(0, np.int64), np.zeros(0, np.int64)
        if rows.size:
            row_of_region = np.full(self.lru.shape[0], -1, dtype=np.int64)
            row_of_region[rows] = np.arange(rows.size)
            base = self.region_base(self.regrows.ids(rows))
            hitmark = np.zeros(self.gowner.size, dtype=bool)
            hit_req = req.take(lru_hit_idx)
            hitmark[self._g(self.region_base(self.region_of[hit_req]) + local.take(lru_hit_idx))] = True
            order = self.lru[rows]
            slots2d = base[:, None] + order
            H = hitmark[self._g(slots2d)]
            miss_row = row_of_region[lrow(miss_region)]
            m = np.bincount(miss_row, minlength=rows.size)
            htot = H.sum(axis=1)
            if (m + htot > D).any():
                bad = int(np.flatnonzero(m + htot > D)[0])
                raise CapacityError(
                    f"a hisparse request selects {int(m[bad] + htot[bad])} distinct non-newest tokens in one batch; "
                    f"its device buffer holds {D}"
                )
            e_idx = np.cumsum(~H, axis=1, dtype=np.int32) - 1
            h_idx = np.cumsum(H, axis=1, dtype=np.int32) - 1
            mm, ht = m[:, None], htot[:, None]
            front = D - ht - mm
            newpos = np.where(H, D - ht + h_idx, np.where(e_idx < mm, front + (mm - 1 - e_idx), e_idx - mm))
            new_order = np.empty_like(order)
            np.put_along_axis(new_order, newpos, order, axis=1)
            take = ~H & (e_idx < mm)
            miss_slots = slots2d.ravel().take(np.flatnonzero(take.ravel()))  # by row, least recent first
            miss_addrs = miss_addrs.take(np.argsort(miss_row, kind="stable"))
            victims = self.gowner[self._g(miss_slots)]
        rep = self.replicas
        plan.num_exchanges = 0
        h2d = np.bincount(space.home(miss_addrs), minlength=self.R).astype(np.int64)
        plan.h2d_rows_per_rank = self._per_rank(h2d) if self.tp else h2d
        plan.d2h_rows_per_rank = self._per_rank(self.pending_d2h.copy()) if rep > 1 else self.pending_d2h.copy()
        plan.move_src = space.places(miss_addrs)
        plan.move_dst = miss_slots
        plan.policy_state = _HsState(rows, new_order.astype(np.int32), miss_addrs, miss_slots, victims)

    def commit(self, plan: Plan) -> None:
        st = plan.policy_state
        self.lru[st.rows] = st.new_order
        ix = self.space.index
        self.slot_of[ix(st.victims[st.victims >= 0])] = -1
        self._set_resident(ix(st.miss_addrs), st.miss_slots)
        self.gowner[self._g(st.miss_slots)] = st.miss_addrs
        self.pending_d2h[:] = 0
        self.step = plan.now

    # -- free ----------------------------------------------------------------------------------------------------------
    def free(self, request_id: int) -> np.ndarray:
        space = self.space
        req = space.requests[request_id]
        addrs = req.addresses()
        region = int(self.region_of[req.index])
        base = int(self.region_base(np.array([region]))[0])
        self.slot_of[space.index(addrs)] = -1
        self.gowner[self._g(np.arange(base, base + self.D + 1))] = -1
        self.lru[self.regrows.index(region)] = np.arange(self.D, dtype=np.int32)
        self.regions[region // self.regions_per_rank].push(np.array([region], dtype=np.int64))
        self.region_of[req.index], self.hist_len[req.index], self.newest[req.index] = -1, 0, -1
        self.cpu.release(space.places(addrs).astype(np.int64))
        space.release(request_id)
        return addrs

    # -- checks --------------------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        space, cfg, D = self.space, self.cfg, self.D
        alloc = space.allocated()
        places = space.places(alloc).astype(np.int64)
        require(alloc.size == space.num_allocated, "allocated count drifted")
        require(np.unique(places).size == places.size, "a CPU place is claimed by two logical addresses")
        require((places >= self.num_gpu_places).all() and (places < self.num_places).all(), "hisparse entry not on CPU")
        require((self.cpu.rank_of(places) == space.home(alloc)).all(), "CPU entry outside its home rank")
        ccount = np.bincount(self.cpu.rank_of(places), minlength=self.R)
        require((self.cpu.num_free() + ccount == cfg.cpu_slots).all(), "CPU free count not conserved")
        res = space.rows.ids(np.flatnonzero(self.slot_of >= 0))
        res_slot = self.resident_places(res)
        require((space.places(res) >= 0).all(), "a freed address is still resident")
        require((self.gowner[self._g(res_slot)] == res).all(), "device buffer owner disagrees with residency")
        require(int((self.gowner >= 0).sum()) == res.size, "device buffer slot owned by a non-resident address")
        rg = self.region_of[space.req_of[space.index(res)]]
        local = res_slot - self.region_base(rg)
        require(((local >= 0) & (local <= D)).all(), "a copy sits outside its request's device buffer")
        used = np.flatnonzero(self.region_of >= 0)
        require(np.unique(self.region_of[used]).size == used.size, "two requests share a device buffer")
        nregions = sum(len(s) for s in self.regions) + used.size
        require(nregions == self.R * self.regions_per_rank, "device buffers not conserved")
        srt = np.sort(self.lru, axis=1)
        require((srt == np.arange(D)).all(), "an LRU order is not a permutation of the buffer's slots")
        used = used[self.hist_len[used] > 0]  # a request allocated with 0 tokens has no newest token yet
        newest = self.newest[used]
        require((self.resident_places(newest) == self.region_base(self.region_of[used]) + D).all(), "newest token not resident")


__all__ = ["HiSparsePolicy"]
