"""UlaCache: the facade of DESIGN §8 (allocation, sparse access -> plan -> commit, locate, payloads, stats).

It validates input (bad input raises ValueError and changes nothing), runs the access pipeline (dedup -> translate
-> policy: hits, recency, replacement, exchange plan -> TP local buffers), moves payload bytes at commit, and counts
statistics. One plan may be pending at a time: between `access` and `commit` the mapping is unchanged, so `locate`
and `read` return the old, valid places, and allocation, free, write and another access are refused.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from .backends import get_backend
from .config import CacheConfig
from .errors import require
from .layout import DeviceState, Exchanges, PlaceLayout
from .local_buffer import LocalBuffers
from .payload import PayloadStore
from .plan import Plan
from .policies import POLICIES

# A numpy batch this many times shorter than the address storage is deduplicated by sorting its addresses
# (`_translate_sorted`); a longer one by the backend's dedup over storage positions (the numpy backend's own
# sort/marker crossover, bench/dedup_crossover.py).
_SORT_BATCH_RATIO = 16
# A TP batch of at least this many distinct addresses is located by home runs (slices), a smaller one by per-address
# gathers (measured, 8 homes: 2048 addresses 13 vs 39 us, 30000 addresses 176 vs 45 us; crossover ~6000).
_RUN_SHIFT_MIN = 8192
STAT_KEYS = ("accesses", "replays", "references", "unique_references", "hits", "misses", "exchanges",
             "local_hits", "peer_fetches", "h2d_rows", "d2h_rows", "peer_rows")


def _int_array(values, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be an integer array, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{what} has values beyond int64")
    return arr.astype(np.int64, copy=False)


def _int_scalar(value, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return int(value)


class UlaCache:
    def __init__(self, config: CacheConfig):
        if not isinstance(config, CacheConfig):
            raise ValueError(f"UlaCache needs a CacheConfig, got {type(config).__name__}")
        self.config = cfg = config
        self.be = get_backend(cfg.backend)
        self.policy = POLICIES[cfg.policy](cfg, self.be)
        self.space = self.policy.space
        self.tp = cfg.mode == "tp"
        self.buffers = None
        num_places = self.policy.num_places
        if self.tp and self.policy.exclusive:
            self.buffers = LocalBuffers(self.be, cfg.num_ranks, cfg.effective_local_buffer_slots, self.space,
                                        base_place=num_places)
            num_places += self.buffers.num_places
        self._data = None
        if cfg.payload_bytes:  # bytes only for the pages of places written (payload.py), not the budget
            self._data = PayloadStore(num_places, cfg.payload_layers, cfg.payload_bytes)
        self._pending: Plan | None = None
        self._last: Plan | None = None
        self._version = 0
        self._stats: Counter = Counter()
        self._row_bytes = cfg.effective_row_bytes
        self._rows_key, self._rows_tables, self._rows_lists = None, None, None  # _row_tables' cache (+ as lists)
        self._no_peer_rows = np.zeros(cfg.num_ranks, dtype=np.int64)  # every plan's peer rows without TP buffers
        self._no_peer_rows.setflags(write=False)

    # -- validation helpers --------------------------------------------------------------------------------------------
    def _idle(self, what: str) -> None:
        if self._pending is not None:
            raise ValueError(f"cannot {what} while a plan is pending; commit it first")

    def _addresses(self, addrs, what: str, allow_padding: bool) -> np.ndarray:
        return self._address_range(addrs, what, allow_padding)[0]

    def _address_range(self, addrs, what: str, allow_padding: bool) -> tuple[np.ndarray, int, int]:
        """(flat int64 addresses, their min, their max; 0, -1 when empty), every one in range (-1 padding allowed)."""
        a = _int_array(addrs, what).ravel()
        if not a.size:
            return a, 0, -1
        lo, hi = int(a.min()), int(a.max())
        self._check_range(lo, hi, what, allow_padding)
        return a, lo, hi

    def _check_range(self, lo: int, hi: int, what: str, allow_padding: bool) -> None:
        """ValueError unless addresses of min lo and max hi are in range (hi < lo: none)."""
        if hi < lo:
            return
        floor = -1 if allow_padding else 0
        if lo < floor:
            raise ValueError(f"{what} holds {lo}: addresses are >= 0" + (" (-1 = padding)" if allow_padding else ""))
        if hi >= self.space.size:
            raise ValueError(f"{what} holds {hi}: beyond the address space of {self.space.size}")

    def _storage_index(self, a: np.ndarray, what: str, allow_padding: bool, hi: int | None = None) -> np.ndarray:
        """Storage positions of in-range addresses (-1 padding kept); ValueError for one never handed out. `hi`:
        max(a) when the caller has it."""
        rows = self.space.rows
        if rows.identity:
            if a.size:
                hi = int(a.max()) if hi is None else hi
                if hi >= self.space.table.size:
                    raise ValueError(f"{what} holds unallocated address {hi}")
            return a
        shift, end = self._row_tables(rows)
        home = a // rows.stride  # -1 padding: home -1, the tables' last entry (shift 0: stays -1; end 0: valid)
        ix = a + shift.take(home)
        bad = ix >= end.take(home)
        if bad.any():
            raise ValueError(f"{what} holds unallocated address {int(a[np.flatnonzero(bad)[0]])}")
        return ix

    def _row_tables(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """Per home rank (+ one entry for -1 padding): storage shift (position - address) and end of its row; rebuilt
        only when the address storage grew (rows only grow, so its size names the layout)."""
        if self._rows_key != rows.size:
            r = np.arange(rows.R, dtype=np.int64)
            self._rows_tables = (np.append(rows.offs[:-1] - r * rows.stride, 0),
                                 np.append(rows.offs[:-1] + rows.caps, 0))
            self._rows_lists = tuple(t.tolist() for t in self._rows_tables)
            self._rows_key = rows.size
        return self._rows_tables

    def _places(self, a: np.ndarray, what: str) -> np.ndarray:
        """Current places of valid, allocated addresses (int64)."""
        places = self.space.table[self._storage_index(a, what, allow_padding=False)].astype(np.int64)
        self._check_allocated(a, places, what)
        return places

    def _check_allocated(self, addrs: np.ndarray, places: np.ndarray, what: str) -> None:
        if not places.size or int(places.min()) >= 0:  # one reduction; the scan only to name the first one
            return
        bad = np.flatnonzero(places < 0)
        raise ValueError(f"{what} holds unallocated address {int(addrs[bad[0]])}")

    def _rank(self, rank, what: str = "rank") -> int:
        r = _int_scalar(rank, what)
        if not 0 <= r < self.config.num_ranks:
            raise ValueError(f"{what} {r} out of range: num_ranks is {self.config.num_ranks}")
        return r

    # -- allocation ----------------------------------------------------------------------------------------------------
    def alloc(self, request_id: int, num_tokens: int, rank: int = 0) -> np.ndarray:
        """int64 logical addresses of `num_tokens` new tokens of the request (prefill or decode). Valid integer
        scalars go straight to the policy's one-request path (a decode step: no per-argument arrays); anything else
        through `alloc_many`, which checks and refuses it by name."""
        if not (type(request_id) is int and type(num_tokens) is int and type(rank) is int  # noqa: E721
                and num_tokens >= 0 and 0 <= rank < self.config.num_ranks):
            return self.alloc_many([request_id], [num_tokens], [rank])
        self._idle("allocate")
        if not self.tp:
            self._check_home(request_id, rank)
        addrs = self.policy.alloc_one(request_id, num_tokens, rank, self.tp)
        self._copy_alloc_moves()
        return addrs

    def alloc_many(self, request_ids, counts, ranks=None) -> np.ndarray:
        """Allocate counts[i] tokens for request_ids[i] (on ranks[i] in DP; default 0; in TP the homes are spread over
        the ranks by free space and `ranks` is ignored); addresses concatenated in request order. New tokens go to
        the GPU pool while it has free slots (pb-lru, lru). All or nothing: CapacityError (nothing changed)."""
        self._idle("allocate")
        ids = _int_array(request_ids, "request_ids").ravel()
        counts = _int_array(counts, "counts").ravel()
        ranks = np.zeros(ids.size, np.int64) if ranks is None else _int_array(ranks, "ranks").ravel()
        if not (ids.size == counts.size == ranks.size):
            raise ValueError(f"request_ids, counts and ranks differ in length ({ids.size}, {counts.size}, {ranks.size})")
        if counts.size:  # one request (a decode step's growth) read as scalars: no array reductions
            c_min, r_min, r_max = ((int(counts[0]), int(ranks[0]), int(ranks[0])) if counts.size == 1 else
                                   (int(counts.min()), int(ranks.min()), int(ranks.max())))
            if c_min < 0:
                raise ValueError(f"counts holds {c_min}: token counts are >= 0")
            if r_min < 0 or r_max >= self.config.num_ranks:
                raise ValueError(f"ranks must be in [0, {self.config.num_ranks}), got {r_min}..{r_max}")
        if ids.size > 1 and np.unique(ids).size != ids.size:
            raise ValueError("request_ids holds a request twice; allocate its tokens in one entry")
        id_list = ids.tolist()
        if not self.tp:
            for rid, r in zip(id_list, ranks.tolist()):  # loop over requests (dict look-ups)
                self._check_home(rid, r)
        addrs = self.policy.alloc_many(id_list, counts, ranks, self.tp)
        self._copy_alloc_moves()
        return addrs

    def _check_home(self, request_id: int, rank: int) -> None:
        """DP: a request's tokens live on one rank; ValueError when an allocation names another."""
        req = self.space.requests.get(request_id)
        if req is not None and req.rank != rank:
            raise ValueError(f"request {request_id} lives on rank {req.rank}, not rank {rank}")

    def _copy_alloc_moves(self) -> None:
        """Payload mode: the bytes the last allocation moved inside the GPU tier (hisparse's newest-token slot)."""
        moves = self.policy.alloc_moves
        if moves is not None and self._data is not None and moves[0].size:
            self._data.copy_all_layers(moves[0], moves[1])

    def free(self, request_id: int) -> None:
        """Release every token of the request (its addresses may be reused later)."""
        self._idle("free")
        rid = _int_scalar(request_id, "request_id")
        if rid not in self.space.requests:
            raise ValueError(f"unknown request {rid}: not allocated or already freed")
        addrs = self.space.requests[rid].addresses()
        if self.buffers is not None:
            self.buffers.invalidate(addrs)
        self.policy.free(rid)

    # -- access pipeline -----------------------------------------------------------------------------------------------
    def access(self, selected, rank: int | None = None) -> Plan:
        """Plan one access batch: int64 logical addresses of any shape, -1 = padding. In DP, `rank` (optional)
        asserts the batch belongs to that rank; in TP every rank executes the batch and `rank` must be None."""
        self._idle("start another access")
        if self._data is not None and self._last is not None and len(self._last.layers_done) < self.config.payload_layers:
            raise ValueError(
                f"replay the last plan for all {self.config.payload_layers} payload layers before the next access"
            )
        be, space = self.be, self.space
        arr = np.asarray(selected)
        small = (be.name == "numpy" and arr.size * _SORT_BATCH_RATIO < space.rows.size + 1
                 and arr.dtype.kind in "iu" and arr.dtype.itemsize <= 8 - 4 * (arr.dtype.kind == "u"))
        if small:  # sorted first (in the caller's width: int32 sorts ~2x faster): its ends are the range to check
            srt = arr.flatten()  # (a copy: sorted in place)
            srt.sort()
            lo, hi = (int(srt[0]), int(srt[-1])) if srt.size else (0, -1)
            self._check_range(lo, hi, "selected", allow_padding=True)
        else:
            flat, lo, hi = self._address_range(arr, "selected", allow_padding=True)
        if rank is not None:
            if self.tp:
                raise ValueError("rank must be None in TP mode: every rank executes the batch")
            rank = self._rank(rank)
        if small:
            uniq, ix, places, num_refs, bounds = self._translate_sorted(srt, lo)
        else:
            (uniq, ix, places, num_refs), bounds = self._translate_marker(flat, lo, hi), None
        space.remember(uniq, ix, bounds)  # (the policy and the TP local buffers locate and cut the batch again;
        # forgotten at commit)
        if rank is not None and uniq.size:
            homes = self.space.home(uniq[[0, -1]])
            if homes[0] != rank or homes[1] != rank:
                raise ValueError(f"selected holds addresses of another rank than {rank}")
        plan = Plan(version=self._version, now=self.policy.step + 1, addrs=uniq, num_refs=num_refs,
                    num_unique=int(uniq.size))
        if self.buffers is not None:
            self.buffers.check_fits(uniq)  # before the policy takes any slot: a refused batch changes nothing
        self.policy.access(plan, places, ix)
        if self.buffers is not None:
            self.buffers.plan(plan, places)
        else:
            plan.peer_rows_per_rank = self._no_peer_rows
        plan._exchanges = self._exchanges_of  # called with the plan (no plan -> plan reference cycle)
        self._pending = plan
        return plan

    def _translate_marker(self, flat: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(distinct addresses ascending, their storage positions, their places, references without padding) of a
        batch of in-range addresses (min lo, max hi): storage positions deduplicated by the backend (a large batch:
        the scatter marker over storage), turned back into addresses."""
        be, space = self.be, self.space
        ix = self._storage_index(flat, "selected", allow_padding=True, hi=hi)
        uix, scratch = be.dedup(be.asarray(ix), be.asarray(space.scratch))
        space.scratch = be.to_numpy(scratch)
        uix = be.to_numpy(uix)
        places = be.to_numpy(be.gather(be.asarray(space.table), be.asarray(uix)))
        uniq = space.rows.ids(uix)
        self._check_allocated(uniq, places, "selected")
        num_refs = flat.size if lo >= 0 else int(flat.size - np.count_nonzero(flat == -1))  # -1 pads
        return uniq, uix, places, num_refs

    def _translate_sorted(self, s: np.ndarray, lo: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, list]:
        """`_translate_marker` of a batch much smaller than the storage (numpy), given sorted (`s`, min lo): the
        addresses themselves deduplicated (storage order is address order, so these are the same distinct
        addresses), then only the distinct ones located. Saves the storage positions of every reference and their
        mapping back (~40 us of a 2048-reference batch); the sorted copy gave min and max for free. Also the
        distinct addresses' home bounds (AddressSpace.home_bounds), which locating them cut."""
        n = s.size
        if not n:
            return s.astype(np.int64), s.astype(np.int64), self.space.table[:0], 0, [0] * (self.config.num_ranks + 1)
        pads = int(s.searchsorted(0)) if lo < 0 else 0  # -1 padding sorts first
        if pads:
            s = s[pads:]
        if s.size > 1:
            keep = np.empty(s.size, dtype=bool)
            keep[0] = True
            np.not_equal(s[1:], s[:-1], out=keep[1:])
            if np.count_nonzero(keep) < s.size:  # (one query token per request repeats none: no copy)
                s = s[keep]
        s = s.astype(np.int64, copy=False)
        ix, bounds = self._sorted_index(s) if s.size else (s, [0] * (self.config.num_ranks + 1))
        places = self.space.table.take(ix)  # take: no fancy-index set-up
        self._check_allocated(s, places, "selected")
        return s, ix, places, n - pads, bounds

    def _sorted_index(self, a: np.ndarray) -> tuple[np.ndarray, list]:
        """Storage positions of ascending, in-range, distinct addresses (ValueError for one never handed out), and
        their home bounds (AddressSpace.home_bounds)."""
        rows, R, n = self.space.rows, self.config.num_ranks, a.size
        if rows.identity:  # (one rank)
            if int(a[-1]) >= self.space.table.size:
                raise ValueError(f"selected holds unallocated address {int(a[-1])}")
            return a, [0] * R + [n]
        shift, end = self._row_tables(rows)
        h0, h1 = int(a[0]) // rows.stride, int(a[-1]) // rows.stride
        if h0 == h1:  # one home rank (a DP batch): one shift, and the last address is the largest
            sh = int(shift[h0])
            if int(a[-1]) + sh >= int(end[h0]):
                ix = a + sh
                raise ValueError(f"selected holds unallocated address {int(a[np.flatnonzero(ix >= end[h0])[0]])}")
            return a + sh, [0] * (h0 + 1) + [n] * (R - h0)
        # Several homes (TP): each home's addresses are one run of the ascending batch, so only each run's last
        # (largest) address is checked against its row's end, and each run gets its row's shift: repeated per run
        # (a small batch), or added by a slice (many addresses: in place, no per-address shift array). No per-address
        # home (a division), shift and end gathers.
        cuts = a.searchsorted(self.space.home_starts[h0 + 1:h1 + 1]).tolist()
        bounds = [0] * (h0 + 1) + cuts + [n] * (R - h1)
        sh, ends = self._rows_lists
        if a.size < _RUN_SHIFT_MIN:
            los, his = [0] + cuts, cuts + [a.size]
            lens = [hi - lo for lo, hi in zip(los, his)]
            last = a.take([hi - 1 for hi, n in zip(his, lens) if n]).tolist()
            if any(x + sh[r] >= ends[r] for x, r in zip(last, [r for r, n in zip(range(h0, h1 + 1), lens) if n])):
                return self._storage_index(a, "selected", allow_padding=False)  # raises, naming the first one
            return a + shift[h0:h1 + 1].repeat(lens), bounds
        ix = a + sh[h0]
        for r, lo, hi in zip(range(h0, h1 + 1), [0] + cuts, cuts + [a.size]):  # loop over home ranks
            if lo == hi:
                continue
            if r != h0:
                ix[lo:hi] += sh[r] - sh[h0]
            if int(ix[hi - 1]) >= ends[r]:
                return self._storage_index(a, "selected", allow_padding=False)  # raises, naming the first one
        return ix, bounds

    def _exchanges_of(self, plan: Plan) -> Exchanges:
        ps, bs = plan.policy_state, plan.buffer_state
        if not self.policy.exclusive:  # hisparse: copies into request buffers, victims' copies dropped
            return Exchanges.of(False, ps.miss_addrs, plan.move_src, ps.miss_slots, ps.victims, np.zeros(0, np.int64))
        peer = None
        if bs is not None:
            n = bs.miss_addrs.size
            peer = (bs.miss_addrs, bs.miss_rank, plan.move_src[plan.move_src.size - n:], self.buffers.base + bs.dests)
        return Exchanges.of(True, ps.miss_addrs, ps.miss_src, ps.dests, ps.victims, ps.hit_places, peer)

    def commit(self, plan: Plan) -> None:
        """Complete the plan's transfers (payload bytes of layer 0), then update the mappings."""
        if not isinstance(plan, Plan):
            raise ValueError(f"commit needs a Plan, got {type(plan).__name__}")
        if plan is not self._pending:
            raise ValueError("this plan is not the pending one (already committed, or planned on an older state)")
        self._move(plan, 0)
        self.policy.commit(plan)
        if self.buffers is not None:
            self.buffers.commit(plan)
        self.space.forget()
        plan.committed = True
        plan.layers_done = {0}
        self._pending, self._last = None, plan
        self._version += 1
        s = self._stats
        s["accesses"] += 1
        s["references"] += plan.num_refs
        s["unique_references"] += plan.num_unique
        s["hits"] += plan.num_hits
        s["misses"] += plan.num_misses
        s["local_hits"] += plan.num_local_hits
        s["exchanges"] += plan.num_exchanges
        s["peer_fetches"] += plan.num_peer_fetches
        self._count_transfers(plan)

    def replay(self, plan: Plan, layer: int | None = None) -> None:
        """Re-apply the transfers of the last committed plan for another layer of its indexer group (IndexShare).
        In payload mode this moves `layer`'s bytes (default: the next layer not yet moved)."""
        if not isinstance(plan, Plan):
            raise ValueError(f"replay needs a Plan, got {type(plan).__name__}")
        if plan is not self._last or not plan.committed:
            raise ValueError("replay needs the most recently committed plan")
        if self._data is not None:
            todo = [i for i in range(self.config.payload_layers) if i not in plan.layers_done]
            if layer is None:
                if not todo:
                    raise ValueError(f"every one of the {self.config.payload_layers} payload layers was moved already")
                layer = todo[0]
            layer = _int_scalar(layer, "layer")
            if layer not in todo:
                raise ValueError(f"layer {layer} is not a payload layer left to replay (left: {todo})")
            self._move(plan, layer)
            plan.layers_done.add(layer)
        self._stats["replays"] += 1
        self._count_transfers(plan)

    def _move(self, plan: Plan, layer: int) -> None:
        if self._data is None or plan.move_src.size == 0:
            return
        be, store = self.be, self._data
        src, dst = store.rows(plan.move_src), store.rows_to_write(plan.move_dst)  # (may grow the storage)
        data = store.data[:, layer, :]
        rows = be.to_numpy(be.gather_rows(be.asarray(data), be.asarray(src)))  # all reads first
        store.data[:, layer, :] = be.to_numpy(be.scatter_rows(be.asarray(data), be.asarray(dst), be.asarray(rows)))

    def _count_transfers(self, plan: Plan) -> None:
        """Rows and bytes of the plan's links (per-rank rows summed as Python ints: a few ranks, no reductions)."""
        s, rb = self._stats, self._row_bytes
        for key, per_rank in (("h2d_", plan.h2d_rows_per_rank), ("d2h_", plan.d2h_rows_per_rank),
                              ("peer_", plan.peer_rows_per_rank)):
            rows = sum(per_rank.tolist())
            s[key + "rows"] += rows
            s[key + "bytes"] += rows * rb

    # -- queries -------------------------------------------------------------------------------------------------------
    def locate(self, addrs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tier int8: 0 GPU / 1 CPU, rank, slot) of each address's current place (hisparse: its CPU entry)."""
        a = self._addresses(addrs, "addrs", allow_padding=False)
        tier, rank, slot = self.layout().decode(self._places(a, "addrs"))
        shape = np.shape(addrs)
        return tier.reshape(shape), rank.reshape(shape), slot.reshape(shape)

    def places(self, addrs) -> np.ndarray:
        """Current unified place (int64, see `layout()`) of each allocated address, same shape."""
        a = self._addresses(addrs, "addrs", allow_padding=False)
        return self._places(a, "addrs").reshape(np.shape(addrs))

    def layout(self) -> PlaceLayout:
        """How unified places map to (tier, rank, slot): GPU pools, CPU pools, TP local buffers."""
        pol, b = self.policy, self.buffers
        return PlaceLayout(num_ranks=pol.num_gpu_places // pol.gpu_seg, gpu_slots=self.config.gpu_slots,
                           gpu_seg=pol.gpu_seg, cpu_slots=self.config.cpu_slots,
                           buffer_slots=b.slots if b is not None else 0, buffer_seg=b.seg if b is not None else 0)

    def device_state(self) -> DeviceState:
        """Dense read-only snapshot of the pb-lru/lru state a device twin mirrors (sized by the budget; see
        layout.DeviceState). ValueError for hisparse or while a plan is pending."""
        self._idle("snapshot the device state")
        pol = self.policy
        if not pol.exclusive:
            raise ValueError(f"device_state covers pb-lru and lru, not {self.config.policy!r}")
        buckets = getattr(pol, "buckets", None)
        nbytes = pol.num_gpu_places // 8
        ring = buckets.ring if buckets is not None else np.zeros((0, nbytes), np.uint8)
        cold = buckets.cold if buckets is not None else np.zeros(0, np.uint8)
        ro = [np.ascontiguousarray(x) for x in (self.space.phys.astype(np.int64), pol.gpu.owner, pol.gpu.stamps,
                                                pol.gpu.free_bm, ring, cold)]
        for x in ro:
            x.setflags(write=False)
        clock = (buckets.epoch, pol.inserted, pol.epoch_volume) if buckets is not None else (0, 0, 0)
        return DeviceState(self.layout(), self.config.policy, int(pol.step),
                           buckets.num_recent if buckets is not None else 0, *ro, marker_size=self.space.size + 1,
                           epoch=int(clock[0]), epoch_inserted=int(clock[1]), epoch_volume=int(clock[2]))

    def num_free_slots(self, tier: int | None = None, rank: int | None = None) -> int:
        """Free token slots: tier 0 GPU, 1 CPU, None = logical slots a new token can take (GPU + CPU for pb-lru/lru,
        CPU for hisparse, whose GPU slots are per-request buffers). rank None = all ranks."""
        return self._slots(self.policy.free_slots(), tier, rank)

    def capacity_slots(self, tier: int | None = None, rank: int | None = None) -> int:
        """Total token slots, same conventions as num_free_slots."""
        return self._slots(self.policy.capacity(), tier, rank)

    def _slots(self, gc, tier, rank) -> int:
        g, c = gc
        if tier is None:
            per = g + c if self.policy.exclusive else c
        elif tier in (0, 1) and not isinstance(tier, bool):
            per = (g, c)[tier]
        else:
            raise ValueError(f"tier must be 0 (GPU), 1 (CPU) or None, got {tier!r}")
        if rank is None:
            return int(per.sum()) if (self.policy.exclusive or not self.tp) else int(per[0])
        return int(per[self._rank(rank)])

    @property
    def num_requests(self) -> int:
        return len(self.space.requests)

    def request_addresses(self, request_id: int) -> np.ndarray:
        rid = _int_scalar(request_id, "request_id")
        if rid not in self.space.requests:
            raise ValueError(f"unknown request {rid}")
        return self.space.requests[rid].addresses().copy()

    def stats(self) -> dict:
        """Cumulative counters over committed plans (replays add their transfers), bytes = rows x row_bytes; plus
        what is held now: allocated logical slots and the rows held per tier (copies and TP replicas included)."""
        out = {k: int(self._stats.get(k, 0)) for k in STAT_KEYS}
        for link in ("h2d", "d2h", "peer"):
            out[f"{link}_bytes"] = int(self._stats.get(f"{link}_bytes", 0))
        out["hit_rate"] = out["hits"] / out["unique_references"] if out["unique_references"] else 0.0
        out["row_bytes"] = self._row_bytes
        out["allocated_slots"] = int(self.space.num_allocated)
        out["requests"] = self.num_requests
        # Token rows held right now, every rank: entries (pb-lru/lru) or copies (hisparse buffers, replicas).
        gpu_rows, cpu_rows = self.policy.held_rows()
        out["gpu_rows_held"], out["cpu_rows_held"] = gpu_rows, cpu_rows
        out["local_buffer_rows_held"] = self.buffers.held() if self.buffers is not None else 0
        out["physical_rows_held"] = gpu_rows + cpu_rows + out["local_buffer_rows_held"]
        return out

    # -- payloads ------------------------------------------------------------------------------------------------------
    def _payload_places(self, addrs, what: str) -> tuple[np.ndarray, np.ndarray]:
        if self._data is None:
            raise ValueError("payloads need payload_bytes > 0 in the CacheConfig")
        a = self._addresses(addrs, what, allow_padding=False)
        return a, self._places(a, what)

    def _layer(self, layer) -> int:
        layer = _int_scalar(layer, "layer")
        if not 0 <= layer < self.config.payload_layers:
            raise ValueError(f"layer {layer} out of range: payload_layers is {self.config.payload_layers}")
        return layer

    def read(self, addrs, layer: int = 0) -> np.ndarray:
        """uint8 (len(addrs), payload_bytes): the bytes at each address's current (valid) place."""
        _, places = self._payload_places(addrs, "addrs")
        return self._data.read(places, self._layer(layer)).copy()

    def write(self, addrs, payload, layer: int = 0) -> None:
        """Store bytes for addresses (and refresh every cached copy of them)."""
        self._idle("write")
        a, places = self._payload_places(addrs, "addrs")
        layer = self._layer(layer)
        p = np.asarray(payload)
        if p.dtype != np.uint8 or p.shape != (a.size, self.config.payload_bytes):
            raise ValueError(f"payload must be uint8 of shape ({a.size}, {self.config.payload_bytes}), "
                             f"got {p.dtype} {p.shape}")
        if np.unique(a).size != a.size:
            raise ValueError("addrs holds an address twice")
        self._data.write(places, layer, p)
        for idx, copies in self._copies(a):
            self._data.write(copies, layer, p[idx])

    def _copies(self, a: np.ndarray):
        """(index into a, places) of GPU copies that duplicate the authoritative entries."""
        if self.buffers is not None:
            yield self.buffers.copies(a)
        resident = getattr(self.policy, "resident_places", None)
        if resident is not None:
            g = resident(a)
            held = np.flatnonzero(g >= 0)
            yield held, g[held]

    def read_local(self, addrs, rank: int, layer: int = 0) -> np.ndarray:
        """TP: the bytes rank `rank` computes with: its own pool for entries homed there, else its local-buffer copy.
        ValueError if a remote entry has no copy in the rank's buffer."""
        if self.buffers is None:
            raise ValueError("read_local needs mode 'tp' with policy pb-lru or lru")
        a, places = self._payload_places(addrs, "addrs")
        r = self._rank(rank)
        remote = self.space.home(a) != r
        bs = self.buffers.slots_of(a, r)
        if (remote & (bs < 0)).any():
            raise ValueError(f"address {int(a[remote & (bs < 0)][0])} has no copy in rank {r}'s local buffer")
        src = np.where(remote, self.buffers.base + r * self.buffers.seg + bs, places)
        return self._data.read(src, self._layer(layer)).copy()

    # -- checks --------------------------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """AssertionError naming the first broken invariant: mapping bijective, pools conserved, buckets exact,
        copies (hisparse buffers, TP local buffers) identical to their authoritative entries in payload mode."""
        self.policy.check_invariants()
        if self.buffers is not None:
            self.buffers.check()
        if self._data is not None:
            a = self.space.allocated()
            for idx, copies in self._copies(a):
                for layer in sorted(self._last.layers_done if self._last else {0}):
                    auth = self.space.places(a[idx]).astype(np.int64)
                    same = (self._data.read(copies, layer) == self._data.read(auth, layer)).all()
                    require(same, "a cached copy differs from its entry")


__all__ = ["UlaCache"]
