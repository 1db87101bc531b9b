"""Peak memory of a replay, estimated before it starts, and the refusal when it will not fit (issue 10 item 3).

What grows with a replay (each figure from what it will simulate, not from the hardware budgets):
- library caches: one per simulated indexer group (all groups during a pilot), each holding at most the history the
  run can hold at once (`RunBound`: entries, and the fullest DP rank's). What a cache allocates is *probed*: caches
  of the run's configuration are given tokens under tracemalloc (plus the library's re-laid tables, which live in
  mappings tracemalloc does not see: counted in full, as if every page were written) and split into what grows
  with each entry (address tables and per-address maps, separately for entries in the GPU tier and the CPU tier)
  and, under DP, the rows every rank keeps as long as the fullest rank's (the GPU pool). These are composed at the
  run's counts and grown by the library's own growth rule at its worst (`grown_ids`: no fitted margin). TP local
  buffers add their copies (`copies_held`), each cache keeps its last access plan (bytes per reference probed,
  every reference distinct), and where requests finish the free-id stacks hold up to the entries (`probe_freed`).
  A table re-laid into a new buffer is held twice for a moment: one cache's tables more. The pilot's caches are
  freed before the main phase grows, so the peak is the larger phase. The probes only estimate: no simulated
  choice reads them;
- address tables (sim/policy.py, shared by the groups: sim/tables.py): one, or one per group where TP caches may
  hand out different addresses; rows doubled from 4 until the simulated requests fit, each the longest request;
- per-access scratch: the access batch's references (addresses, places, masks, sort scratch), assumed
  `SCRATCH_BYTES_PER_REF` each, twice (the selection source's arrays and the library's);
- the timeline: one record per decode step (at most `workload.max_steps`), assumed `TIMELINE_BYTES_PER_STEP`;
- the process (interpreter, numpy, simpy, the workload, what the probes loaded): its resident set once they are
  done, + `ENGINE_BYTES` for what the engine builds after the check.
What the estimate leaves above the measured peak (bench/footprint_accuracy.py, bench/results/footprint_accuracy.json)
is bounds, not margins: pages not yet written at the peak (PB-LRU buckets not yet used, slots not yet stamped),
which a longer run may write; every reference of a step distinct (verify tokens share most of their selections);
TP local buffers and plans filled by distinct references; the fullest DP space as admission could make it.
The limit is the smallest of `--max-memory-gb`, what the machine has available (MemAvailable plus this process's
resident set) and an address-space rlimit (less what the process maps beyond its resident set).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import resource
import tracemalloc

import numpy as np

from ulacache.policies import POLICIES
from ulacache.rows import GROW_FLOOR, HEADROOM, SMALL_ROW

SCRATCH_BYTES_PER_REF = 64  # assumed: int64 address + int64 place + masks + argsort scratch of one reference
TIMELINE_BYTES_PER_STEP = 2048  # assumed: a dict of ~25 floats per decode step (CPython objects)
ENGINE_BYTES = 1 << 20  # assumed: what the engine builds after the check (simpy environment, cost tables, its arrays)
WORKER_BYTES = 64 << 20  # assumed: a group worker's own pages beyond its groups (copy-on-write heap, its buffers)
#                         and the C heap's top pad: measured 0.5-0.6 MB for sglang at 24 and 256 requests, 1-16 steps
PROBE_TOKENS = 1 << 17  # tokens a probe allocates at most (beyond: extrapolated per entry)
# The library's tables grow by its rule (ulacache/pools.py `_grown`): a row's first storage is what it needs; a
# long row then grows to need (1 + 1/HEADROOM), and a ragged row within 1/(2 HEADROOM) of full grows with its
# neighbours, so a long row holds at most GROWTH x its ids right after growing; a short row (< SMALL_ROW) doubles
# (<= 2 x its ids, and a row that doubled past SMALL_ROW holds <= 2 SMALL_ROW); every row is at least GROW_FLOOR
# and padded to 64. `grown_ids` is that worst case; nothing here is fitted to a measurement.
GROWTH = (1 + 1 / HEADROOM) / (1 - 1 / (2 * HEADROOM))
IDSTACK_GROWTH = 2.0  # free-id stacks (rows.IdStack.push) double


def grown_ids(ids: float, rows: int, ragged: bool = True, limit: float = math.inf) -> float:
    """Worst-case storage (ids) of `rows` rows holding `ids` ids in all, split evenly (TP homes are spread evenly;
    DP admission balances the ranks): per row max(GROW_FLOOR, g e, min(2 e, 2 SMALL_ROW)) + 64, e = ids / rows,
    g = GROWTH for ragged rows (rows.RaggedRows), 1 + 1/HEADROOM for rows sharing one length (rows.RankRows);
    a row never grows past its `limit` (the ids of its rank: the pool or address range it covers)."""
    if ids <= 0:
        return 0.0
    rows = max(1, int(rows))
    e = ids / rows
    g = GROWTH if ragged else 1 + 1 / HEADROOM
    return rows * max(e, min(limit, max(GROW_FLOOR, g * e, min(2 * e, 2 * SMALL_ROW)) + 64))


class MemoryLimitError(ValueError):
    """The replay's estimated peak is above the limit (a user error: exit 2, one line)."""


def _statm() -> tuple[int, int]:
    """(virtual size, resident set) of this process in bytes (Linux), else (0, maxrss)."""
    try:
        with open("/proc/self/statm") as fh:
            size, rss = (int(x) for x in fh.read().split()[:2])
        page = resource.getpagesize()
        return size * page, rss * page
    except OSError:
        return 0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mem_available_bytes() -> float:
    """MemAvailable of /proc/meminfo in bytes (inf where unreadable): what the machine can still give."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return math.inf


def limit_bytes(max_memory_gb: float | None) -> tuple[float, str]:
    """(limit, what sets it): --max-memory-gb where given (also above the machine's available memory: the estimate
    is an estimate, measured 11% under to 25% over whole runs' peaks, docs/gpu.md), else the available memory; an
    address-space rlimit binds either way."""
    vsize, rss = _statm()
    if max_memory_gb is not None:
        if not max_memory_gb > 0:
            raise ValueError(f"--max-memory-gb must be > 0, got {max_memory_gb}")
        options = [(max_memory_gb * 1e9, "--max-memory-gb")]
    else:
        options = [(mem_available_bytes() + rss, "available on this machine")]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and vsize:
        options.append((soft - max(vsize - rss, 0), "the address-space limit (ulimit -v / prlimit --as)"))
    return min(options, key=lambda o: o[0])


@contextlib.contextmanager
def probing():
    """tracemalloc on and the automatic garbage collector off for the block. Probe caches and their temporaries
    hold reference cycles (listeners are bound methods), so each measurement (`_held`) first collects the youngest
    generation: with the collector off that is exactly what was made since the last measurement (what a probe's
    window dropped), never older garbage, whose release in the middle of a window would read as a smaller cache.
    One collection of the two young generations at the outermost end frees every probe cache before the run builds
    its own (older generations are not walked: none of it is theirs). Tracing and gc are left as found."""
    was_tracing, was_enabled = tracemalloc.is_tracing(), gc.isenabled()
    if not was_tracing:
        tracemalloc.start()
    gc.disable()
    gc.collect(0)
    try:
        yield
    finally:
        if was_enabled:
            gc.collect(1)
            gc.enable()
        if not was_tracing:
            tracemalloc.stop()


def _held() -> int:
    """Bytes the process holds that the probes count, once the garbage made since the last call is gone (within
    `probing`): numpy's allocations (tracemalloc) plus the library's re-laid tables, which live in mappings of
    their own that tracemalloc does not see (ulacache.rows.mapped_bytes)."""
    from ulacache.rows import mapped_bytes

    gc.collect(0)
    return tracemalloc.get_traced_memory()[0] + mapped_bytes()


def _memo(make_cache, name: str) -> dict:
    """The probe results memoized on `make_cache` (a plain function object), else a throw-away dict."""
    return make_cache.__dict__.setdefault(name, {}) if hasattr(make_cache, "__dict__") else {}


def _one_request(make_cache, k: int):
    """(cache, n): a fresh cache holding one request of n = min(PROBE_TOKENS, its room) tokens on rank 0."""
    cache = make_cache(0, k)
    n = max(1, min(PROBE_TOKENS, _room(cache.config)))
    cache.alloc_many([0], np.array([n], dtype=np.int64), np.zeros(1, dtype=np.int64))
    return cache, n


def _probe_fill(build, counts: list[int]) -> tuple[float, float]:
    """(bytes when built, bytes added by allocating counts[r] tokens on rank r) of a cache from `build()`. The same
    allocation of one token per rank is made first, unmeasured: what the library's first use of a code path loads
    (lazy imports: ~1.5 MB measured for a first multi-rank allocation) is the process's, once, not the cache's."""
    build().alloc_many(list(range(len(counts))), np.ones(len(counts), dtype=np.int64), np.arange(len(counts)))
    base = _held()
    cache = build()
    built = _held()
    cache.alloc_many(list(range(len(counts))), np.array(counts, dtype=np.int64), np.arange(len(counts)))
    return float(built - base), float(_held() - built)


def _policy(c) -> type:
    """The policy class of cache configuration `c`: what its layout holds is asked of it, never re-derived here."""
    return POLICIES[c.policy]


def _gpu_room(c) -> float:
    """History entries one rank's GPU pool takes before the rest goes to the CPU tier (inf: the tiers do not split
    the history: no CPU tier, or the GPU holds copies of a full CPU history)."""
    return _policy(c).gpu_history_slots(c)


def _starved(c):
    """The configuration with a GPU pool of 64 slots per rank and the rest of its slots on the CPU (same places
    per rank, so the same table widths): its entries show what a CPU-tier entry costs."""
    g = min(64, c.gpu_slots)
    return dataclasses.replace(c, gpu_slots=g, cpu_slots=c.cpu_slots + c.gpu_slots - g,
                               local_buffer_slots=c.effective_local_buffer_slots)


def probe_cache(make_cache, k: int, entries: int, fullest: int) -> dict:
    """Bytes of one library cache built as the run builds them, holding `entries` history entries with at most
    `fullest` on one rank, from what probe caches of its configuration allocate (tracemalloc + the library's
    mappings). The parts: `fixed` (built, empty); `gpu_entry` (bytes per GPU-resident entry of rows grown per rank:
    address tables, per-address maps, pool rows in TP), `cpu_entry` (per entry in the CPU tier, from a cache whose
    GPU pool is 64 slots per rank; `gpu_entry` where the run's entries all fit the GPU) and, under DP,
    `shared_slot` (bytes per slot of the rows every rank keeps as long as the fullest rank's: the GPU pool's) from
    n tokens on one rank (b1) and on two (b2): gpu_entry = (b2 - b1) / n, shared_slot = (2 b1 - b2) / n.
    `bytes` composes them at the run's counts with the growth rule's worst case (`grown_ids`). Memoized."""
    memo = _memo(make_cache, "probes")
    key = (k, entries, fullest)
    if key in memo:
        return memo[key]
    from ulacache import UlaCache

    with probing():
        c = make_cache(0, k).config
        R = c.num_ranks
        dp = c.mode == "dp" and R > 1
        room = _gpu_room(c)
        n = int(max(1, min(PROBE_TOKENS, _room(c), (fullest if dp else entries), room * (1 if dp else R))))
        fixed, b1 = _probe_fill(lambda: make_cache(0, k), [n])
        gpu_entry, shared = b1 / n, 0.0
        if dp:
            _, b2 = _probe_fill(lambda: make_cache(0, k), [n, n])
            gpu_entry, shared = max(b2 - b1, 0.0) / n, max(2 * b1 - b2, 0.0) / n
        on_gpu = min(entries, R * room)
        cpu_entry = gpu_entry
        if entries > on_gpu:
            s = _starved(c)
            m = int(max(1, min(PROBE_TOKENS, _room(s), entries - on_gpu)))
            cpu_entry = _probe_fill(lambda: UlaCache(s), [m])[1] / m
    rows = R if not dp else max(1, min(R, int(entries)))
    per_entry = (gpu_entry * on_gpu + cpu_entry * (entries - on_gpu)) / max(entries, 1)
    # rows laid out like a rank's addresses end at its address range (its pools' slots; hisparse: its CPU copy)
    span = _policy(c).address_slots_per_rank(c)
    total = fixed + per_entry * grown_ids(entries, rows, limit=span)
    if shared:  # rows as long as the fullest rank's GPU share, up to the pool (its rows end at the padded pool)
        total += shared * grown_ids(min(fullest, room), 1, ragged=False, limit=-(-c.gpu_slots // 64) * 64)
    memo[key] = out = {"fixed": fixed, "gpu_entry": gpu_entry, "cpu_entry": cpu_entry, "shared_slot": shared,
                       "bytes": total}
    return out


def probe_copies(make_cache, k: int) -> tuple[float, float]:
    """(bytes per GPU copy of another rank's entry (TP local buffers, else 0), bytes per reference of the last access
    plan a cache keeps). A cache given PROBE_TOKENS tokens is accessed, under tracemalloc, in batches that fit (TP:
    until every rank's buffer is full), then once with one reference (so that the plan it keeps is small): bytes
    then / copies held (the buffer pool's rows, the slot maps' keys), and what the large batch's kept plan cost / its
    references (the larger of that and a scattered batch's, `_plan_bytes`). Memoized."""
    memo = _memo(make_cache, "copy_probes")
    if k in memo:
        return memo[k]
    from ulacache import CapacityError

    with probing():
        cache, n = _one_request(make_cache, k)
        c = cache.config
        slots = _policy(c).local_buffer_slots(c)
        per_copy = per_ref = 0.0
        addrs = cache.request_addresses(0)
        before = _held()
        batch, lo, fetched, plan = max(1, min(n, slots or n, c.gpu_slots)), 0, 0, None
        if batch:
            while lo < n and (fetched < c.num_ranks * slots or plan is None):
                try:
                    plan = cache.access(addrs[lo:lo + batch].reshape(1, 1, -1))
                except CapacityError:
                    if batch == 1:
                        break
                    batch //= 2
                    continue
                cache.commit(plan)
                fetched += int(plan.num_peer_fetches)
                lo += batch
            del plan
            filled = _held()
            try:
                cache.commit(cache.access(addrs[:1].reshape(1, 1, 1)))
            except CapacityError:
                pass
            settled = _held()
            held = min(fetched, c.num_ranks * slots)
            per_copy = max(settled - before, 0) / held if held else 0.0
            per_ref = max(filled - settled, 0) / batch
            per_ref = max(per_ref, _plan_bytes(cache, addrs, batch) / batch)
        del cache
    memo[k] = out = (per_copy, per_ref)
    return out


def _plan_bytes(cache, addrs: np.ndarray, batch: int) -> float:
    """Bytes the plan of an access to `batch` of `addrs` chosen at random (seeded: a top-k selection is scattered
    over the history, not a run of it; some plans keep more per reference for scattered misses) keeps in the cache,
    measured as what a one-reference access afterwards releases."""
    from ulacache import CapacityError

    pick = np.random.default_rng(0).choice(addrs, size=min(batch, addrs.size), replace=False)
    try:
        cache.commit(cache.access(pick.reshape(1, 1, -1)))
        filled = _held()
        cache.commit(cache.access(addrs[:1].reshape(1, 1, 1)))
    except CapacityError:
        return 0.0
    return float(max(filled - _held(), 0))


def probe_freed(make_cache, k: int) -> float:
    """Bytes per history entry a cache keeps once its request is freed (the free-id stacks, 8 bytes per id each):
    a cache given PROBE_TOKENS tokens on rank 0, then freed, under tracemalloc. Memoized."""
    memo = _memo(make_cache, "free_probes")
    if k in memo:
        return memo[k]
    with probing():
        cache, n = _one_request(make_cache, k)
        filled = _held()
        cache.free(0)
        memo[k] = out = max(_held() - filled, 0) / n
        del cache
    return out


def entries_held(cache_config, bound, k: int) -> int:
    """History entries plus GPU copies one cache may hold at stride k: the run's state (`RunBound`, every space) and
    the copies its configuration allows (TP local buffers of every rank; hisparse device buffers). A count of what
    is simulated, independent of how the library lays it out, so that decisions taken on it (the pilot's request
    stride) never change when the library's memory layout does."""
    c = cache_config
    return int(bound.cache_entries(k)) + int(_policy(c).gpu_copy_slots(c))


def copies_held(cache_config, bound, k: int, refs_per_step: int, steps: int | None = None) -> int:
    """GPU copies of other ranks' entries one cache may hold (TP local buffers): every rank's buffer full, at most
    the entries homed on the other ranks, and within `steps` policy steps (a pilot) at most what they reference."""
    c = cache_config
    slots = _policy(c).local_buffer_slots(c)
    if not slots or c.num_ranks < 2:
        return 0
    entries = int(bound.cache_entries(k))
    per_rank = min(int(slots), entries - entries // c.num_ranks)
    if steps is not None:
        per_rank = min(per_rank, steps * bound.cache_requests(k) * refs_per_step)
    return c.num_ranks * per_rank


def table_bytes(cache_config, bound, k: int, max_len: int) -> float:
    """One address table of the runner (sim/policy.AddressTable): rows doubled from 4 until the simulated
    requests fit, each as long as the longest request."""
    rows = 4 * 2 ** max(0, math.ceil(math.log2(max(bound.cache_requests(k), 4) / 4)))
    c = cache_config
    places = c.num_ranks * (c.gpu_slots + c.cpu_slots)
    return float(rows * (max_len + 1) * (4 if places < 2**31 - 1 else 8))  # + the padding column


def _room(c) -> int:
    """Tokens a probe may allocate on rank 0 of a cache of configuration c (TP spreads them over every rank's pools)."""
    policy = _policy(c)
    return policy.address_slots_per_rank(c) * policy.ranks_per_request(c)


def estimate(cfg, system, requests, make_cache, processes: int = 1) -> dict:
    """Estimated peak bytes of the replay, with its parts (all in bytes). `processes`: those the simulated groups
    run in (sim/group_workers.py): each one beyond the first holds its own access scratch and `WORKER_BYTES`
    (the caches are split between them, not copied)."""
    out = {"process_bytes": 0.0, "engine_bytes": float(ENGINE_BYTES), "caches_bytes": 0.0, "tables_bytes": 0.0,
           "scratch_bytes": 0.0, "workers_bytes": 0.0}
    outputs = np.asarray(requests["output_tokens"], dtype=np.int64)
    running = max(1, min(len(requests), cfg.workload.max_concurrency))
    steps = math.ceil(outputs.sum() / running) + int(outputs.max())
    max_steps = cfg.workload.max_steps or math.inf  # a run cut short records (and frees) no more than that
    out["timeline_bytes"] = float(min(steps, max_steps) * TIMELINE_BYTES_PER_STEP)
    with probing():
        _caches(cfg, requests, make_cache, out, max_steps)
    out["process_bytes"] = float(_statm()[1])  # after the probes: with what they loaded (their caches are gone)
    if make_cache is not None:  # the groups simulated after any pilot, split over the processes
        groups = 1 if cfg.fidelity.only_group >= 0 else cfg.fidelity.policy_groups or cfg.model.num_index_groups
        extra = max(0, min(processes, groups, cfg.model.num_index_groups) - 1)
        out["workers_bytes"] = extra * (out["scratch_bytes"] + WORKER_BYTES)
    out["peak_bytes"] = sum(v for key, v in out.items() if key.endswith("_bytes") and not key.startswith("probe"))
    return out


def _caches(cfg, requests, make_cache, out: dict, max_steps: float) -> None:
    """The library caches, address tables and access scratch of the larger phase, into `out`."""
    q, top_k = cfg.query_tokens, cfg.model.top_k
    outputs = np.asarray(requests["output_tokens"], dtype=np.int64)
    if make_cache is not None:
        from sim.policy import PolicyRunner

        bound = make_cache.bound
        phases = PolicyRunner.phases(cfg, bound, make_cache)  # [(caches held at once, request stride)]
        max_len = int(bound.totals[0])
        best = 0.0
        for i, (n_caches, k) in enumerate(phases):
            pilot = i < len(phases) - 1  # a pilot runs pilot_steps steps, then its caches go
            # policy steps the phase runs at most: a pilot's, or what workload.max_steps leaves (copies are made
            # and requests finish only within them)
            steps = min(cfg.fidelity.pilot_steps if pilot else math.inf, max_steps)
            parts = cache_bytes(make_cache, bound, k, q * top_k, None if steps == math.inf else int(steps),
                                frees=int(outputs.min()) <= q * steps)
            config = make_cache.config(k)
            # a table re-laid into a new buffer is held twice until its rows are copied: at most one cache's tables
            caches = n_caches * parts["cache"] + parts["history"]
            tables = (n_caches if config.mode == "tp" else 1) * table_bytes(config, bound, k, max_len)
            if caches + tables > best:
                best = caches + tables
                out["caches_bytes"], out["tables_bytes"] = caches, tables
                out["caches"], out["entries_per_cache"], out["request_stride"] = n_caches, fullest_space(bound, k), k
                out.update({f"probe_{key}": v for key, v in parts.items()})
        from sim.policy import SELECT_ELEMS

        refs = max(bound.cache_requests(k) * q * top_k for _, k in phases)
        # the library's and the source's per-reference arrays, + the selections fetched for several groups at once
        # (the source's result and its working copy, int64)
        out["scratch_bytes"] = 2.0 * refs * SCRATCH_BYTES_PER_REF + 2.0 * 8 * max(refs, SELECT_ELEMS)


def fullest_space(bound, k: int) -> int:
    """History entries the fullest admission space simulates at stride k: admission puts a request in the space
    with the most free slots (sim/engine.py `_space_for`), so a space taking its n-th request held no more than the
    mean of the others' reserved totals: (n - 1) x the smallest total <= the largest (max_running - 1) totals / spaces,
    and it simulates at most max(1, round(n / stride)) of them (sim/policy.py `admit`): those many of the largest
    totals. At most `RunBound.balanced_slots` (its mean share + one request)."""
    t = bound.totals
    if bound.num_spaces <= 1:
        return int(bound.balanced_slots(k))
    others = float(t[:max(bound.max_running - 1, 0)].sum()) / bound.num_spaces
    n = 1 + int(others // max(int(t[-1]), 1))
    simulated = max(1, math.floor(n / bound.stride(k) + 0.5))
    return int(min(bound.balanced_slots(k), t[:simulated].sum()))


def cache_bytes(make_cache, bound, k: int, refs_per_step: int, steps: int | None, frees: bool) -> dict:
    """One cache of a phase at stride k (`steps`: the policy steps it runs at most, None: to the end), in bytes: `history`
    (its entries, `probe_cache`), `copies` (TP local buffers full, `copies_held`, at the bytes per copy
    `probe_copies` measures, rows grown as `grown_ids` says up to the buffer), `last_plan` (the plan of its last
    access, kept until the next: per reference of every simulated request's selections, all distinct), `freed`
    (where requests finish within the phase: free-id stacks, up to the entries held, doubling) and `cache`, the sum."""
    config = make_cache.config(k)
    R = config.num_ranks
    fullest = fullest_space(bound, k)
    entries = min(bound.cache_entries(k), bound.num_spaces * fullest)
    hist = probe_cache(make_cache, k, entries, fullest)
    copies = copies_held(config, bound, k, refs_per_step, steps)
    per_copy, per_ref = probe_copies(make_cache, k)
    if copies:  # the buffers' rows (rows.RankRows) end at the padded buffer
        copies = grown_ids(copies, R, ragged=False, limit=-(-config.effective_local_buffer_slots // 64) * 64)
    out = {"history": hist["bytes"] - hist["fixed"], "copies": copies * per_copy,
           "last_plan": per_ref * bound.cache_requests(k) * refs_per_step,
           "freed": IDSTACK_GROWTH * probe_freed(make_cache, k) * entries if frees else 0.0}
    out["cache"] = hist["fixed"] + sum(out.values())
    out.update({key: hist[key] for key in ("gpu_entry", "cpu_entry", "shared_slot")})
    return out


def check(cfg, system, requests, make_cache, max_memory_gb: float | None = None, processes: int = 1) -> dict:
    """Estimate; raise MemoryLimitError (one line: the estimate, the limit, the knob that lowers it) if too big."""
    est = estimate(cfg, system, requests, make_cache, processes)
    limit, what = limit_bytes(max_memory_gb)
    est["limit_bytes"], est["limit_by"] = limit, what
    if est["peak_bytes"] > limit:
        raise MemoryLimitError(
            f"replay would need ~{est['peak_bytes'] / 1e9:.1f} GB at peak, above the {limit / 1e9:.1f} GB {what} "
            f"({_largest(est)}); lower it with {_knob(cfg, est)}")
    return est


def _largest(est: dict) -> str:
    if est.get("caches"):
        return (f"library caches {est['caches_bytes'] / 1e9:.1f} GB: {est['caches']} indexer groups x "
                f"{est['entries_per_cache']:,} history entries")
    return f"process {est['process_bytes'] / 1e9:.1f} GB, timeline {est['timeline_bytes'] / 1e9:.1f} GB"


def _knob(cfg, est: dict) -> str:
    fid = cfg.fidelity
    if not est.get("caches"):
        return f"workload.num_requests (now {cfg.workload.num_requests})"
    k = max(1, int(round(1.0 / fid.request_fraction)))
    knobs = [f"fidelity.request_fraction (now 1/{k})"]
    if 0 < fid.policy_groups < est["caches"] and fid.pilot_steps:
        knobs.insert(0, f"fidelity.pilot_steps=0 (the pilot holds all {est['caches']} groups)")
    elif est["caches"] > 1:
        knobs.insert(0, f"fidelity.policy_groups (now {fid.policy_groups or 'all'} of {cfg.model.num_index_groups})")
    knobs.append(f"workload.max_concurrency (now {cfg.workload.max_concurrency})")
    return ", ".join(knobs)
