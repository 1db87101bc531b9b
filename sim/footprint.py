"""Peak memory of a replay, estimated before it starts, and the refusal when it will not fit (issue 10 item 3).

What grows with a replay (each figure from what it will simulate, not from the hardware budgets):
- library caches: one per simulated indexer group (all groups during a pilot), each holding at most the history the
  run can hold at once (`RunBound`). A cache's cost is *probed*: a cache of the run's configuration is built and
  given tokens under tracemalloc (plus the library's re-laid tables, which live in mappings tracemalloc does not
  see: `_held`, counted in full though untouched zero pages cost nothing) for both extreme placements of the phase's history: all in one space (DP: storage
  kept in rows as long as the fullest rank's then costs every rank's row) and spread evenly over the spaces (storage
  kept per rank then costs every rank's); the larger counts (`probe_cache`), x GROWTH for storage that grows by
  doubling. TP local buffers add their copies (`copies_held`: every rank's buffer full, a pilot's at most what its
  steps reference) at the bytes per copy `probe_copies` measures, and each cache keeps its last access plan (bytes
  per reference probed too); the phase that runs to the end also frees requests, whose ids wait in free-id stacks
  (`probe_freed`). The pilot's caches are freed (and the heap trimmed) before the main phase grows, so the
  peak is the larger phase. The probes only estimate: no simulated choice reads them;
- address tables (sim/policy.py, shared by the groups: sim/tables.py): one, or one per group where TP caches may
  hand out different addresses; rows doubled from 4 until the simulated requests fit, each the longest request;
- per-access scratch: the access batch's references (addresses, places, masks, sort scratch), assumed
  `SCRATCH_BYTES_PER_REF` each, twice (the selection source's arrays and the library's);
- the timeline: one record per decode step, assumed `TIMELINE_BYTES_PER_STEP`;
- the process as it is now (interpreter, numpy, pandas, simpy, the workload): its resident set at the check.
bench/memory_bench.py compares the estimate with the measured peaks (bench/results/memory.json).
The limit is the smallest of `--max-memory-gb`, what the machine has available (MemAvailable plus this process's
resident set) and an address-space rlimit (less what the process maps beyond its resident set).
"""
from __future__ import annotations

import contextlib
import gc
import math
import resource
import tracemalloc

import numpy as np

SCRATCH_BYTES_PER_REF = 64  # assumed: int64 address + int64 place + masks + argsort scratch of one reference
TIMELINE_BYTES_PER_STEP = 2048  # assumed: a dict of ~25 floats per decode step (CPython objects)
GROWTH = 1.5  # the library's storage grows by doubling: 1x-2x the entries it holds (with the fullest-rank bound:
#               above every measured peak, bench/results/memory.json; 2x refused DP replays that fit)
PROBE_TOKENS = 1 << 17  # tokens a probe allocates at most (beyond: extrapolated per entry)


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


def _mem_available() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return math.inf


def limit_bytes(max_memory_gb: float | None) -> tuple[float, str]:
    """(limit, what sets it): --max-memory-gb, the machine's available memory, or an address-space rlimit."""
    vsize, rss = _statm()
    options = [(_mem_available() + rss, "available on this machine")]
    if max_memory_gb is not None:
        if not max_memory_gb > 0:
            raise ValueError(f"--max-memory-gb must be > 0, got {max_memory_gb}")
        options.append((max_memory_gb * 1e9, "--max-memory-gb"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and vsize:
        options.append((soft - max(vsize - rss, 0), "the address-space limit (ulimit -v / prlimit --as)"))
    return min(options, key=lambda o: o[0])


@contextlib.contextmanager
def _traced():
    """tracemalloc on for the block (left as found: a caller that already traces keeps tracing). Garbage is collected
    first: caches left in reference cycles would otherwise release their tables in the middle of a probe."""
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        yield
    finally:
        if not was_tracing:
            tracemalloc.stop()


def _held() -> int:
    """Bytes the process holds that the probes count: numpy's allocations (tracemalloc) plus the library's re-laid
    tables, which live in mappings of their own that tracemalloc does not see (ulacache.pools.mapped_bytes)."""
    from ulacache.pools import mapped_bytes

    return tracemalloc.get_traced_memory()[0] + mapped_bytes()


def _memo(make_cache, name: str) -> dict:
    """The probe results memoized on `make_cache` (a plain function object), else a throw-away dict."""
    return make_cache.__dict__.setdefault(name, {}) if hasattr(make_cache, "__dict__") else {}


def _one_request(make_cache, k: int):
    """(cache, n): a fresh cache holding one request of n = min(PROBE_TOKENS, its room) tokens on rank 0."""
    cache = make_cache(0, k)
    n = max(1, min(PROBE_TOKENS, _room(cache)))
    cache.alloc_many([0], np.array([n], dtype=np.int64), np.zeros(1, dtype=np.int64))
    return cache, n


def _probe_fill(make_cache, k: int, counts: list[int]) -> tuple[float, float]:
    """(bytes when built, bytes added by allocating counts[r] tokens on rank r)."""
    base = _held()
    cache = make_cache(0, k)
    built = _held()
    cache.alloc_many(list(range(len(counts))), np.array(counts, dtype=np.int64), np.arange(len(counts)))
    filled = _held()
    del cache
    gc.collect()  # its tables go now, not in the middle of the next probe
    return float(built - base), float(filled - built)


def probe_cache(make_cache, k: int, entries: int, fullest: int) -> tuple[float, float]:
    """(fixed bytes, bytes of the history) of one library cache built as the run builds them, holding `entries`
    history entries with at most `fullest` in one space: the larger of the two extreme placements. All in one
    space: `fullest` tokens on rank 0. Spread (DP): f = entries / R on every rank, from a probe of f tokens on one
    rank (b1) and on two (b2): b1 + (R - 1) (b2 - b1), since storage kept in rows as long as the fullest rank's
    costs the same for both and storage kept per rank grows by one rank's. Probes allocate at most PROBE_TOKENS
    per rank and are scaled per entry beyond. Memoized on `make_cache`."""
    memo = _memo(make_cache, "probes")
    key = (k, entries, fullest)
    if key in memo:
        return memo[key]
    with _traced():
        cache = make_cache(0, k)
        room, ranks = _room(cache), cache.config.num_ranks
        dp = cache.config.mode == "dp" and ranks > 1
        del cache
        n = max(1, min(fullest, PROBE_TOKENS, room))
        fixed, one = _probe_fill(make_cache, k, [n])
        fills = [one * max(fullest, 1) / n]
        if dp:
            f = min(-(-entries // ranks), fullest)
            n = max(1, min(f, PROBE_TOKENS, room))
            _, b1 = _probe_fill(make_cache, k, [n])
            _, b2 = _probe_fill(make_cache, k, [n, n])
            fills.append((b1 + (ranks - 1) * max(b2 - b1, 0.0)) * max(f, 1) / n)
    memo[key] = out = (fixed, max(fills))
    return out


def probe_copies(make_cache, k: int) -> tuple[float, float]:
    """(bytes per GPU copy of another rank's entry (TP local buffers, else 0), bytes per reference of the last access
    plan a cache keeps). A cache given PROBE_TOKENS tokens is accessed, under tracemalloc, in batches that fit (TP:
    until every rank's buffer is full), then once with one reference (so that the plan it keeps is small): bytes
    then / copies held (the buffer pool's rows, the slot maps' keys), and what the large batch's kept plan cost / its
    references. Memoized."""
    memo = _memo(make_cache, "copy_probes")
    if k in memo:
        return memo[k]
    from ulacache import CapacityError

    with _traced():
        cache, n = _one_request(make_cache, k)
        c = cache.config
        slots = c.effective_local_buffer_slots if c.mode == "tp" and c.policy != "hisparse" else 0
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
        del cache
    memo[k] = out = (per_copy, per_ref)
    return out


def probe_freed(make_cache, k: int) -> float:
    """Bytes per history entry a cache keeps once its request is freed (the free-id stacks, 8 bytes per id each):
    a cache given PROBE_TOKENS tokens on rank 0, then freed, under tracemalloc. Memoized."""
    memo = _memo(make_cache, "free_probes")
    if k in memo:
        return memo[k]
    with _traced():
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
    if c.policy == "hisparse":
        copies = c.num_ranks * c.gpu_slots
    elif c.mode == "tp":
        copies = c.num_ranks * c.effective_local_buffer_slots
    else:
        copies = 0
    return int(bound.cache_entries(k)) + int(copies)


def copies_held(cache_config, bound, k: int, refs_per_step: int, steps: int | None = None) -> int:
    """GPU copies of other ranks' entries one cache may hold (TP local buffers): every rank's buffer full, at most
    the entries homed on the other ranks, and within `steps` policy steps (a pilot) at most what they reference."""
    c = cache_config
    if c.mode != "tp" or c.policy == "hisparse" or c.num_ranks < 2:
        return 0
    entries = int(bound.cache_entries(k))
    per_rank = min(int(c.effective_local_buffer_slots), entries - entries // c.num_ranks)
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


def _room(cache) -> int:
    """Tokens the probe may allocate on rank 0 (TP spreads them over every rank's pools)."""
    c = cache.config
    per_rank = c.cpu_slots if c.policy == "hisparse" else c.gpu_slots + c.cpu_slots
    return per_rank * (c.num_ranks if c.mode == "tp" and c.policy != "hisparse" else 1)


def estimate(cfg, system, requests, make_cache) -> dict:
    """Estimated peak bytes of the replay, with its parts (all in bytes)."""
    _, rss = _statm()
    out = {"process_bytes": float(rss), "caches_bytes": 0.0, "tables_bytes": 0.0, "scratch_bytes": 0.0}
    q, top_k = cfg.query_tokens, cfg.model.top_k
    outputs = np.asarray(requests["output_tokens"], dtype=np.int64)
    running = max(1, min(len(requests), cfg.workload.max_concurrency))
    steps = math.ceil(outputs.sum() / running) + int(outputs.max())
    out["timeline_bytes"] = float(steps * TIMELINE_BYTES_PER_STEP)
    if make_cache is not None:
        from sim.policy import PolicyRunner

        bound = make_cache.bound
        phases = PolicyRunner.phases(cfg, bound, make_cache)  # [(caches held at once, request stride)]
        max_len = int(bound.totals[0])
        best = 0.0
        for i, (n_caches, k) in enumerate(phases):
            config = make_cache.config(k)
            fixed, fill = probe_cache(make_cache, k, bound.cache_entries(k), bound.balanced_slots(k))
            pilot = cfg.fidelity.pilot_steps if i < len(phases) - 1 else None  # a pilot runs pilot_steps steps
            copies = copies_held(config, bound, k, q * top_k, pilot)
            per_copy, per_ref = probe_copies(make_cache, k)
            # each cache keeps its last access plan: with TP local buffers, per-rank arrays of every reference (a DP
            # or hisparse plan's, measured ~0.5 MB in the pinned-keys pilots, is within the fill's margin)
            last_plan = per_ref * bound.cache_requests(k) * q * top_k if copies else 0.0
            # the phase that runs to the end frees requests: the free-id stacks hold up to the entries held
            freed = probe_freed(make_cache, k) * bound.cache_entries(k) if pilot is None else 0.0
            caches = n_caches * (fixed + GROWTH * (fill + copies * per_copy + freed) + last_plan)
            tables = (n_caches if config.mode == "tp" else 1) * table_bytes(config, bound, k, max_len)
            if caches + tables > best:
                best = caches + tables
                out["caches_bytes"], out["tables_bytes"] = caches, tables
                out["caches"], out["entries_per_cache"], out["request_stride"] = n_caches, bound.balanced_slots(k), k
                out["probe_fixed_bytes"], out["probe_history_bytes"] = fixed, fill
                out["copies_per_cache"], out["probe_copy_bytes"], out["probe_plan_ref_bytes"] = copies, per_copy, per_ref
                out["probe_freed_bytes"] = freed
        from sim.policy import SELECT_ELEMS

        refs = max(bound.cache_requests(k) * q * top_k for _, k in phases)
        # the library's and the source's per-reference arrays, + the selections fetched for several groups at once
        # (the source's result and its working copy, int64)
        out["scratch_bytes"] = 2.0 * refs * SCRATCH_BYTES_PER_REF + 2.0 * 8 * max(refs, SELECT_ELEMS)
    out["peak_bytes"] = sum(v for key, v in out.items() if key.endswith("_bytes") and not key.startswith("probe"))
    return out


def check(cfg, system, requests, make_cache, max_memory_gb: float | None = None) -> dict:
    """Estimate; raise MemoryLimitError (one line: the estimate, the limit, the knob that lowers it) if too big."""
    est = estimate(cfg, system, requests, make_cache)
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
