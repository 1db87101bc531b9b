"""Shared machinery of the exclusive-tier policies (pb-lru, lru): an entry lives in exactly one tier of its home rank.

Capacity per rank is gpu_slots + cpu_slots. New tokens go GPU-first. An access batch's misses are promoted into
replacement GPU slots chosen by the subclass (`_select`); a slot's victim moves to the CPU slot the incoming entry
vacates (a swap, docs/architecture.md). The mapping and the owners change only at `commit`; the replacement slots are
claimed (free bitmap, recency buckets) when the plan is made, so a pending plan must be committed (the facade refuses
anything else meanwhile). Pool storage grows with the slots in use (pools.Pool); `gidx` names storage positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..address_space import AddressSpace, water_fill
from ..errors import CapacityError, require
from ..plan import Plan
from ..pools import CpuPools, Pool, merge_by_rank

# alloc_many of at most this many tokens runs in Python ints (numpy backend). Measured against the array path, 8 ranks,
# us per call: TP 24 requests x 1 token 220 vs 468, 64 x 3 670 vs 980, 128 x 2 997 vs 898; DP 24 x 3 505 vs 882,
# 64 x 3 1182 vs 1217, 128 x 2 1616 vs 1877. So a decode step of up to ~128 requests takes it (was 16).
FEW_TOKENS = 128
# The empty index arrays of a batch without misses (a warm batch's miss arrays and plan, pb-lru's replacement slots):
# one shared, read-only array.
NO_INDICES = np.zeros(0, dtype=np.int64)
NO_INDICES.setflags(write=False)


def interleave(quota: np.ndarray) -> np.ndarray:
    """Rank sequence holding rank r quota[r] times, round-robin (0, 1, .., 0, 1, ..) while quotas last."""
    R = quota.size
    if R == 0 or not quota.any():
        return np.zeros(0, dtype=np.int64)
    seq = np.repeat(np.arange(R, dtype=np.int64), quota)
    start = np.cumsum(quota) - quota
    key = np.arange(seq.size) - start[seq]  # occurrence within its rank
    key *= R
    key += seq  # distinct keys < max(quota) * R: scatter into a grid and compact instead of sorting them
    grid = np.full(int(quota.max()) * R, R, dtype=_small_int(R + 1))
    grid[key] = seq
    return grid[grid < R].astype(np.int64)


def _fill_few(free: list, n: int) -> list:
    """address_space.water_fill for a few items, one at a time: each to the bin with the most room left (ties: lower
    bin). The same counts: water_fill lowers the highest bins to a level, then takes one more from the lowest bins
    at it, which is the order these single steps take them in."""
    take, room = [0] * len(free), list(free)
    for _ in range(n):
        r = room.index(max(room))
        take[r] += 1
        room[r] -= 1
    return take


def _few_token_ranks(cnt: list, rk: list, tp: bool, gfree: list, cfree: list) -> tuple[list, int, list]:
    """`_alloc_few`'s ranks: (each token's rank, tokens to the GPU tiers (TP: tokens i < ng), tokens per rank);
    CapacityError when they do not fit. TP: GPU tokens water-filled over the ranks' free GPU slots, ranks taking
    turns, then CPU tokens likewise; DP: each request's rank."""
    R, n = len(gfree), sum(cnt)
    per_rank, ng = [0] * R, 0
    if tp:
        gsum, csum = sum(gfree), sum(cfree)
        if n > gsum + csum:
            raise CapacityError(f"cannot allocate {n} tokens: {gsum + csum} slots free over all ranks")
        g_take = _fill_few(gfree, min(n, gsum))
        ng = sum(g_take)
        tok_rank = _interleave_few(g_take) + _interleave_few(_fill_few(cfree, n - ng))
    else:
        tok_rank = [r for r, c in zip(rk, cnt) for _ in range(c)]
    for r in tok_rank:
        per_rank[r] += 1
    if not tp:
        for r in range(R):  # loop over ranks
            if per_rank[r] > gfree[r] + cfree[r]:
                raise CapacityError(f"cannot allocate {per_rank[r]} tokens on rank {r}: {gfree[r] + cfree[r]} slots free")
    return tok_rank, ng, per_rank


def _runs(quota: list, offset: int) -> list:
    """Per rank, the positions (+ offset) `interleave(quota)` gives it, as ascending strided slices: between two
    consecutive quota levels the ranks still taking turns are fixed, so each takes every m-th position of that
    stretch (m of them)."""
    out = [[] for _ in quota]
    pos, prev = offset, 0
    for level in sorted({q for q in quota if q > 0}):  # loop over distinct quotas (a few)
        active = [r for r, q in enumerate(quota) if q >= level]
        m, rounds = len(active), level - prev
        for j, r in enumerate(active):
            out[r].append(slice(pos + j, pos + m * rounds, m))
        pos, prev = pos + m * rounds, level
    return out


def _interleave_few(quota: list) -> list:
    """`interleave` as a list (a few items)."""
    return [r for k in range(max(quota, default=0)) for r, q in enumerate(quota) if q > k]


def _small_int(n: int):
    """Smallest signed integer dtype holding 0..n (rank keys: narrow keys make stable sorts radix sorts)."""
    return np.int8 if n < 2**7 else np.int16 if n < 2**15 else np.int32 if n < 2**31 else np.int64


@dataclass
class ExchangeState:
    """What commit applies for an exclusive policy."""

    hit_places: np.ndarray
    miss_addrs: np.ndarray
    miss_src: np.ndarray  # CPU places the misses leave (victims go there)
    dests: np.ndarray  # GPU places the misses go to
    victims: np.ndarray  # previous owner of each dest, -1 = the slot was free
    hit_gidx: np.ndarray  # GPU pool storage positions of the hits
    touch_gidx: np.ndarray  # ... of the hits whose recency stamp changes at commit
    dest_gidx: np.ndarray  # ... and of the dests


class ExclusivePolicy:
    exclusive = True
    exact_lru = False  # the GPU pool keeps an exact LRU order (lru)
    stamp_dtype = np.int64  # the GPU pool's stamps (narrower where the clock stays small; Pool.fit_stamp widens)

    # -- what a configuration holds (class-level: asked by callers sizing a cache before building one) -------------
    @classmethod
    def check_config(cls, cfg) -> None:
        """Nothing beyond CacheConfig's own checks."""

    @classmethod
    def address_slots_per_rank(cls, cfg) -> int:
        """Addresses of one rank: each entry lives in exactly one tier, so its GPU and CPU slots."""
        return cfg.gpu_slots + cfg.cpu_slots

    @classmethod
    def gpu_history_slots(cls, cfg) -> float:
        """History entries one rank's GPU tier holds before the rest goes to its CPU tier (inf: no CPU tier)."""
        return float(cfg.gpu_slots) if cfg.cpu_slots else math.inf

    @classmethod
    def local_buffer_slots(cls, cfg) -> int:
        """Per-rank TP local buffer of copies of other ranks' entries (0: DP, no buffer)."""
        return cfg.effective_local_buffer_slots if cfg.mode == "tp" else 0

    @classmethod
    def gpu_copy_slots(cls, cfg) -> int:
        """GPU copies of entries (not history of their own) a cache holds at most over all ranks: the local buffers."""
        return cfg.num_ranks * cls.local_buffer_slots(cfg)

    @classmethod
    def ranks_per_request(cls, cfg) -> int:
        """Ranks one request's entries are spread over: TP homes spread over every rank; DP keeps them on one."""
        return cfg.num_ranks if cfg.mode == "tp" else 1

    def __init__(self, cfg, be):
        self.cfg, self.be = cfg, be
        R = cfg.num_ranks
        self.gpu = Pool(R, cfg.gpu_slots, exact_lru=self.exact_lru, address_limit=R * (cfg.gpu_slots + cfg.cpu_slots),
                        stamp_dtype=self.stamp_dtype)
        self.cpu = CpuPools(R, cfg.cpu_slots, base=self.gpu.num_places)
        self.num_places = self.gpu.num_places + self.cpu.num_places
        self.space = AddressSpace(R, cfg.gpu_slots + cfg.cpu_slots, self.num_places)
        self.step = 0  # committed access batches
        self.pending_d2h = np.zeros(R, dtype=np.int64)  # rows allocated into the CPU tier since the last access
        self.num_gpu_places, self.gpu_seg = self.gpu.num_places, self.gpu.seg
        self._no_rows = np.zeros(R, dtype=np.int64)  # a warm batch's promotions per rank (shared, read-only)
        self._no_rows.setflags(write=False)
        self._no_victims = np.zeros(0, dtype=self.gpu.own.dtype)  # ... and its victims
        self._no_victims.setflags(write=False)
        self.alloc_moves = None

    # -- capacity ------------------------------------------------------------------------------------------------------
    def free_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """(GPU free per rank, CPU free per rank) in logical token slots."""
        return self.gpu.num_free.copy(), self.cpu.num_free()

    def capacity(self) -> tuple[np.ndarray, np.ndarray]:
        R = self.cfg.num_ranks
        return np.full(R, self.cfg.gpu_slots, np.int64), np.full(R, self.cfg.cpu_slots, np.int64)

    def held_rows(self) -> tuple[int, int]:
        g, c = self.free_slots()
        gc, cc = self.capacity()
        return int((gc - g).sum()), int((cc - c).sum())

    # -- allocation ----------------------------------------------------------------------------------------------------
    def alloc_many(self, request_ids: list[int], counts: np.ndarray, ranks: np.ndarray, tp: bool) -> np.ndarray:
        be, R = self.be, self.cfg.num_ranks
        if getattr(be, "scalar_updates", False):
            cnt = counts.tolist()
            if cnt == [1]:
                return self._alloc_one(request_ids[0], int(ranks[0]), tp)
            if sum(cnt) <= FEW_TOKENS:
                return self._alloc_few(request_ids, cnt, ranks.tolist(), tp)
        gfree, cfree = self.free_slots()
        n = int(counts.sum())
        if tp:
            if n > gfree.sum() + cfree.sum():
                raise CapacityError(f"cannot allocate {n} tokens: {int(gfree.sum() + cfree.sum())} slots free over all ranks")
            g_take = water_fill(gfree, min(n, int(gfree.sum())))
            c_take = water_fill(cfree, n - int(g_take.sum()))
            return self._alloc_tp(request_ids, counts, g_take.tolist(), c_take.tolist())
        per_rank = np.bincount(ranks, weights=counts, minlength=R).astype(np.int64)
        short = np.flatnonzero(per_rank > gfree + cfree)
        if short.size:
            r = int(short[0])
            raise CapacityError(f"cannot allocate {int(per_rank[r])} tokens on rank {r}: {int(gfree[r] + cfree[r])} slots free")
        self.space.reserve(per_rank)  # one re-layout of the address tables for every rank that grows
        addrs, places, g_counts, gi = self._alloc_dp(counts, ranks, per_rank, gfree, n)
        gidx, _ = self.gpu.take_free(be, g_counts)
        places[gi] = self.gpu.places(gidx)
        self.gpu.num_free -= g_counts
        self.gpu.own[gidx] = addrs[gi]
        self.gpu.touch(gidx, self._clock(self.step))
        self._on_alloc(gidx)
        self.space.set_places(addrs, places)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for i, rid in enumerate(request_ids):  # loop over requests (bookkeeping only)
            req = self.space.request(rid, int(ranks[i]))
            self.space.register(rid, req, addrs[offsets[i]:offsets[i + 1]])
        return addrs

    def _alloc_dp(self, counts: np.ndarray, ranks: np.ndarray, per_rank: np.ndarray, gfree: np.ndarray,
                  n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`alloc_many` in DP once the room is checked: each rank's tokens take its next addresses in token order,
        its first gfree[r] the GPU tier, the others CPU places (set here). (addrs, places, GPU tokens per rank,
        the GPU tokens' positions grouped by rank, like select_first's output)."""
        R = self.cfg.num_ranks
        addrs = np.empty(n, dtype=np.int64)
        places = np.empty(n, dtype=np.int64)
        g_counts = np.zeros(R, dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(per_rank)]).tolist()
        live = ranks[counts > 0]
        if bool((live[1:] >= live[:-1]).all()):  # tokens grouped by rank already (a prompt): slices
            for r in range(R):  # loop over ranks
                lo, hi = bounds[r], bounds[r + 1]
                if lo == hi:
                    continue
                addrs[lo:hi] = self.space.pop_ids(r, hi - lo)
                g = min(hi - lo, int(gfree[r]))
                g_counts[r] = g
                places[lo + g:hi] = self.cpu.free[r].pop(hi - lo - g)
                self.pending_d2h[r] += hi - lo - g
            start = np.array(bounds[:-1], dtype=np.int64)
            gi = np.repeat(start - (np.cumsum(g_counts) - g_counts), g_counts) + np.arange(int(g_counts.sum()))
            return addrs, places, g_counts, gi
        tok_rank, tok_gpu = np.repeat(ranks, counts), np.zeros(n, dtype=bool)
        # Tokens grouped by rank, ascending within a rank (one radix sort on narrow keys, not a scan per rank).
        by_rank = np.argsort(tok_rank.astype(_small_int(R)), kind="stable")
        for r in range(R):  # loop over ranks
            if bounds[r] == bounds[r + 1]:
                continue
            idx = by_rank[bounds[r]:bounds[r + 1]]
            addrs[idx] = self.space.pop_ids(r, idx.size)
            tok_gpu[idx[: min(idx.size, int(gfree[r]))]] = True
            g_counts[r] = int(tok_gpu[idx].sum())
            ci = idx[~tok_gpu[idx]]
            places[ci] = self.cpu.free[r].pop(ci.size)
            self.pending_d2h[r] += ci.size
        return addrs, places, g_counts, by_rank[tok_gpu[by_rank]]

    def _alloc_tp(self, request_ids: list[int], counts: np.ndarray, g_take: list, c_take: list) -> np.ndarray:
        """`alloc_many` in TP once the GPU and CPU tokens per rank are known: tokens i < sum(g_take) go to the GPU
        tiers, ranks taking turns (`interleave`: each rank's tokens are a few strided runs of positions, `_runs`),
        the others to the CPU tiers likewise; each rank's tokens take its next addresses in token order. Written by
        strided slices per rank: no per-token rank array, no sort by rank."""
        R, gpu, space = self.cfg.num_ranks, self.gpu, self.space
        n, ng = int(counts.sum()), sum(g_take)
        space.reserve([g + c for g, c in zip(g_take, c_take)])  # one re-layout of the address tables
        addrs = np.empty(n, dtype=np.int64)
        places = np.empty(n, dtype=np.int64)
        g_counts = np.array(g_take, dtype=np.int64)
        gidx, _ = gpu.take_free(self.be, g_counts)  # grouped by rank
        gplaces = gpu.places(gidx)
        own, spr = gpu.own, space.slots_per_rank
        g_runs, c_runs = _runs(g_take, 0), _runs(c_take, ng)
        o = 0
        for r in range(R):  # loop over ranks
            g, c = g_take[r], c_take[r]
            if not g + c:
                continue
            ids = space.pop_ids(r, g + c)
            rp = np.empty(g + c, dtype=np.int64)  # the rank's places in id order
            rp[:g] = gplaces[o:o + g]
            own[gidx[o:o + g]] = ids[:g]
            o += g
            if c:
                rp[g:] = self.cpu.free[r].pop(c)
                self.pending_d2h[r] += c
            i = 0
            for sl in g_runs[r] + c_runs[r]:  # loop over the rank's runs (a few)
                k = len(range(sl.start, sl.stop, sl.step))
                addrs[sl] = ids[i:i + k]
                places[sl] = rp[i:i + k]
                i += k
            space.table[ids + (int(space.rows.offs[r]) - r * spr if not space.rows.identity else 0)] = rp
        gpu.num_free -= g_counts
        gpu.touch(gidx, self._clock(self.step))
        self._on_alloc(gidx)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        for i, rid in enumerate(request_ids):  # loop over requests (bookkeeping only)
            space.register(rid, space.request(rid, 0), addrs[offsets[i]:offsets[i + 1]])
        return addrs

    def alloc_one(self, rid: int, count: int, rank: int, tp: bool) -> np.ndarray:
        """`alloc_many` of one request (the facade's `alloc`): the same paths, without per-request arrays."""
        if getattr(self.be, "scalar_updates", False):
            if count == 1:
                return self._alloc_one(rid, rank, tp)
            if count <= FEW_TOKENS:
                return self._alloc_few([rid], [count], [rank], tp)
        return self.alloc_many([rid], np.array([count], dtype=np.int64), np.array([rank], dtype=np.int64), tp)

    def _alloc_few(self, request_ids: list[int], cnt: list, rk: list, tp: bool) -> np.ndarray:
        """`alloc_many` of a few tokens (decode steps) in Python ints: the same ranks, tiers, addresses and places,
        the same state after, without the array passes that cost more than the work at this size."""
        R, gpu, space = self.cfg.num_ranks, self.gpu, self.space
        gfree, cfree = gpu.num_free.tolist(), [len(f) for f in self.cpu.free]
        n = sum(cnt)
        tok_rank, ng, per_rank = _few_token_ranks(cnt, rk, tp, gfree, cfree)
        space.reserve(per_rank)
        tokens = [[] for _ in range(R)]
        for i, r in enumerate(tok_rank):
            tokens[r].append(i)
        addrs, places = [0] * n, [0] * n
        g_counts, gi = [0] * R, []  # GPU tokens per rank; GPU tokens grouped by rank (like take_free's slots)
        for r, idx in enumerate(tokens):  # loop over ranks
            if not idx:
                continue
            for i, a in zip(idx, space.ids[r].pop_few(len(idx))):
                addrs[i] = a
            if tp:
                g_tok, c_tok = [i for i in idx if i < ng], [i for i in idx if i >= ng]
            else:
                g = min(len(idx), gfree[r])
                g_tok, c_tok = idx[:g], idx[g:]
            g_counts[r] = len(g_tok)
            gi.extend(g_tok)
            if c_tok:
                for i, p in zip(c_tok, self.cpu.free[r].pop_few(len(c_tok))):
                    places[i] = p
                self.pending_d2h[r] += len(c_tok)
        gc = np.array(g_counts, dtype=np.int64)
        gidx, _ = gpu.take_free(self.be, gc)
        own = gpu.own
        for i, s, p in zip(gi, gidx.tolist(), gpu.places(gidx).tolist()):
            places[i] = p
            own[s] = addrs[i]
        gpu.num_free -= gc
        gpu.touch(gidx, self._clock(self.step))
        self._on_alloc(gidx)
        out = np.array(addrs, dtype=np.int64)
        space.set_places(out, np.array(places, dtype=np.int64))
        offsets = 0
        for rid, c, r in zip(request_ids, cnt, rk):  # loop over requests (bookkeeping only)
            req = space.request(rid, r if not tp else 0)
            if c == 1:  # a decode token: its address as an int
                space.register_one(rid, req, addrs[offsets])
            else:
                space.register(rid, req, out[offsets:offsets + c])
            offsets += c
        return out

    def _alloc_one(self, rid: int, rank: int, tp: bool) -> np.ndarray:
        """`_alloc_few` of one token of one request (a batch-1 decode step): the rank (TP: the most free GPU slots,
        ties lowest, else the most free CPU slots; DP: the request's) and tier picked by scalar rules, then the same
        address, place and state after, without building per-rank lists."""
        gpu, space = self.gpu, self.space
        gfree = gpu.num_free
        r = int(gfree.argmax()) if tp else rank
        on_gpu = int(gfree[r]) > 0
        if not on_gpu:
            cfree = [len(f) for f in self.cpu.free]
            if tp:
                r = cfree.index(max(cfree))
            if not cfree[r]:
                where = ": 0 slots free over all ranks" if tp else f" on rank {r}: 0 slots free"
                raise CapacityError(f"cannot allocate 1 tokens{where}")
        addr = space.pop_one(r)
        if on_gpu:
            g = gpu.take_one(r)
            require(g >= 0, "a rank with free GPU slots has a free slot to take")
            place = gpu.place_one(g)
            gpu.own[g] = addr
            gpu.num_free[r] -= 1
            self._on_alloc_one(g)
        else:
            place = self.cpu.free[r].pop_few(1)[0]
            self.pending_d2h[r] += 1
            gpu.touch(NO_INDICES, self._clock(self.step))  # (the clock may widen the stamps, as for a GPU token)
            self._on_alloc(NO_INDICES)
        space.table[space.index_one(addr)] = place
        space.register_one(rid, space.request(rid, r if not tp else 0), addr)
        return np.array([addr], dtype=np.int64)

    # -- access --------------------------------------------------------------------------------------------------------
    def access(self, plan: Plan, places: np.ndarray, ix: np.ndarray | None = None) -> None:
        be, R, gpu = self.be, self.cfg.num_ranks, self.gpu
        uniq, now = plan.addrs, plan.now
        # Every entry GPU-resident (a warm batch) when the largest place is a GPU place (places are >= 0: the facade
        # refused unallocated addresses): one reduction instead of a hit mask and its scan; no miss arrays to build.
        if not places.size or int(places.max()) < gpu.num_places:
            hit_places = places.astype(np.int64)
            miss_addrs, miss_src = NO_INDICES, NO_INDICES
            m_counts = self._no_rows
        else:
            hit = be.to_numpy(be.hit_mask(be.asarray(places), gpu.num_places))
            # nonzero + take: measured ~5x faster than boolean-mask indexing on ~1M elements.
            hit_idx = hit.nonzero()[0]
            miss_idx = (~hit).nonzero()[0]
            hit_places = places.take(hit_idx).astype(np.int64)
            miss_addrs, miss_src = uniq.take(miss_idx), places.take(miss_idx).astype(np.int64)
            if R > 1:  # misses are in their home ranks' CPU pools, and homes are ascending address ranges
                cuts = miss_addrs.searchsorted(self.space.home_starts)
                m_counts = cuts[1:] - cuts[:-1]
            else:
                m_counts = np.array([miss_addrs.size], dtype=np.int64)
        n_hit, n_miss = hit_places.size, miss_addrs.size
        if n_hit + n_miss > self.cfg.gpu_slots:  # some rank may need more than its slots: count per rank
            self._check_fits(uniq)
        if n_miss:
            gpu.reserve(m_counts)  # any storage growth before positions are taken
        hit_gidx = gpu.idx(hit_places)
        dest_gidx = self._select(hit_gidx, m_counts, n_miss, now, uniq)
        if not n_miss:  # nothing moves: the plan of a warm batch (move_src / move_dst: the plan's shared empties)
            plan.num_hits, plan.num_misses, plan.num_exchanges = int(n_hit), 0, 0
            plan.h2d_rows_per_rank = m_counts
            plan.d2h_rows_per_rank = self.pending_d2h.copy()
            plan.policy_state = ExchangeState(hit_places, miss_addrs, miss_src, NO_INDICES, self._no_victims, hit_gidx,
                                              self._touched_hits(hit_gidx), dest_gidx)
            return
        victims = gpu.own[dest_gidx]
        dests = gpu.places(dest_gidx)
        has_v = victims >= 0
        all_v = bool(has_v.all())
        v_idx = None if all_v else np.flatnonzero(has_v)
        v_dest = dests if all_v else dests.take(v_idx)
        v_src = miss_src if all_v else miss_src.take(v_idx)
        plan.num_hits, plan.num_misses = int(hit_places.size), int(miss_addrs.size)
        plan.num_exchanges = int(v_dest.size)
        plan.h2d_rows_per_rank = m_counts
        if all_v:  # every dest (m_counts[r] of rank r) evicts a victim of its rank
            v_counts = m_counts
        else:
            v_counts = np.bincount(v_dest // gpu.seg, minlength=R) if R > 1 else np.array([v_dest.size])
        plan.d2h_rows_per_rank = v_counts.astype(np.int64) + self.pending_d2h
        plan.move_src = np.concatenate([miss_src, v_dest])
        plan.move_dst = np.concatenate([dests, v_src])
        plan.policy_state = ExchangeState(hit_places, miss_addrs, miss_src, dests, victims, hit_gidx,
                                          self._touched_hits(hit_gidx), dest_gidx)

    def _check_fits(self, uniq: np.ndarray) -> None:
        """CapacityError when some rank's share of the batch's distinct addresses exceeds its GPU slots."""
        cuts = uniq.searchsorted(self.space.home_starts)  # a rank's hits + misses: its home's addresses
        over = np.flatnonzero(cuts[1:] - cuts[:-1] > self.cfg.gpu_slots)
        if over.size:
            r = int(over[0])
            raise CapacityError(
                f"access batch needs {int(cuts[r + 1] - cuts[r])} distinct entries in rank {r}'s GPU pool "
                f"of {self.cfg.gpu_slots} slots"
            )

    def commit(self, plan: Plan) -> None:
        st, gpu, space, now = plan.policy_state, self.gpu, self.space, plan.now
        if st.miss_addrs.size:
            has_v = st.victims >= 0
            space.set_places(st.miss_addrs, st.dests)
            if has_v.all():
                space.set_places(st.victims, st.miss_src)
            else:
                space.set_places(st.victims[has_v], st.miss_src[has_v])
                self.cpu.release(st.miss_src[~has_v])
                gpu.num_free -= np.bincount(st.dests[~has_v] // gpu.seg, minlength=self.cfg.num_ranks)
            gpu.own[st.dest_gidx] = st.miss_addrs
        gpu.touch(st.touch_gidx, self._clock(now))
        if st.dest_gidx.size:
            gpu.touch(st.dest_gidx, self._clock(now))
        self.pending_d2h[:] = 0
        self.step = now

    # -- free ----------------------------------------------------------------------------------------------------------
    def free(self, request_id: int) -> np.ndarray:
        be, gpu, space = self.be, self.gpu, self.space
        addrs = space.requests[request_id].addresses()
        places = space.places(addrs)
        on_gpu = places < gpu.num_places
        g, c = places[on_gpu], places[~on_gpu]
        gidx = gpu.idx(g.astype(np.int64))
        self._on_release(gidx)
        gpu.give_back(be, gidx)
        gpu.num_free += np.bincount(g // gpu.seg, minlength=self.cfg.num_ranks)
        self.cpu.release(c)
        space.release(request_id)
        return addrs

    # -- checks --------------------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        gpu, space, cfg = self.gpu, self.space, self.cfg
        alloc = space.allocated()
        places = space.places(alloc).astype(np.int64)
        require(alloc.size == space.num_allocated, "allocated count drifted")
        require(np.unique(places).size == places.size, "a physical place is claimed by two logical addresses")
        require((places < self.num_places).all(), "place out of range")
        homes = space.home(alloc)
        on_gpu = places < gpu.num_places
        require((places[on_gpu] // gpu.seg == homes[on_gpu]).all(), "GPU entry outside its home rank")
        require((self.cpu.rank_of(places[~on_gpu]) == homes[~on_gpu]).all(), "CPU entry outside its home rank")
        require((gpu.own[gpu.idx(places[on_gpu])] == alloc[on_gpu]).all(), "GPU owner table disagrees with the mapping")
        require(int((gpu.own >= 0).sum()) == int(on_gpu.sum()), "GPU slot owned by an unmapped address")
        gpu.check(require, "GPU")
        gcount = np.bincount(places[on_gpu] // gpu.seg, minlength=cfg.num_ranks)
        ccount = np.bincount(self.cpu.rank_of(places[~on_gpu]), minlength=cfg.num_ranks)
        require((gpu.num_free + gcount == cfg.gpu_slots).all(), "GPU free count not conserved")
        require((self.cpu.num_free() + ccount == cfg.cpu_slots).all(), "CPU free count not conserved")
        hcount = np.bincount(homes, minlength=cfg.num_ranks)
        ids_free = np.array([space.free_ids(r) for r in range(cfg.num_ranks)])
        require((ids_free + hcount == space.slots_per_rank).all(), "logical ids not conserved")
        self._check_policy(alloc, places, on_gpu)

    # -- hooks for subclasses ------------------------------------------------------------------------------------------
    def _select(self, hit_gidx, m_counts, n_miss, now, addrs):  # -> dests (storage positions) grouped by rank in policy order
        raise NotImplementedError

    def _on_alloc(self, gslots: np.ndarray) -> None:
        pass

    def _on_alloc_one(self, g: int) -> None:
        """A newly allocated GPU slot (storage position g, an int): its stamp and `_on_alloc`'s bookkeeping."""
        idx = np.array([g], dtype=np.int64)
        self.gpu.touch(idx, self._clock(self.step))
        self._on_alloc(idx)

    def _touched_hits(self, hit_gidx: np.ndarray) -> np.ndarray:
        """The hits whose stamp the commit sets (after `_select`): all of them (lru: every touch is logged)."""
        return hit_gidx

    def _on_release(self, gslots: np.ndarray) -> None:
        pass

    def _clock(self, step: int) -> int:
        """The recency stamp of a touch during access `step` (lru: the step itself; pb-lru: its bucket epoch)."""
        return step

    def _check_policy(self, alloc, places, on_gpu) -> None:
        pass

    def _by_rank(self, parts: list[np.ndarray], found: list[np.ndarray]) -> np.ndarray:
        """Concatenate replacement slots taken in priority order (parts[k] holds found[k][r] slots of rank r, grouped
        by rank) into one array grouped by rank, priority order kept within a rank."""
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return merge_by_rank(parts, found)


__all__ = ["ExchangeState", "ExclusivePolicy", "interleave"]
