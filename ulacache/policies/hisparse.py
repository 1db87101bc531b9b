"""HiSparse as SGLang implements it (docs/architecture.md): per-request device buffers over a full CPU copy of the history.

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
lowest first; RankRows rows per rank, grown x2), residency only for allocated addresses. Each allocated address has
one key, `(request index << SH) | (slot + 1)` (low bits 0: no copy), so one gather of the batch gives both its
requests and its slots, and a batch of one request (batch size 1) is told by the key range alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..address_space import AddressSpace
from ..errors import CapacityError
from ..plan import Plan
from ..pools import CpuPools
from ..rows import IdStack, RankRows, id_dtype, pad64
from .hisparse_checks import check_hisparse


@dataclass
class _HsState:
    rows: np.ndarray  # LRU storage rows whose order changes (ascending)
    new_order: np.ndarray  # their new orders, flat (rows.size * D)
    miss_addrs: np.ndarray  # by row, ascending address within a row
    miss_ix: np.ndarray  # their address storage positions
    miss_local: np.ndarray  # the slot each takes within its region
    miss_cell: np.ndarray  # its cell in the flat buffer-owner table
    miss_slots: np.ndarray  # its GPU place
    victims: np.ndarray  # address whose copy each miss replaces (-1 none)
    miss_key: np.ndarray  # each miss's key once resident
    victim_key: object  # each victim's key once dropped (its request, no slot): array by miss, or one int
    victim_shift: int | None = None  # storage position - address of every victim (one request's batch), else None


_NO_MOVES = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # alloc_moves when no bytes move (read-only use)


class HiSparsePolicy:
    name = "hisparse"
    exclusive = False
    exact_lru = False  # no shared GPU pool in LRU order: each request's buffer is an LRU of its own

    # -- what a configuration holds (class-level: asked by callers sizing a cache before building one) -------------
    @classmethod
    def check_config(cls, cfg) -> None:
        """A full CPU copy, and a GPU pool of at least one request buffer."""
        if cfg.cpu_slots < 1:
            raise ValueError("CacheConfig.cpu_slots must be >= 1 for policy 'hisparse' (it keeps a full CPU copy)")
        if cfg.gpu_slots < cfg.device_buffer_slots + 1:
            raise ValueError(
                f"CacheConfig.gpu_slots ({cfg.gpu_slots}) must hold at least one hisparse request buffer "
                f"(device_buffer_slots + 1 = {cfg.device_buffer_slots + 1})"
            )

    @classmethod
    def address_slots_per_rank(cls, cfg) -> int:
        """Addresses of one rank: every entry lives in the CPU pool (the GPU holds copies)."""
        return cfg.cpu_slots

    @classmethod
    def gpu_history_slots(cls, cfg) -> float:
        """inf: the tiers do not split the history (the whole of it is on the CPU, the GPU buffers are copies)."""
        return math.inf

    @classmethod
    def local_buffer_slots(cls, cfg) -> int:
        """0: no TP local buffer (TP replicates the history and the buffers on every rank)."""
        return 0

    @classmethod
    def gpu_copy_slots(cls, cfg) -> int:
        """GPU copies of entries a cache holds at most over all ranks: every rank's request buffers."""
        return cfg.num_ranks * cfg.gpu_slots

    @classmethod
    def ranks_per_request(cls, cfg) -> int:
        """1: a request's history is on one rank (DP) or replicated whole on each (TP: one replica tracked)."""
        return 1

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
        self.space = AddressSpace(R, cfg.cpu_slots, self.num_places)
        self.regions = [IdStack(r * self.regions_per_rank, (r + 1) * self.regions_per_rank) for r in range(R)]
        self.regrows = RankRows(R, self.regions_per_rank, self.regions_per_rank, floor=1)  # region -> storage row
        # By region storage row: the LRU order of the D buffer slots (least recent first), the address held in each
        # of the D + 1 slots (-1 none; slot D = the newest token) and the GPU place of slot 0.
        slot_dtype = np.int16 if D < 2**15 - 1 else np.int32
        self.lru = np.zeros((0, D), dtype=slot_dtype)
        self.gowner = np.zeros((0, D + 1), dtype=id_dtype(self.space.size))
        self.row_base = np.zeros(0, dtype=np.int64)
        # by address storage: key = (request index << SH) | (slot of its copy within the region + 1, 0 none), -1
        # unallocated; int32 until a request index needs more (widened then, once)
        self.SH = int(D + 1).bit_length()
        self.MASK = (1 << self.SH) - 1
        self.key_of = np.zeros(0, dtype=np.int32)
        self._kmax = np.iinfo(np.int32).max - self.MASK  # the largest request key key_of holds
        self.space.listeners.append(self._grow_space)
        # by request index: region, its storage row, that row again while the LRU order is live (history > D + 1,
        # else -1: the fast path), history length, newest token
        self.region_of = np.full(16, -1, dtype=np.int64)
        self.row_of = np.full(16, -1, dtype=np.int64)
        self.lrow_of = np.full(16, -1, dtype=np.int64)
        self.hist_len = np.zeros(16, dtype=np.int64)
        self.newest = np.full(16, -1, dtype=np.int64)
        self.step = 0
        self.pending_d2h = np.zeros(R, dtype=np.int64)
        self.gpu_seg = self.seg
        self.alloc_moves = None  # (src, dst) GPU places whose bytes the last alloc moved (newest -> LRU slot)

    def _grow_space(self, old: int) -> None:
        self.key_of = self.space.rows.relayout(self.key_of, old, -1)

    def _grow_regions(self, region: int) -> None:
        """Storage rows up to a newly claimed region (LRU orders, owners, bases); live requests' rows re-mapped."""
        need = region % self.regions_per_rank + 1
        if need <= self.regrows.cap:
            return
        old = self.regrows.grow(need)
        self.lru = self.regrows.relayout(self.lru, old, 0)
        self.lru.reshape(self.R, self.regrows.cap, self.D)[:, old:] = np.arange(self.D, dtype=self.lru.dtype)
        self.gowner = self.regrows.relayout(self.gowner, old, -1)
        self.row_base = self.region_base(self.regrows.ids(np.arange(self.lru.shape[0], dtype=np.int64)))
        live = np.flatnonzero(self.region_of >= 0)
        self.row_of[live] = self.regrows.index(self.region_of[live])
        self.lrow_of[live] = np.where(self.lrow_of[live] >= 0, self.row_of[live], -1)

    def resident_places(self, addrs: np.ndarray) -> np.ndarray:
        """GPU place of each allocated address's device-buffer copy, -1 where it has none."""
        key = self.key_of[self.space.index(addrs)].astype(np.int64)
        s1 = key & self.MASK
        base = self.row_base[self.row_of[key >> self.SH]]
        return np.where(s1 > 0, base + s1 - 1, -1)

    def _qkey(self, q: int) -> int:
        """Key of request index q with no slot; widens the key table first when q needs it."""
        k = q << self.SH
        if k > self._kmax:
            self.key_of = self.key_of.astype(np.int64)
            self._kmax = np.iinfo(np.int64).max - self.MASK
        return k

    def region_base(self, regions: np.ndarray) -> np.ndarray:
        rank = regions // self.regions_per_rank
        return rank * self.seg + (regions % self.regions_per_rank) * (self.D + 1)

    def buffer_contents(self, request_id: int) -> tuple[np.ndarray, int]:
        """(addresses in the request's LRU slots, least recent first, -1 empty; the newest token's address)."""
        row = int(self.row_of[self.space.requests[request_id].index])
        own = self.gowner[row]
        return own[self.lru[row]].astype(np.int64), int(own[self.D])

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
            for name, fill in (("region_of", -1), ("row_of", -1), ("lrow_of", -1), ("hist_len", 0), ("newest", -1)):
                old = getattr(self, name)
                new = np.full(size, fill, dtype=np.int64)
                new[: old.size] = old
                setattr(self, name, new)

    # -- allocation ----------------------------------------------------------------------------------------------------
    def alloc_many(self, request_ids, counts, ranks, tp):
        """Per-token work: the ids and CPU places popped and recorded; the buffer layout touches <= D + 1 tokens per
        request and one rank's free lists only when it allocates."""
        space = self.space
        rk = [0] * len(request_ids) if self.tp else ranks.tolist()
        cnt = counts.tolist()
        if len(cnt) == 1:  # one request (batch size 1): scalars throughout
            return self._alloc_one(request_ids[0], cnt[0], rk[0])
        reqs = [space.request(rid, r) for rid, r in zip(request_ids, rk)]
        new = [rid not in space.requests for rid in request_ids]
        need_cpu, need_reg = np.zeros(self.R, dtype=np.int64), {}
        for r, c, nw in zip(rk, cnt, new):  # loop over requests (a batch's few)
            need_cpu[r] += c
            need_reg[r] = need_reg.get(r, 0) + nw
        for r in sorted(set(rk)):  # loop over the ranks allocating: all checks before any change
            self._check_room(r, need_reg[r], int(need_cpu[r]))
        addrs, places = self._pop(rk, cnt, need_cpu)
        offsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
        for i, rid in enumerate(request_ids):  # loop over requests (bookkeeping only)
            space.register(rid, reqs[i], addrs[offsets[i]:offsets[i + 1]])
        qix = [q.index for q in reqs]
        self._grow(max(qix) + 1 if qix else 0)
        for i in (i for i, nw in enumerate(new) if nw):  # loop over new requests: claim a device buffer
            self._claim(qix[i], rk[i])
        has = [i for i, c in enumerate(cnt) if c > 0]
        self.alloc_moves = _NO_MOVES
        if has:
            self._place_new(np.array([qix[i] for i in has], dtype=np.int64), counts.take(has),
                            np.array([offsets[i] for i in has], dtype=np.int64), addrs)
        return addrs

    def alloc_one(self, rid: int, count: int, rank: int, tp: bool) -> np.ndarray:
        """`alloc_many` of one request (the facade's `alloc`): no per-request lists."""
        return self._alloc_one(rid, count, 0 if self.tp else rank)

    def _check_room(self, r: int, new_requests: int, tokens: int) -> None:
        if new_requests > len(self.regions[r]):
            raise CapacityError(f"no free hisparse device buffer on rank {r} for {new_requests} new requests")
        free = len(self.cpu.free[r])
        if tokens > free:
            raise CapacityError(f"cannot allocate {tokens} tokens on rank {r}: {free} CPU slots free")

    def _alloc_one(self, rid: int, c: int, r: int) -> np.ndarray:
        """alloc_many of one request: c tokens on rank r (what alloc_many does, without per-request arrays)."""
        space = self.space
        req = space.requests.get(rid)
        if c == 1 and req is not None and int(self.hist_len[req.index]) > self.D:
            return self._decode_one(rid, req, r)
        req = space.request(rid, r)
        new = rid not in space.requests
        self._check_room(r, int(new), c)
        if c == 1:  # a decode token: scalars (the same id and CPU slot as pop_ids / pop)
            addrs = np.array([self._pop_token(r)[0]], dtype=np.int64)
        elif c:
            addrs = space.pop_ids(r, c)
            space.set_places(addrs, self.cpu.free[r].pop(c))
            self.pending_d2h[r] += c  # prefill backed up whole, each decode token once
        else:
            addrs = np.zeros(0, np.int64)
        space.register(rid, req, addrs)
        q = req.index
        self._grow(q + 1)
        if new:
            self._claim(q, r)
        self.alloc_moves = _NO_MOVES
        if not c:
            return addrs
        D, qk = self.D, self._qkey(q)
        old_len, row, old_newest = int(self.hist_len[q]), int(self.row_of[q]), int(self.newest[q])
        aix = space.index(addrs)
        if c > 1:
            self.key_of[aix] = qk  # new tokens hold no copy (but those the fill or the newest slot gives one)
        if old_len > D:  # history past its buffer (decode): the previous newest just drops out
            self.key_of[space.index(self.gowner[row, D:])] = qk
            self.lrow_of[q] = row
        else:
            one = np.array([q], dtype=np.int64)
            self._fill_buffers(one, np.array([c]), np.zeros(1, np.int64), addrs, np.array([old_len]), np.array([row]),
                               np.array([old_newest]), np.array([qk], dtype=np.int64))
            self.lrow_of[q] = row if old_len + c > D + 1 else -1
        self.key_of[aix[-1]] = qk + D + 1
        self.gowner[row, D] = addrs[-1]
        self.newest[q] = addrs[-1]
        self.hist_len[q] = old_len + c
        return addrs

    def _pop_token(self, r: int) -> tuple[int, int]:
        """One decode token's address on rank r and its storage position, placed in a CPU slot (backed up once): the
        same id and slot as pop_ids / pop, as ints."""
        space = self.space
        a = space.pop_one(r)
        a_ix = space.index_one(a)
        space.table[a_ix] = self.cpu.free[r].pop_few(1)[0]
        self.pending_d2h[r] += 1
        return a, a_ix

    def _decode_one(self, rid: int, req, r: int) -> np.ndarray:
        """`_alloc_one` of a decode token of a running request past its buffer (every step of a long request): its
        newest-token slot takes the token, the previous newest drops out (keeps no copy); scalars only."""
        space = self.space
        self._check_room(r, 0, 1)
        a, a_ix = self._pop_token(r)
        space.register_one(rid, req, a)
        self.alloc_moves = _NO_MOVES
        q, D = req.index, self.D
        qk, row = self._qkey(q), int(self.row_of[q])
        prev = int(self.gowner[row, D])
        self.key_of[space.index_one(prev) if prev >= 0 else space.index(self.gowner[row, D:])] = qk
        self.lrow_of[q] = row
        self.key_of[a_ix] = qk + D + 1
        self.gowner[row, D] = a
        self.newest[q] = a
        self.hist_len[q] += 1
        return np.array([a], dtype=np.int64)

    def _pop(self, rk: list, cnt: list, need: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Addresses and CPU places of the new tokens, in request order (each rank's popped in request order)."""
        space = self.space
        used = [r for r in range(self.R) if need[r]]
        if not used:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if len(used) > 1:
            space.reserve(need)  # one re-layout of the address tables for every rank that grows (one rank: pop_ids)
        got = {}
        for r in used:  # loop over the ranks allocating
            n = int(need[r])
            got[r] = (space.pop_ids(r, n), self.cpu.free[r].pop(n))
            self.pending_d2h[r] += n  # prefill backed up whole, each decode token once
        if len(used) == 1:
            addrs, places = got[used[0]]
        else:
            at = dict.fromkeys(used, 0)
            parts = []
            for r, c in zip(rk, cnt):  # loop over requests: their slice of their rank's tokens
                if c:
                    parts.append((r, at[r], at[r] + c))
                    at[r] += c
            addrs = np.concatenate([got[r][0][a:b] for r, a, b in parts])
            places = np.concatenate([got[r][1][a:b] for r, a, b in parts])
        space.set_places(addrs, places)
        return addrs, places

    def _claim(self, q: int, rank: int) -> None:
        """Give request index q a free device buffer (region) of its rank, empty, in LRU order 0..D-1."""
        region = int(self.regions[rank].pop(1)[0])
        self._grow_regions(region)
        row = int(self.regrows.index(np.array([region]))[0])
        self.region_of[q], self.row_of[q], self.lrow_of[q] = region, row, -1
        self.lru[row] = np.arange(self.D, dtype=self.lru.dtype)
        self.gowner[row] = -1

    def _place_new(self, q: np.ndarray, cnt: np.ndarray, first: np.ndarray, addrs: np.ndarray) -> None:
        """Residency (the fast-path layout): the previous newest token and every new token but the last take LRU
        slot `position` while position < D; the last new token takes the newest-token slot D."""
        D, ix = self.D, self.space.index
        self._qkey(int(q.max()))  # the key table widened for the largest request index
        qk = q << self.SH
        old_len, rows, old_newest = self.hist_len[q], self.row_of[q], self.newest[q]
        new_len = old_len + cnt
        last = addrs[first + cnt - 1]
        self.key_of[ix(addrs)] = np.repeat(qk, cnt)  # new tokens hold no copy (but as placed below)
        if int(old_len.min()) > D:  # every history is past its buffer (decode): the previous newest just drops out
            self.key_of[ix(old_newest)] = qk
            self.lrow_of[q] = rows
        else:
            self._fill_buffers(q, cnt, first, addrs, old_len, rows, old_newest, qk)
            self.lrow_of[q] = np.where(new_len > D + 1, rows, -1)
        self.key_of[ix(last)] = qk + D + 1
        self.gowner.reshape(-1)[rows * (D + 1) + D] = last
        self.newest[q] = last
        self.hist_len[q] = new_len

    def _fill_buffers(self, q, cnt, first, addrs, old_len, rows, old_newest, qk) -> None:
        """Histories still filling their buffer: the previous newest moves to LRU slot old_len - 1 (< D, its bytes
        move inside HBM) or drops out; new tokens but the last take LRU slots old_len.. while below D."""
        D, ix = self.D, self.space.index
        prev = np.flatnonzero(old_len > 0)
        if prev.size:
            p_addr, p_slot = old_newest[prev], old_len[prev] - 1
            keep = np.flatnonzero(p_slot < D)
            if keep.size:
                k_addr, k_slot, k_row = p_addr[keep], p_slot[keep], rows[prev[keep]]
                self.alloc_moves = (self.resident_places(k_addr), self.row_base[k_row] + k_slot)
                self.gowner.reshape(-1)[k_row * (D + 1) + k_slot] = k_addr
            self.key_of[ix(p_addr)] = qk[prev] + np.where(p_slot < D, p_slot + 1, 0)
        fill = np.minimum(old_len + cnt - 1, D) - old_len  # new tokens (not the last) that take LRU slots
        if (fill > 0).any():
            fill = np.maximum(fill, 0)
            rep = np.repeat(np.arange(q.size), fill)
            j = np.arange(rep.size) - np.repeat(np.cumsum(fill) - fill, fill)
            t_addr, t_slot = addrs[first[rep] + j], old_len[rep] + j
            self.key_of[ix(t_addr)] = qk[rep] + t_slot + 1
            self.gowner.reshape(-1)[rows[rep] * (D + 1) + t_slot] = t_addr

    # -- access --------------------------------------------------------------------------------------------------------
    def access(self, plan: Plan, places: np.ndarray, ix: np.ndarray | None = None) -> None:
        """Hits, misses and each touched request's new LRU order. Work: the batch, plus D per request whose order
        changes (its order is rebuilt whole, a few vectorized passes over all such requests at once). `ix`: the
        addresses' storage positions, which the facade computed to translate them (else computed here)."""
        space = self.space
        uniq = plan.addrs
        uix = space.index(uniq) if ix is None else ix
        # request << SH | slot + 1; take: no fancy-index set-up (~2x faster on a 2048-address batch). On the host for
        # every backend: a device backend's gather copied the whole storage-sized table over per access (as
        # translate did), for a batch-sized result
        key = self.key_of.take(uix)
        if uniq.size and int(key[0]) >> self.SH == int(key[-1]) >> self.SH:  # maybe one request's tokens
            q = int(key.min()) >> self.SH
            if q == int(key.max()) >> self.SH:  # one request's tokens (batch size 1)
                return self._access_one(plan, places, uix, key, q)
        req = key >> self.SH
        local = (key & self.MASK) - 1  # slot in the region, -1 none
        self._access_many(plan, places, uix, key, req, local)

    def _access_many(self, plan, places, uix, key, req, local) -> None:
        D, uniq = self.D, plan.addrs
        lrow = self.lrow_of.take(req)  # -1: fast path (no LRU update)
        miss_idx = np.flatnonzero(local < 0)
        plan.num_hits, plan.num_misses = int(uniq.size - miss_idx.size), int(miss_idx.size)
        hit_idx = np.flatnonzero((local.view(f"u{local.itemsize}") < D) & (lrow >= 0))  # LRU hits (not the newest)
        hit_row, miss_row = lrow.take(hit_idx), self.row_of.take(req.take(miss_idx))
        nrows = self.lru.shape[0]
        m = np.bincount(miss_row, minlength=nrows)
        mh = m + np.bincount(hit_row, minlength=nrows)  # per LRU row: distinct non-newest tokens selected
        rows = np.flatnonzero(mh)  # the orders that change
        st = self._empty_state(rows, uniq)
        move_src = places[:0]
        if rows.size:
            if int(mh.max()) > D:
                self._too_many(int(mh[np.flatnonzero(mh > D)[0]]))
            mr = m.take(rows)
            hit_local = local.take(hit_idx)
            if rows.size == 1:  # one request's order changes: no per-row bookkeeping
                perm, mrow = miss_idx, rows
                hit_key = hit_local
            else:
                kmap = np.cumsum(mh > 0) - 1  # storage row -> position among the touched rows
                perm = miss_idx.take(np.argsort(miss_row, kind="stable"))  # misses by (row, address)
                mrow = np.repeat(rows, mr)
                hit_key = kmap.take(hit_row) * D + hit_local
            st.new_order, st.miss_local = self._reorder(rows, mr, mh.take(rows) - mr, hit_key)
            st.miss_addrs, st.miss_ix, move_src = uniq.take(perm), uix.take(perm), places.take(perm)
            st.miss_cell = mrow * (D + 1) + st.miss_local
            st.miss_slots = self.row_base.take(mrow) + st.miss_local
            st.victims = self.gowner.reshape(-1).take(st.miss_cell)
            st.victim_key = key.take(perm)  # a miss's key has no slot: its request's; its victim is of that request
            st.miss_key = st.victim_key + st.miss_local + 1
        h2d = np.bincount(self.space.home(st.miss_addrs), minlength=self.R).astype(np.int64)
        self._finish(plan, st, h2d, move_src)

    def _access_one(self, plan, places, uix, key, q: int) -> None:
        """`access` of a batch of one request's tokens: scalars for the request, one LRU row reordered. Index arrays
        are intp (no cast inside the scatters and gathers); the misses' slots are the first m evictable ones."""
        D, uniq = self.D, plan.addrs
        row, lrow, qk = int(self.row_of[q]), int(self.lrow_of[q]), q << self.SH
        s1 = np.subtract(key, qk, dtype=np.intp)  # slot in the region + 1 (0 none, D + 1 the newest token)
        miss_idx = (s1 == 0).nonzero()[0]
        m = miss_idx.size
        plan.num_hits, plan.num_misses = int(uniq.size - m), m
        h = 0
        if lrow >= 0:  # the LRU order is live: hit slots flagged, by slot
            flag = np.zeros(D + 2, dtype=bool)
            flag[s1] = True
            flag = flag[1:D + 1]
            h = int(np.count_nonzero(flag))
        if not m + h:
            st = self._empty_state(np.zeros(0, np.int64), uniq)
            return self._finish(plan, st, np.zeros(self.R, np.int64), places[:0])
        if m + h > D:
            self._too_many(m + h)
        order = self.lru[row]  # slots, least recent first
        if h:
            hit = flag.take(order)  # by LRU position
            ev, hs = order[~hit], order[hit]  # evictable / hit slots, in LRU order
        else:
            ev, hs = order, order[:0]
        new_order = np.concatenate((ev[m:], ev[:m][::-1], hs))
        taken = ev[:m].astype(np.intp)  # the slots the misses take: new_order[D - h - m:D - h] reversed
        miss_ix = uix.take(miss_idx)
        st = _HsState(np.array([row], dtype=np.int64), new_order, uniq.take(miss_idx), miss_ix, taken,
                      taken + row * (D + 1), taken + int(self.row_base[row]), self.gowner[row].take(taken),
                      taken + (qk + 1), qk)
        if m:  # the victims are this request's tokens: their storage positions share its addresses' shift
            st.victim_shift = int(miss_ix[0]) - int(st.miss_addrs[0])
        move_src = places.take(miss_idx)
        h2d = np.zeros(self.R, np.int64)
        if m:
            h2d[int(self.space.home(uniq[0]))] = m  # a request's tokens share its home rank
        self._finish(plan, st, h2d, move_src)

    @staticmethod
    def _empty_state(rows: np.ndarray, uniq: np.ndarray) -> _HsState:
        z = np.zeros(0, np.int64)
        return _HsState(rows, z, uniq[:0], z, z, z, z, z, z, 0)

    def _too_many(self, n: int) -> None:
        raise CapacityError(
            f"a hisparse request selects {n} distinct non-newest tokens in one batch; its device buffer holds {self.D}"
        )

    def _finish(self, plan: Plan, st: _HsState, h2d: np.ndarray, move_src: np.ndarray) -> None:
        """The plan's per-rank rows and moves (TP: every rank's identical replica)."""
        plan.num_exchanges = 0
        plan.h2d_rows_per_rank = self._per_rank(h2d) if self.tp else h2d
        d2h = self.pending_d2h.copy()
        plan.d2h_rows_per_rank = self._per_rank(d2h) if self.replicas > 1 else d2h
        plan.move_src = move_src
        plan.move_dst = st.miss_slots
        plan.policy_state = st

    def _reorder(self, rows: np.ndarray, m: np.ndarray, h: np.ndarray, hit_key: np.ndarray):
        """New LRU orders of the touched rows (flat) and the slots the misses take (by row, least recent first).
        Row k with h[k] hits and m[k] misses: its first m[k] evictable (non-hit) slots take the misses and sit,
        reversed, just below the hits; the other evictable slots move to the front in order; the hits keep their
        relative order at the MRU end. hit_key: k * D + slot of each hit in row k. Vectorized over the rows: each
        slot's hit flag by LRU position, then the evictable and the hit slots in order (two gathers); each new row is
        three slices of those."""
        D, K = self.D, rows.size
        it = np.int32 if K * D < 2**31 - 1 else np.int64
        order = self.lru.take(rows, axis=0)  # (K, D) slots, least recent first
        flag = np.zeros(K * D, dtype=bool)
        flag[hit_key] = True  # hit slots, by slot
        hit = flag.take((order + np.arange(0, K * D, D, dtype=it)[:, None]).reshape(-1))  # by LRU position
        order = order.reshape(-1)
        ev, hs = order.compress(~hit), order.compress(hit)  # evictable / hit slots, by row
        parts, taken, a, b = [], [], 0, 0
        for mk, hk in zip(m.tolist(), h.tolist()):  # loop over the touched rows: slices only
            n = D - hk
            parts += (ev[a + mk:a + n], ev[a:a + mk][::-1], hs[b:b + hk])
            taken.append(ev[a:a + mk])
            a, b = a + n, b + hk
        return np.concatenate(parts), np.concatenate(taken)

    def commit(self, plan: Plan) -> None:
        st = plan.policy_state
        if st.rows.size:
            if st.rows.size == 1:
                self.lru[int(st.rows[0])] = st.new_order
            else:
                self.lru[st.rows] = st.new_order.reshape(st.rows.size, self.D)
            v, vk = st.victims, st.victim_key
            if v.size and int(v.min()) < 0:  # empty slots taken: no copy dropped there
                held = v >= 0
                v, vk = v[held], (vk if isinstance(vk, int) else vk[held])
            if v.size:  # the victims' copies dropped
                ix = self.space.index(v) if st.victim_shift is None else np.add(v, st.victim_shift, dtype=np.intp)
                self.key_of[ix] = vk
            self.key_of[st.miss_ix] = st.miss_key
            self.gowner.reshape(-1)[st.miss_cell] = st.miss_addrs
        self.pending_d2h[:] = 0
        self.step = plan.now

    # -- free ----------------------------------------------------------------------------------------------------------
    def free(self, request_id: int) -> np.ndarray:
        space = self.space
        req = space.requests[request_id]
        addrs = req.addresses()
        q = req.index
        region, row = int(self.region_of[q]), int(self.row_of[q])
        self.key_of[space.index(addrs)] = -1
        self.gowner[row] = -1
        self.lru[row] = np.arange(self.D, dtype=self.lru.dtype)
        self.regions[region // self.regions_per_rank].push(np.array([region], dtype=np.int64))
        self.region_of[q] = self.row_of[q] = self.lrow_of[q] = -1
        self.hist_len[q], self.newest[q] = 0, -1
        self.cpu.release(space.places(addrs).astype(np.int64))
        space.release(request_id)
        return addrs

    # -- checks --------------------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        check_hisparse(self)


__all__ = ["HiSparsePolicy"]
