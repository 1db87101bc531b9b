"""Runs the library's real policy on the trace's selections, on a sample of indexer groups and requests.

Fidelity knobs (config `fidelity.*`, see docs/cost-model.md "What is sampled"):
- `policy_groups`: the policy runs on that many indexer groups, a stratified sample. With `pilot_steps` > 0
  (default 8) every group is simulated for that many policy steps first; the groups' hit ratios measured over the
  pilot's warm second half are split into `policy_groups` bands (1-D clustering, layer-weighted), and the member
  nearest each band's mean is simulated from then on and stands for its band (per-reference ratios copied). With
  `pilot_steps: 0` the bands are cut up front on the generator's per-group target overlap, or, for captured
  selections, the leading shallow groups are kept apart and the rest is cut by index.
- `request_fraction`: per admission space, a request is simulated when fewer than max(1, round(running / s)) of the
  space's running requests are, s = `RunBound.stride(k)` (k = round(1 / fraction)): the share of its steady running
  requests a space can simulate with at least one sampled (s = k while a space runs many times k; under DP with few
  requests per rank, s = what one per rank is). Pools are scaled by the same 1/s (+ two whole requests of slack in
  the logical CPU tier, none on the GPU), so a simulated request sees the full system's pool slots per request;
  scaling by 1/k while the floor kept one request per space doubled (pilot: up to 8x) the pressure.
- `step_stride`: the policy runs every Nth decode step; steps in between reuse the last measured ratios.
- The pilot holds every group's cache at once; when that would exceed `PILOT_MAX_ENTRIES` (history entries and GPU
  copies the caches may hold, the cache factory's `entries_held` (sim/footprint.entries_held): a count of what is
  simulated, not the library's bytes, so a change of the library's memory layout never changes a result), the pilot runs on a coarser request sample (stride `pilot_k`, the smallest multiple of k that fits), and at its end the
  representatives' caches are rebuilt at stride k with the running requests re-admitted (their history placed as
  at admission, GPU-first) and warmed up by replaying the pilot's steps on them, uncounted. Memory then follows the
  simulated groups, not all groups.
An access batch whose working set does not fit at once (CapacityError: the GPU pool, or under TP a rank's local
buffer) is served in halves, recursively (by requests; a single request's by its verify tokens); `passes` reports the sub-batches, which the engine times as extra passes.
What comes out are *ratios per reference* (per rank): misses, unique, exchanges, rows per link, and `passes`. The engine turns them
into rows with the exact reference counts of the whole batch, so sampled and full runs share one code path.
"""
from __future__ import annotations

import math
import time

import numpy as np

from sim.policy_backend import cuda_context_here, device_pool_bytes
from sim.tables import GroupTables

# Group workers (sim/group_workers.py) are forked when the simulated groups' median step over the first PROBE_STEPS
# policy steps after the pilot takes FORK_MIN_STEP_S or more in one process (at once when those steps already took
# PROBE_STEPS x FORK_MIN_STEP_S: a paper-scale step at full fidelity takes seconds): a step's messages cost ~0.1 ms of wall
# and more of CPU (a pipe round trip with its pickling measured 74 us here). Measured on the 2-core box (groups'
# median step -> replay wall, 1 process -> 2): batch-1 HiSparse DP without drafts (0.7-0.9 ms) 6.0 -> 6.8 s, slower;
# with 4 drafts (1.2 ms) 6.7 -> 4.9 s; batch-1 UlaCache TP (1.5 ms) 10.6 -> 9.6 s; the pinned-keys TP (~10 ms)
# 22.4 -> 17.4 s (bench/results/group_workers_ab.json, scale.json).
PROBE_STEPS = 16
FORK_MIN_STEP_S = 0.001
# A run without a pilot whose decode step holds this many references over its simulated groups splits them over the
# processes before it builds any cache (PolicyRunner._split_first): ~0.1 s of a step at the ~10M references/s one
# core measured (34 ms per 327K-reference group-step, docs/gpu.md), far above what a split's messages cost. No step
# then runs in one process, and no child inherits caches it drops: full fidelity at cap 64, 2 processes, 64 steps
# 55.3 -> 45.4 s wall, peak RSS of all processes 7.5 -> 5.2 GB (bench/results/split_first_ab.json).
SPLIT_FIRST_MIN_REFS = 1 << 20
PILOT_MAX_ENTRIES = 24_000_000  # all pilot caches together: history entries + GPU copies (keeps a small run small)
SELECT_ELEMS = 1 << 21  # selected positions fetched from the source at once (int64: 16 MiB)
RATIO_KEYS = ("unique", "hits", "misses", "exchanges", "local_hits", "peer_fetches", "h2d", "d2h", "peer", "passes")


def shallow_groups(num_groups: int, num_layers: int, source=None) -> int:
    """Leading groups with little selection locality: the generator's `early_groups`, else those covering 2 layers."""
    spec = getattr(source, "spec", None)
    early = getattr(spec, "early_groups", None)
    if isinstance(early, int) and early >= 0:
        return min(early, max(num_groups - 1, 0))
    return min(num_groups, max(1, math.ceil(2 * num_groups / num_layers)))


def group_locality(source, num_groups: int) -> np.ndarray | None:
    """Per-group step-to-step overlap the selection source was built for (synthetic generator), else None."""
    plan = getattr(source, "plan", None)
    if plan is None:
        return None
    try:
        return np.array([float(plan(g).target_overlap) for g in range(num_groups)])
    except Exception:  # a source without per-group targets (captured selections)
        return None


def _sse(v: np.ndarray, w: np.ndarray) -> float:
    mean = float((v * w).sum() / w.sum())
    return float((w * (v - mean) ** 2).sum())


def stratify(value: np.ndarray, layers: np.ndarray, want: int) -> tuple[list[int], np.ndarray]:
    """Stratified sample of groups by a per-group value (hit ratio, locality): groups sorted by value are split into
    `want` bands by greedy divisive 1-D clustering (each split most reduces the layer-weighted squared error), and
    each band is represented by the member closest to its weighted mean. Returns (picked, representative per group).
    """
    n = value.size
    if want <= 0 or want >= n:
        return list(range(n)), np.arange(n)
    order = np.argsort(value, kind="stable")
    v, w = value[order].astype(float), layers[order].astype(float)
    bands = [(0, n)]
    while len(bands) < want:
        best = None
        for bi, (lo, hi) in enumerate(bands):
            if hi - lo < 2:
                continue
            whole = _sse(v[lo:hi], w[lo:hi])
            for cut in range(lo + 1, hi):
                gain = whole - _sse(v[lo:cut], w[lo:cut]) - _sse(v[cut:hi], w[cut:hi])
                if best is None or gain > best[0]:
                    best = (gain, bi, cut)
        if best is None:
            break
        _, bi, cut = best
        lo, hi = bands.pop(bi)
        bands[bi:bi] = [(lo, cut), (cut, hi)]
    rep = np.empty(n, dtype=np.int64)
    picked = []
    for lo, hi in bands:
        mean = (v[lo:hi] * w[lo:hi]).sum() / w[lo:hi].sum()
        pick = int(order[lo + int(np.argmin(np.abs(v[lo:hi] - mean)))])
        rep[order[lo:hi]] = pick
        picked.append(pick)
    return sorted(picked), rep


def sampled_groups(num_groups: int, want: int, shallow: int) -> list[int]:
    """Without per-group locality: all groups (want=0 or >= num_groups), else the shallow ones + band centres."""
    if want <= 0 or want >= num_groups:
        return list(range(num_groups))
    n_shallow = min(shallow, want - 1)
    picked = list(range(n_shallow))
    rest = want - n_shallow
    lo = n_shallow
    deep = np.linspace(lo, num_groups - 1, 2 * rest + 1)[1::2]  # centres of `rest` equal bands
    for g in deep:
        g = int(round(g))
        while g in picked and g < num_groups - 1:
            g += 1
        picked.append(g)
    return sorted(set(picked))


def group_map(num_groups: int, picked: list[int], shallow: int) -> np.ndarray:
    """For every group, the simulated group whose ratios it uses (itself if simulated; shallow ones stay apart)."""
    deep = [g for g in picked if g >= shallow] or picked
    early = [g for g in picked if g < shallow] or deep
    out = np.empty(num_groups, dtype=np.int64)
    for g in range(num_groups):
        pool = early if g < shallow else deep
        out[g] = g if g in picked else min(pool, key=lambda p: (abs(p - g), -p))
    return out


def release_memory() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise, and the pilot's peak would stay resident
    through the rest of the run)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _per_rank(rows, num_ranks: int) -> np.ndarray:
    """A plan's rows per rank as float64[num_ranks] (a replicated cache's single rank repeated)."""
    x = rows.astype(float) if isinstance(rows, np.ndarray) and rows.ndim == 1 else np.asarray(rows, float).reshape(-1)
    return x if x.size == num_ranks else np.resize(x, num_ranks)


def _link_rows(plan, num_ranks: int) -> np.ndarray:
    """A plan's (h2d, d2h, peer) rows per rank as one float64[3, num_ranks] array (`_per_rank` of each)."""
    links = (plan.h2d_rows_per_rank, plan.d2h_rows_per_rank, plan.peer_rows_per_rank)
    if all(isinstance(x, np.ndarray) and x.shape == (num_ranks,) for x in links):
        return np.array(links, dtype=float)
    if all(isinstance(x, np.ndarray) and x.shape == (1,) for x in links):  # a replicated cache: its one rank repeated
        return np.array(links, dtype=float).repeat(num_ranks, axis=1)
    return np.array([_per_rank(x, num_ranks) for x in links])


class AddressTable:
    """Position -> logical address of every simulated running request, one row per request. Each row ends with one
    padding column that stays -1, so position -1 (a selection's padding) reads -1 without a mask."""

    def __init__(self, max_len: int, dtype=np.int64):
        self.max_len = max_len
        self.width = max_len + 1
        self.table = np.full((4, self.width), -1, dtype=dtype)
        self.row_of: dict[int, int] = {}
        self.free_rows: list[int] = list(range(3, -1, -1))
        self.length: dict[int, int] = {}

    def add(self, rid: int, addrs: np.ndarray):
        if not self.free_rows:
            old = self.table.shape[0]
            self.table = np.concatenate([self.table, np.full((old, self.width), -1, dtype=self.table.dtype)])
            self.free_rows = list(range(2 * old - 1, old - 1, -1))
        row = self.free_rows.pop()
        self.row_of[rid] = row
        self.table[row, : addrs.size] = addrs
        self.length[rid] = addrs.size

    def append(self, rid: int, addrs: np.ndarray):
        row, n = self.row_of[rid], self.length[rid]
        if n + addrs.size > self.max_len:
            raise ValueError(f"request {rid} grew beyond its reserved length {self.max_len}")
        self.table[row, n:n + addrs.size] = addrs
        self.length[rid] = n + addrs.size

    def remove(self, rid: int):
        row = self.row_of.pop(rid)
        self.table[row, : self.length.pop(rid)] = -1
        self.free_rows.append(row)

    def lookup(self, rids: list[int], positions: np.ndarray, checked: bool = False) -> np.ndarray:
        """positions int64[R, q, k] (-1 padding) -> logical addresses (same shape, -1 padding), in the table's width
        (int32 when the cache's addresses fit: the library takes any integer width, and sorts int32 faster).
        `checked`: the source guarantees positions >= -1 (its `positions_checked`), so the scan is skipped."""
        positions = np.asarray(positions)
        if not checked and positions.size and positions.min() < -1:
            raise ValueError("selection positions must be >= 0 (-1 pads)")
        if len(rids) == 1:  # one request: its row, position -1 wraps to the padding column
            out = self.table[self.row_of[rids[0]]].take(positions)
        else:  # flat index row * width + position: -1 lands on the previous row's padding column (row 0: the last)
            rows = np.fromiter((self.row_of[r] for r in rids), dtype=np.int64, count=len(rids))
            out = self.table.take(positions + (rows * self.width)[:, None, None])
        return out


class PolicyRunner:
    """One library cache per simulated indexer group, fed with the selections of the simulated requests."""

    def __init__(self, cfg, system, source, max_request_tokens: int, make_cache, processes: int = 1):
        self.cfg, self.system, self.source = cfg, system, source
        model = cfg.model
        self.num_groups = model.num_index_groups
        self.want = cfg.fidelity.policy_groups
        self.layers = np.asarray(model.group_sizes())
        self.pilot_left = 0
        self.groups, self.group_of = self._first_groups()
        self.max_request_tokens = max_request_tokens
        self.make_cache = make_cache
        phases = self.phases(cfg, getattr(make_cache, "bound", None), make_cache)
        self.k, self.main_k = phases[0][1], phases[-1][1]
        self.bound = getattr(make_cache, "bound", None)
        self.ks = self._stride(self.k)
        self.stride = cfg.fidelity.step_stride
        # Caches built after the workers fork, each process its own share (`_split_first`): a device backend's
        # (cupy, torch: a CUDA context does not survive a fork), and a heavy run's without a pilot.
        self.device = bool(getattr(make_cache, "device", False))
        self.split_first = self._split_first(processes)
        self.caches = {} if self.split_first else {g: make_cache(g, self.k) for g in self.groups}
        self.tables = self._tables()
        self.sampled: dict[int, int] = {}  # rid -> rank of simulated requests
        self.sampled_per_space: dict[int, int] = {}
        self.space_of: dict[int, int] = {}
        self.last: dict[int, dict] = {}  # group -> last ratios
        self.group_totals: dict[int, np.ndarray] = {}  # group -> (hits, unique, refs) simulated so far
        self.query_chunk = system.query_chunk()  # verify tokens per access batch (HiSparse: what its buffer holds)
        self.policy_calls = 0
        self.capacity_splits = 0
        self.buffer_peak_rows = 0.0
        # Prompt KV placed in the CPU tier at admission arrives with the request (PD disaggregation): the library
        # counts it as D2H rows of the next plan; we take it out of the decode step and report it apart.
        self.prompt_cpu_rows: dict[int, np.ndarray] = {}
        self.prompt_rows = 0.0
        self.prompt_rows_own = 0.0
        self.pilot_log: list[tuple] = []  # (rids, hist, steps, q) of the pilot's steps, when it runs coarser
        self._per_rank_memo: dict = {}  # a step's references per rank (`_per_rank`'s key) -> `_divisors` of them
        self.num_ranks = system.capacity.ranks_per_space * system.capacity.num_spaces
        self.positions_checked = bool(getattr(source, "positions_checked", False))  # selections >= -1 by design
        # Processes for the groups (sim/group_workers.py): forked at the first step after the pilot, when the
        # groups simulated from then on are known; `workers` is None while this process runs every group.
        self.processes = max(1, int(processes))
        self.workers = None
        self.processes_used = 1  # processes the groups ran in (set at the fork)
        # the first steps after the pilot are timed (median: `probe_step_s`) before forking (`_probe`)
        self._probe_left = PROBE_STEPS if self.processes > 1 and len(self.groups) > 1 else 0
        self._probe_s: list[float] = []
        self.probe_step_s = None
        self._fork_due = False
        self.worker_rss_bytes = 0  # the children's largest private-memory samples, summed
        self.worker_device_bytes = 0  # what the children's device allocators held at their end, summed
        self._torch_threads = None  # torch's threads before a split (`after_fork`), given back at `close`
        if self.split_first:
            self._start_split()

    def _first_groups(self) -> tuple[list[int], np.ndarray]:
        """(simulated groups, the group each group's layers copy) at the start; sets `pilot_left` for a pilot."""
        fid = self.cfg.fidelity
        if fid.only_group >= 0:  # one group alone, standing for every layer
            return [fid.only_group], np.full(self.num_groups, fid.only_group)
        if self.want <= 0 or self.want >= self.num_groups:
            return list(range(self.num_groups)), np.arange(self.num_groups)
        if fid.pilot_steps > 0:  # all groups first; stratify on what they measured
            self.pilot_left = fid.pilot_steps
            return list(range(self.num_groups)), np.arange(self.num_groups)
        return self._upfront_groups()

    def _split_first(self, processes: int) -> bool:
        """Whether the caches are built after the split: on a device backend always; on numpy when the simulated
        groups are known now (no pilot), there are processes to split over, and a step's references over them reach
        SPLIT_FIRST_MIN_REFS (a short step is better off in one process: the probe then decides)."""
        if self.device:
            return True
        if self.pilot_left or processes < 2 or len(self.groups) < 2 or self.bound is None:
            return False
        b = self.bound
        refs = len(self.groups) * b.running_per_space() * b.num_spaces / self.ks * self.cfg.model.top_k
        return refs * self.cfg.query_tokens >= SPLIT_FIRST_MIN_REFS

    def _start_split(self) -> None:
        """The caches built after the split: over the processes now, before any exists (each process builds its own
        share), or all here on a device backend with a pilot or where this process holds a CUDA context already
        (children forked then could not use the device)."""
        if self.device and (self.pilot_left or cuda_context_here()):
            self.processes = 1
        self._probe_left = 0
        if self.processes > 1 and len(self.groups) > 1:
            self._fork_workers()
        else:
            self.keep_groups(self.groups)

    def _upfront_groups(self) -> tuple[list[int], np.ndarray]:
        """Groups stratified without measuring: on the generator's per-group locality, else shallow + band centres."""
        locality = group_locality(self.source, self.num_groups)
        if locality is not None:
            return stratify(locality, self.layers, self.want)
        shallow = shallow_groups(self.num_groups, self.cfg.model.num_layers, self.source)
        groups = sampled_groups(self.num_groups, self.want, shallow)
        return groups, group_map(self.num_groups, groups, shallow)

    @staticmethod
    def phases(cfg, bound, make_cache=None) -> list[tuple[int, int]]:
        """(caches held at once, request stride) of each phase: the pilot (all groups; with a `RunBound`, at the
        smallest multiple of the stride whose caches fit PILOT_MAX_ENTRIES), then the simulated groups."""
        num_groups, want = cfg.model.num_index_groups, cfg.fidelity.policy_groups
        k = max(1, int(round(1.0 / cfg.fidelity.request_fraction)))
        if cfg.fidelity.only_group >= 0:
            return [(1, k)]
        if want <= 0 or want >= num_groups:
            return [(num_groups, k)]
        if cfg.fidelity.pilot_steps <= 0:
            return [(want, k)]
        pilot_k = k
        if bound is None:
            return [(num_groups, pilot_k), (want, k)]
        held = getattr(make_cache, "entries_held", None)
        if held is not None:  # entries and copies each stride's caches hold (never the library's bytes)
            cost = lambda kk: num_groups * held(kk)  # noqa: E731
        else:
            cost = lambda kk: num_groups * bound.cache_entries(kk)  # noqa: E731
        limit = PILOT_MAX_ENTRIES  # coarser only while that samples fewer (each space keeps one)
        while cost(pilot_k) > limit and bound.stride(pilot_k) < bound.running_per_space():
            pilot_k += k
        return [(num_groups, pilot_k), (want, k)]

    def _stride(self, k: int) -> float:
        """The effective stride pools are scaled by at nominal stride k (`RunBound.stride`; k without a bound)."""
        return float(k) if self.bound is None else self.bound.stride(k)

    def _table(self, config) -> AddressTable:
        size = config.num_ranks * (config.gpu_slots + config.cpu_slots)
        return AddressTable(self.max_request_tokens, np.int32 if size < 2**31 - 1 else np.int64)

    def _tables(self) -> GroupTables:
        """The groups' address tables: one shared while their caches hand out the same addresses (sim/tables.py)."""
        if self.groups[0] in self.caches:
            config = self.caches[self.groups[0]].config
        else:  # (caches not built yet: a device backend's, built after the fork)
            config = self.make_cache.config(self.k)
        return GroupTables(self.groups, lambda: self._table(config))

    # ---- request lifecycle
    def admit(self, rid: int, space: int, rank: int, num_tokens: int, running_in_space: int,
              count_prompt: bool = True) -> bool:
        """Simulate this request if the space simulates fewer than max(1, round(running / stride)) of its running
        requests: the share its pools were scaled by (`RunBound.stride`), at least one per space."""
        count = self.sampled_per_space.get(space, 0)
        if count >= max(1, math.floor(running_in_space / self.ks + 0.5)):
            return False
        self.sampled_per_space[space] = count + 1
        self.space_of[rid] = space
        self.sampled[rid] = rank
        if self.workers is not None:
            self.workers.send("admit_groups", rid, rank, int(num_tokens), reply=True)
        placed = self.admit_groups(rid, rank, int(num_tokens))
        if self.workers is not None:
            for part in self.workers.gather():
                placed.update(part)
        for g in self.groups:
            cpu = placed[g]
            self.prompt_cpu_rows[g] = self.prompt_cpu_rows.get(g, 0) + cpu
            if g == self.groups[0] and count_prompt:
                self.prompt_rows += float(cpu.sum()) * self.ks  # one layer's rows, scaled to all requests
                self.prompt_rows_own += float(cpu.sum())  # the sampled requests' own (the prefill shares it out)
        return True

    def admit_groups(self, rid: int, rank: int, num_tokens: int) -> dict:
        """Admit into this process's caches: {group: its prompt rows placed in the CPU tier, per rank}."""
        out = {}
        self.tables.next_round()
        for g, cache in self.caches.items():
            addrs = cache.alloc(rid, num_tokens, rank=rank)
            self.tables.add(g, rid, addrs)
            tier, where, _ = cache.locate(addrs)
            n_ranks = cache.config.num_ranks
            out[g] = np.bincount(np.asarray(where)[np.asarray(tier) == 1], minlength=n_ranks)[:n_ranks]
        return out

    def grow(self, rids: list[int], counts: np.ndarray):
        """Allocate the accepted tokens of simulated requests (batched when the library offers it; one request, as
        at batch size 1, by the facade's scalar `alloc`)."""
        if len(rids) == 1:
            rid, c = rids[0], int(counts[0])
            rank = self.sampled.get(rid)
            if rank is None or c <= 0:
                return
            if self.workers is not None:
                self.workers.send("grow_one", rid, c, rank)
            self.grow_one(rid, c, rank)
            return
        keep = [(r, int(c)) for r, c in zip(rids, counts) if r in self.sampled and c > 0]
        if not keep:
            return
        ids = [r for r, _ in keep]
        cnt = np.array([c for _, c in keep], dtype=np.int64)
        ranks = np.array([self.sampled[r] for r in ids], dtype=np.int64)
        if self.workers is not None:
            self.workers.send("grow_many", ids, cnt, ranks)
        self.grow_many(ids, cnt, ranks)

    def grow_one(self, rid: int, c: int, rank: int) -> None:
        """One request's accepted tokens, in this process's caches."""
        self.tables.next_round()
        for g, cache in self.caches.items():
            self.tables.append(g, rid, cache.alloc(int(rid), c, rank=int(rank)))

    def grow_many(self, ids: list[int], cnt: np.ndarray, ranks: np.ndarray) -> None:
        """Several requests' accepted tokens, in this process's caches."""
        offsets = [0]
        for c in cnt.tolist():
            offsets.append(offsets[-1] + c)
        self.tables.next_round()
        for g, cache in self.caches.items():
            if hasattr(cache, "alloc_many"):
                addrs = cache.alloc_many(ids, cnt, ranks)
                if len(ids) == 1:
                    self.tables.append(g, ids[0], addrs)
                    continue
                for i, rid in enumerate(ids):
                    self.tables.append(g, rid, addrs[offsets[i]:offsets[i + 1]])
            else:
                for rid, c, rk in zip(ids, cnt.tolist(), ranks.tolist()):
                    self.tables.append(g, rid, cache.alloc(rid, c, rank=rk))

    def release(self, rid: int):
        if self.sampled.pop(rid, None) is None:
            return
        self.sampled_per_space[self.space_of.pop(rid)] -= 1
        if self.workers is not None:
            self.workers.send("release_groups", rid)
        self.release_groups(rid)

    def release_groups(self, rid: int) -> None:
        """Free a request in this process's caches."""
        for g, cache in self.caches.items():
            cache.free(rid)
            self.tables.remove(g, rid)

    # ---- one decode step
    def due(self, step: int) -> bool:
        return step % self.stride == 0 or not self.last

    def run_step(self, rids: list[int], hist: np.ndarray, steps: np.ndarray, q: int, spaces,
                 rid_ranks) -> dict[int, dict]:
        """Access every simulated group with the simulated requests' selections; returns ratios per group.
        `rids` are all running requests in admission order, `spaces`/`rid_ranks` theirs (for a pilot's re-admission)."""
        picked = self._simulated(rids, hist, steps)
        if picked is None:
            return self.last
        sids, s_hist, s_steps = picked
        per_rank = self._per_rank(sids, s_hist, q)
        if self.pilot_left and self.k != self.main_k:  # what the rebuilt caches replay to warm up (`_resample`)
            self.pilot_log.append((list(rids), np.asarray(hist).copy(), np.asarray(steps).copy(), q))
        if self._fork_due:  # (at a step's start: the children then hold every step they are asked for)
            self._fork_due = False
            self._fork_workers()
        self.last = self._ratios_of(self._step_everywhere(sids, s_hist, s_steps, q), per_rank)
        if self.pilot_left:
            self._pilot_step(rids, hist, spaces, rid_ranks)
        return self.last

    def _simulated(self, rids: list[int], hist: np.ndarray, steps: np.ndarray):
        """The simulated ones of the running requests, with their rows of `hist` and `steps`; None when none is."""
        sampled = self.sampled
        if len(rids) == 1:  # batch size 1
            return (rids, hist, steps) if rids[0] in sampled else None
        sel_idx = [i for i, r in enumerate(rids) if r in sampled]
        if not sel_idx:
            return None
        if len(sel_idx) == len(rids):  # every running request is simulated (full fidelity)
            return rids, hist, steps
        return [rids[i] for i in sel_idx], hist[sel_idx], steps[sel_idx]

    def _step_everywhere(self, sids: list[int], s_hist: np.ndarray, s_steps: np.ndarray, q: int) -> dict:
        """One step of every simulated group, here and in the group workers: {group: totals}. The first steps of a
        replay that could fork are timed (`_probe`)."""
        probing = not self.pilot_left and self.workers is None and self._probe_left > 0
        if probing:
            t0 = time.perf_counter()
        if self.workers is not None:  # the children step their groups while this process steps its own
            self.workers.send("step_groups_wire", sids, s_hist.tolist(), s_steps.tolist(), q, reply=True)
        step_totals = self._step_groups(sids, s_hist, s_steps, q)
        if probing:
            self._probe(time.perf_counter() - t0)
        if self.workers is not None:
            for part, splits in self.workers.gather():
                for g, totals in part.items():
                    totals["rows"] = np.array(totals["rows"], dtype=float)
                    step_totals[g] = totals
                self.capacity_splits += splits
        return step_totals

    def _ratios_of(self, step_totals: dict, per_rank) -> dict[int, dict]:
        """The step's ratios per group, in group order (a group's first step leaves out its prompt's CPU rows); a
        pilot step also adds the totals its stratification reads."""
        out = {}
        pilot = self.pilot_left > 0
        num_ranks = self.num_ranks
        for g in self.groups:  # in group order, whichever process stepped it
            totals = step_totals[g]
            prompt = self.prompt_cpu_rows.pop(g, None)
            if prompt is not None:
                rows = totals["rows"]  # (this step's own array)
                rows[1] = np.maximum(rows[1] - np.resize(prompt.astype(float), num_ranks), 0.0)  # d2h
            out[g] = self._ratios(totals, per_rank)
            if pilot:  # the pilot's stratification reads the groups' totals; nothing else does
                acc = self.group_totals.setdefault(g, np.zeros(3))
                acc += (totals["hits"], totals["unique"], totals["refs"])
            self.policy_calls += 1
        return out

    def _pilot_step(self, rids: list[int], hist: np.ndarray, spaces, rid_ranks) -> None:
        """Count a pilot step down: its warm second half is what it measures; at its end the representatives are
        chosen and, at another stride, their caches rebuilt (`_resample`)."""
        self.pilot_left -= 1
        if self.pilot_left == self.cfg.fidelity.pilot_steps // 2:  # measure on the warm second half
            self.pilot_base = {g: v.copy() for g, v in self.group_totals.items()}
        if not self.pilot_left:
            self._end_pilot()
            if self.k != self.main_k:
                self._resample(rids, hist, spaces, rid_ranks)
            release_memory()

    def _step_groups(self, sids: list[int], s_hist: np.ndarray, s_steps: np.ndarray, q: int) -> dict:
        """One step's access batches in this process's caches: {group: totals}."""
        out = {}
        chunk = self.query_chunk
        num_ranks = self.num_ranks
        checked = self.positions_checked
        for g, sel in self._selections(np.asarray(sids, dtype=np.int64), s_hist, s_steps, q, list(self.caches)):
            addrs = self.tables[g].lookup(sids, sel, checked)
            if q <= chunk:  # the whole step's verify tokens in one access batch
                totals = self._access(self.caches[g], addrs, num_ranks)
            else:
                totals = None
                for lo in range(0, q, chunk):  # HiSparse: verify tokens in chunks its buffer can hold
                    part = self._access(self.caches[g], addrs[:, lo:lo + chunk], num_ranks)
                    totals = part if totals is None else {k: totals[k] + part[k] for k in part}
                totals["passes"] /= math.ceil(q / chunk)  # sub-batches per chunk (1 = the batch fit at once)
            out[g] = totals
        return out

    # ---- group workers (sim/group_workers.py)
    def _probe(self, step_s: float) -> None:
        """Time the groups' first steps after the pilot (their wall seconds, an execution choice only: no result
        reads them); the group workers are forked at the next step when these take long enough for a split to pay
        for its messages."""
        self._probe_s.append(step_s)
        self._probe_left -= 1
        long_now = sum(self._probe_s) >= PROBE_STEPS * FORK_MIN_STEP_S  # long steps: no need to wait for 16
        if self._probe_left and not long_now:
            return
        self._probe_left = 0
        self.probe_step_s = sorted(self._probe_s)[len(self._probe_s) // 2]
        self._fork_due = long_now or self.probe_step_s >= FORK_MIN_STEP_S

    def step_groups_wire(self, sids: list[int], s_hist: list[int], s_steps: list[int], q: int) -> tuple[dict, int]:
        """`_step_groups` in a group worker, with the batch splits it counted (the parent's `capacity_splits`);
        inputs and link rows as Python lists (pickled in a fraction of the time of small arrays: a batch-1 step's
        round trip is most of its cost), the same int64 / float64 values."""
        splits = self.capacity_splits
        out = self._step_groups(sids, np.array(s_hist, dtype=np.int64), np.array(s_steps, dtype=np.int64), q)
        for totals in out.values():
            totals["rows"] = totals["rows"].tolist()
        return out, self.capacity_splits - splits

    def _fork_workers(self) -> None:
        """Split the simulated groups over `processes` (round robin in group order) and fork a child for each share
        but the last, which this process keeps: the smallest where they differ, as this process also runs the
        engine."""
        from sim.group_workers import GroupWorkers

        n = min(self.processes, len(self.groups))
        if n < 2:
            return
        shares = [self.groups[i::n] for i in range(n)]
        self.workers = GroupWorkers(self, shares[:-1])
        self.processes_used = n
        self.after_fork()
        self.keep_groups(shares[-1])

    def after_fork(self) -> None:
        """In each process of a split (the children call it first): torch computes in this process's thread only.
        The processes already use the cores, and a torch thread pool the parent started before the fork (OpenMP)
        hangs a child that enters it."""
        import sys

        torch = sys.modules.get("torch")
        if torch is not None and self.device:
            self._torch_threads = torch.get_num_threads()
            torch.set_num_threads(1)

    def keep_groups(self, groups: list[int]) -> None:
        """Drop the caches and tables of the groups not in `groups` (another process runs them); build those of
        `groups` not built yet (a device backend's, after the fork)."""
        keep = set(groups)
        for g in self.groups:
            if g not in keep:
                self.caches.pop(g, None)
                self.tables.drop(g)
        for g in groups:
            if g not in self.caches:
                self.caches[g] = self.make_cache(g, self.k)
        release_memory()

    def device_pool_bytes(self) -> int:
        """What this process's device allocator holds for its caches (sim/policy_backend.py); 0 on the host."""
        return device_pool_bytes() if self.device else 0

    def close(self) -> None:
        """Stop the group workers (the sum of their largest private-memory samples: `worker_rss_bytes`)."""
        if self.workers is not None:
            self.workers.close()
            self.worker_rss_bytes = self.workers.extra_rss_bytes
            self.worker_device_bytes = self.workers.extra_device_bytes
            self.workers = None
        if self._torch_threads:
            import sys

            sys.modules["torch"].set_num_threads(self._torch_threads)
            self._torch_threads = None

    def kill(self) -> None:
        """End the group workers at once (the run failed)."""
        if self.workers is not None:
            self.workers.kill()
            self.workers = None

    def _per_rank(self, sids: list[int], s_hist: np.ndarray, q: int) -> tuple:
        """`_divisors` of the step's simulated references per rank (q x min(history, top_k) per request), memoized
        on the exact inputs: TP (every rank sees every reference) on their total, DP on (ranks, references), so a
        fixed batch computes them once."""
        top_k = self.cfg.model.top_k
        memo = self._per_rank_memo
        if len(sids) == 1:  # batch size 1: Python numbers (the same float64 values)
            refs = float(q * min(int(s_hist[0]), top_k))
            key = refs if self.system.tp else (self.sampled[sids[0]], refs)
            per_rank = memo.get(key)
            if per_rank is None:
                if self.system.tp:
                    ref_rank = np.full(self.num_ranks, refs)
                else:
                    ref_rank = np.zeros(self.num_ranks)
                    ref_rank[key[0]] = refs  # (bincount's 0.0 + refs)
                per_rank = self._memo_per_rank(key, ref_rank)
            return per_rank
        per_req_refs = q * np.minimum(s_hist, top_k).astype(float)
        if self.system.tp:  # one value, the same step after step at a fixed batch
            key = per_req_refs.sum()
            per_rank = memo.get(key)
            if per_rank is None:
                per_rank = self._memo_per_rank(key, np.full(self.num_ranks, key))
            return per_rank
        sampled = self.sampled  # in admission order, as one add per request
        ranks = np.array([sampled[r] for r in sids], dtype=np.int64)
        key = (ranks.tobytes(), per_req_refs.tobytes())
        per_rank = memo.get(key)
        if per_rank is None:
            per_rank = self._memo_per_rank(key, np.bincount(ranks, weights=per_req_refs, minlength=self.num_ranks))
        return per_rank

    def _memo_per_rank(self, key, ref_rank: np.ndarray) -> tuple:
        if len(self._per_rank_memo) > 4096:
            self._per_rank_memo.clear()
        out = self._per_rank_memo[key] = self._divisors(ref_rank)
        return out

    @staticmethod
    def _divisors(ref_rank: np.ndarray) -> tuple:
        """What `_ratios` divides by, once per step: (max(ref_rank, 1), ranks without references, whether any),
        read-only (TP keeps it for the next steps)."""
        idle = ref_rank <= 0
        top = np.maximum(ref_rank, 1.0)
        top.setflags(write=False)
        idle.setflags(write=False)
        return top, idle, bool(idle.any())

    def _selections(self, rids: np.ndarray, hist: np.ndarray, steps: np.ndarray, q: int, groups: list[int]):
        """(group, selections) of each of `groups`: a few groups per source call when the source can select
        several at once (the synthetic generator computes groups of one geometry together), ~16 MiB at a time."""
        many = getattr(self.source, "select_groups", None)
        per = max(1, SELECT_ELEMS // max(1, rids.size * q * self.cfg.model.top_k)) if many is not None else 1
        for a in range(0, len(groups), per):
            part = groups[a:a + per]
            sels = many(rids, hist, steps, part, q) if many is not None else [
                self.source.select(rids, hist, steps, g, q) for g in part]
            yield from zip(part, sels)

    def _end_pilot(self):
        """Stratify groups on their measured hit ratio; keep simulating only the representatives."""
        base = getattr(self, "pilot_base", {})
        diff = {g: self.group_totals[g] - base.get(g, 0.0) for g in range(self.num_groups)}
        hit = np.array([diff[g][0] / max(diff[g][1], 1.0) for g in range(self.num_groups)])
        if self.k != self.main_k and np.ptp(hit) <= 1e-9:  # a coarse pilot told no group apart: the up-front rule
            self.groups, self.group_of = self._upfront_groups()
        else:
            self.groups, self.group_of = stratify(hit, self.layers, self.want)
        for g in list(self.caches):
            if g not in self.groups:
                del self.caches[g]
                self.tables.drop(g)
                self.group_totals.pop(g, None)
        self.last = {g: self.last[g] for g in self.groups}

    def _resample(self, rids: list[int], hist: np.ndarray, spaces, ranks):
        """After a coarse-sampled pilot: fresh caches at stride k for the representatives, the running requests
        re-admitted in admission order with their current history (not counted again as prompt loads), then the
        pilot's steps replayed on them uncounted: they continue warm, as the full system's caches do, instead of
        starting cold mid-run (1.8 points of GPU hit rate lost at 40 steps, TP h200 x 8, 64 running)."""
        self.k = self.main_k
        self.ks = self._stride(self.k)
        self.caches, self.tables = {}, None  # the pilot's caches go before the new ones are built
        release_memory()
        self.caches = {g: self.make_cache(g, self.k) for g in self.groups}
        self.tables = self._tables()
        self.sampled, self.sampled_per_space, self.space_of = {}, {}, {}
        self.prompt_cpu_rows = {}
        running: dict[int, int] = {}
        for rid, h, s, r in zip(rids, np.asarray(hist).tolist(), np.asarray(spaces).tolist(),
                                np.asarray(ranks).tolist()):
            running[s] = running.get(s, 0) + 1
            self.admit(int(rid), int(s), int(r), int(h), running[s], count_prompt=False)
        self._warm_up()

    def _warm_up(self):
        """Replay the pilot's steps (the requests sampled now that ran then) on the rebuilt caches, uncounted."""
        num_ranks = self.system.capacity.ranks_per_space * self.system.capacity.num_spaces
        splits = self.capacity_splits
        for rids, hist, steps, q in self.pilot_log:
            idx = [i for i, r in enumerate(rids) if r in self.sampled]
            if not idx:
                continue
            sids = [rids[i] for i in idx]
            for g in self.groups:
                sel = self.source.select(np.asarray(sids, dtype=np.int64), hist[idx], steps[idx], g, q)
                addrs = self.tables[g].lookup(sids, sel)
                for lo in range(0, q, self.query_chunk):
                    self._access(self.caches[g], addrs[:, lo:lo + self.query_chunk], num_ranks)
        self.capacity_splits, self.pilot_log = splits, []
        self.prompt_cpu_rows = {}  # the placement's D2H went to the warm-up's plans

    def _access(self, cache, addrs: np.ndarray, num_ranks: int) -> dict:
        try:
            plan = cache.access(addrs)
        except _capacity_error():
            rows, q = addrs.shape[0], addrs.shape[1] if addrs.ndim == 3 else 1
            if rows <= 1 and q <= 1:
                raise
            self.capacity_splits += 1  # the working set does not fit at once: serve the batch in two halves
            if rows > 1:  # by requests
                half = rows // 2
                a, b = self._access(cache, addrs[:half], num_ranks), self._access(cache, addrs[half:], num_ranks)
            else:  # one request: by its verify tokens (a rank's share of its working set above the pool)
                half = q // 2
                a = self._access(cache, addrs[:, :half], num_ranks)
                b = self._access(cache, addrs[:, half:], num_ranks)
            return {k: a[k] + b[k] for k in a}
        cache.commit(plan)
        return {
            "passes": 1.0,  # one library access: the working set fit (a split batch sums its halves' passes)
            "refs": float(plan.num_refs), "unique": float(plan.num_unique), "hits": float(plan.num_hits),
            "misses": float(plan.num_misses), "exchanges": float(plan.num_exchanges),
            "local_hits": float(getattr(plan, "num_local_hits", 0)),
            "peer_fetches": float(getattr(plan, "num_peer_fetches", 0)),
            "rows": _link_rows(plan, num_ranks),  # float64[3, num_ranks]: h2d, d2h, peer rows per rank
        }

    def _ratios(self, t: dict, per_rank: tuple) -> dict:
        """Per-reference ratios of one group's totals; `per_rank` = (max(ref_rank, 1), ranks without simulated
        references, whether there are any), the step's (run_step)."""
        total_ref_rank, idle, any_idle = per_rank
        refs = max(t["refs"], 1.0)
        out = {"unique": t["unique"] / refs, "hits": t["hits"] / refs, "misses": t["misses"] / refs,
               "exchanges": t["exchanges"] / refs, "local_hits": t["local_hits"] / refs,
               "peer_fetches": t["peer_fetches"] / refs,
               "passes": t["passes"]}  # sub-batches the access batch was served in (not per reference)
        rows = t["rows"]  # the three links at once
        ratio = _divide(rows, total_ref_rank)
        if any_idle:  # ranks without simulated requests: the global ratio (a row's sum is its link's own sum)
            _copyto(ratio, _divide(_add_reduce(rows, 1), refs)[:, None], where=idle)  # (rows.sum(axis=1) / refs)
        out["h2d"], out["d2h"], out["peer"] = ratio
        out["links"] = ratio  # the three at once (float64[3, ranks]), for callers that scale them together
        return out


_divide, _copyto, _add_reduce = np.divide, np.copyto, np.add.reduce  # (the ufuncs without their wrappers' dispatch)


def _capacity_error():
    """ulacache.CapacityError (imported on first use: `import sim` does not load the library)."""
    global _CAPACITY_ERROR
    if _CAPACITY_ERROR is None:
        from ulacache import CapacityError

        _CAPACITY_ERROR = CapacityError
    return _CAPACITY_ERROR


_CAPACITY_ERROR = None
