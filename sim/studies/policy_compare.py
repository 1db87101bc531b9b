"""`ulacache policy-compare`: one layer group's reference stream replayed through our policies and libCacheSim's.

The reference stream (what every policy sees, defined once so that hit-for-hit comparison means something):
- Requests: the first `num_requests` of the trace (default all) in arrival order, decoded `concurrency` at a time
  (continuous batching: a request starts when one finishes; arrival times are not modelled), for at most
  `max_steps` engine steps. Request i decodes its `output_tokens` steps;
  at its decode step s it selects top-k positions of a history of `input_tokens + s` positions (the trace's
  selection source, `query_tokens` selections per step: speculative verify tokens).
- One **batch** per engine step: the union of the running requests' selections for `group`. A position is the
  pair (request, position), numbered `offset[request] + position` (the stream's object id).
- Every position starts in the CPU tier and the GPU pool starts empty, so each GPU entry arrives through a
  reference (a demand cache, the same for every policy). Positions of tokens decoded later are allocated up front;
  finished requests are never freed during the replay (their entries age out like any other).
- Our policies (the library, `access` + `commit` per batch) deduplicate a batch and process it as a unit: every
  entry of the batch is resident together, the batch's hits are never evicted for its misses.
- libCacheSim processes one request at a time. It gets each batch's distinct positions ordered by their previous
  reference in the stream, most recent first (positions never referenced before last, by id). For LRU this puts every hit of
  the batch before every miss (the LRU stack property), so a sequential LRU never evicts what the batch still
  uses and each batch has the same hits as ours while the earlier state agrees.
Remaining differences (documented in the output JSON): entries touched in the same batch are equally recent to our
exact LRU, which breaks the tie by lowest GPU slot, while a sequential cache ranks them by feed order; and a
sequential policy may evict an entry the batch already used (S3-FIFO, ARC, Belady), which a batch cache keeps.
Hit ratio = hits / distinct references, counted over the batches from step `warmup_steps` on.
"""
from __future__ import annotations

import dataclasses

import numpy as np

OURS = ("pb-lru", "lru")


@dataclasses.dataclass
class ReferenceStream:
    """Deduplicated, ordered references of one layer group: batch b is ids[bounds[b]:bounds[b + 1]]."""

    ids: np.ndarray  # int64 object ids (offset[request] + position), per batch in feed order
    bounds: np.ndarray  # int64[num_batches + 1]
    num_refs: np.ndarray  # int64 references per batch before deduplication (-1 padding left out)
    lengths: np.ndarray  # int64 positions allocated per request (input + output tokens)
    group: int
    top_k: int

    @property
    def num_batches(self) -> int:
        return int(self.bounds.size - 1)

    @property
    def num_positions(self) -> int:
        return int(self.lengths.sum())

    def batch(self, b: int) -> np.ndarray:
        return self.ids[self.bounds[b]:self.bounds[b + 1]]

    def next_use(self) -> np.ndarray:
        """int64 index in `ids` of each reference's next reference, INT64_MAX when there is none (for Belady)."""
        n = self.ids.size
        order = np.argsort(self.ids, kind="stable")
        nxt = np.full(n, np.iinfo(np.int64).max, np.int64)
        same = self.ids[order][1:] == self.ids[order][:-1]
        nxt[order[:-1][same]] = order[1:][same]
        return nxt


def _schedule(out_tokens: np.ndarray, concurrency: int, max_steps: int):
    """Yield (step, running request indices, their decode steps): continuous batching with `concurrency` slots."""
    n = out_tokens.size
    start = np.full(n, -1, np.int64)
    nxt, running, step = 0, [], 0
    while (running or nxt < n) and step < max_steps:
        while len(running) < concurrency and nxt < n:
            start[nxt] = step
            running.append(nxt)
            nxt += 1
        idx = np.array(running, dtype=np.int64)
        yield step, idx, step - start[idx]
        running = [i for i in running if step - start[i] + 1 < out_tokens[i]]
        step += 1


def extract_stream(trace, group: int | None = None, num_requests: int | None = None, concurrency: int = 8,
                   query_tokens: int = 1, max_steps: int = 256) -> ReferenceStream:
    """The reference stream of one layer group (see the module docstring); `group` None = the middle group."""
    sel = trace.selections
    num_groups = int(sel.num_groups)
    group = num_groups // 2 if group is None else group
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or not 0 <= group < num_groups:
        raise ValueError(f"--group must be an integer in [0, {num_groups}), got {group!r}")
    num_requests = len(trace.requests) if num_requests is None else num_requests
    for name, v, lo in (("--num-requests", num_requests, 1), ("--concurrency", concurrency, 1),
                        ("--query-tokens", query_tokens, 1), ("--max-steps", max_steps, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if max_steps > 100_000:
        raise ValueError(f"--max-steps must be <= 100000, got {max_steps}")
    if query_tokens > 16:
        raise ValueError(f"--query-tokens must be <= 16 (speculative verify tokens), got {query_tokens}")
    req = trace.requests.sort_values(["arrival_s", "request_id"], kind="stable").head(int(num_requests))
    out = req["output_tokens"].to_numpy(np.int64)
    plan = list(_schedule(out, int(concurrency), int(max_steps)))
    admitted = (max(int(idx.max()) for _, idx, _ in plan) + 1) if plan else 0
    req = req.head(admitted)  # requests that started within max_steps
    rid = req["request_id"].to_numpy(np.int64)
    inp = req["input_tokens"].to_numpy(np.int64)
    lengths = inp + out[:admitted]
    if lengths.sum() > 50_000_000:
        raise ValueError(f"the {admitted} requests hold {int(lengths.sum()):,} positions; use --num-requests or "
                         "--max-steps to keep the stream under 50M positions")
    offset = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    last = np.full(int(lengths.sum()), -1, np.int64)  # stream index of each position's last reference
    ids, bounds, num_refs = [], [0], []
    for _, idx, dstep in plan:
        s = sel.select(rid[idx], inp[idx] + dstep, dstep, int(group), int(query_tokens))  # [R, q, k]
        valid = s >= 0
        flat = (offset[idx][:, None, None] + s)[valid]
        num_refs.append(int(flat.size))
        flat.sort()
        uniq = flat[np.concatenate([[True], flat[1:] != flat[:-1]])] if flat.size else flat
        prev = last[uniq]
        order = np.lexsort((uniq, -prev))  # most recently referenced first; never-referenced last, by id
        uniq = uniq[order]
        last[uniq] = bounds[-1] + np.arange(uniq.size)
        ids.append(uniq)
        bounds.append(bounds[-1] + uniq.size)
    return ReferenceStream(np.concatenate(ids) if ids else np.zeros(0, np.int64), np.asarray(bounds, np.int64),
                           np.asarray(num_refs, np.int64), lengths, int(group), int(sel.top_k))


def replay_ours(stream: ReferenceStream, policy: str, gpu_slots: int, num_recent_buckets: int | None = None,
                hit_masks: bool = False):
    """Replay the stream through the library (GPU pool `gpu_slots`, CPU pool holding every position).

    Returns (hits per batch, distinct references per batch) and, with `hit_masks`, a bool array over `stream.ids`
    (True where the entry was on the GPU before its batch: a hit)."""
    from ulacache import CacheConfig, UlaCache

    n = stream.num_positions
    extra = {} if num_recent_buckets is None else {"num_recent_buckets": int(num_recent_buckets)}
    cache = UlaCache(CacheConfig(mode="dp", num_ranks=1, gpu_slots=int(gpu_slots), cpu_slots=n, policy=policy,
                                 **extra))
    ballast = -1
    cache.alloc(ballast, int(gpu_slots), rank=0)  # fills the GPU pool (new tokens go GPU-first) ...
    addr = cache.alloc_many(np.arange(stream.lengths.size), stream.lengths)  # ... so every position lands on CPU
    cache.free(ballast)  # the GPU pool is empty: each GPU entry will arrive through a reference
    hits = np.zeros(stream.num_batches, np.int64)
    uniq = np.zeros(stream.num_batches, np.int64)
    mask = np.zeros(stream.ids.size, bool) if hit_masks else None
    for b in range(stream.num_batches):
        a = addr[stream.batch(b)]
        if hit_masks:
            mask[stream.bounds[b]:stream.bounds[b + 1]] = cache.locate(a)[0] == 0
        plan = cache.access(a)
        cache.commit(plan)
        hits[b], uniq[b] = plan.num_hits, plan.num_unique
    return (hits, uniq, mask) if hit_masks else (hits, uniq)


SEMANTICS = (
    "one batch per engine step: the union of the running requests' top-k selections of one layer group, "
    "deduplicated; the GPU pool starts empty and every position starts in the CPU tier",
    "ours (pb-lru, lru) access a batch as a unit: all its entries are resident together and its hits are never "
    "evicted for its misses",
    "libCacheSim gets each batch's distinct positions one at a time, most recently referenced first (never "
    "referenced last, by id): for LRU every hit of a batch comes before every miss, so LRU never evicts what the "
    "batch still uses",
    "remaining difference 1: entries touched in the same batch are equally recent to our exact lru (ties go to the "
    "lowest GPU slot); a sequential cache ranks them in feed order, which here makes the batch's re-used entries "
    "the least recent of the batch. Our lru equals libCacheSim LRU hit for hit whenever no eviction splits such a "
    "tie (always for one-reference batches); lru_vs_libcachesim_lru gives the gap on this stream",
    "remaining difference 2: a sequential policy (S3-FIFO, ARC, Belady) may evict an entry the batch already used; "
    "a batch cache keeps the whole batch resident (Belady is thus a bound for batch caches too)",
)


def compare(trace_path, gpu_slots=(20000, 40000, 80000), group: int | None = None, warmup_steps: int = 32,
            num_requests: int | None = None, concurrency: int = 8, query_tokens: int = 1, max_steps: int = 256,
            peers: bool = True) -> tuple[list[dict], dict]:
    """Rows (policy, implementation, gpu_slots, hits, refs, hit_ratio) and a meta dict for policy_compare.json."""
    from sim.studies import peers as peer_mod
    from traces import open_trace
    from ulacache.policies import POLICIES

    sizes = [int(s) for s in gpu_slots]
    if not sizes or min(sizes) < 1 or max(sizes) > 50_000_000:
        raise ValueError(f"--gpu-slots must be integers in [1, 50000000], got {gpu_slots!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"--warmup-steps must be an integer >= 0, got {warmup_steps!r}")
    trace = open_trace(trace_path)
    stream = extract_stream(trace, group, num_requests, concurrency, query_tokens, max_steps)
    if warmup_steps >= stream.num_batches:
        raise ValueError(f"--warmup-steps {warmup_steps} leaves nothing to count: the stream has "
                         f"{stream.num_batches} steps")
    batch_max = int(np.diff(stream.bounds).max())
    if min(sizes) < batch_max:
        raise ValueError(f"--gpu-slots {min(sizes)} cannot hold one batch: a step selects up to {batch_max} distinct "
                         "positions (a batch must fit the GPU pool)")
    w_ref = int(stream.bounds[warmup_steps])
    counted = int(stream.ids.size) - w_ref
    version = peer_mod.available() if peers else None
    rows, lru_match = [], {}
    ours_lru = {}
    for size in sizes:
        for policy in OURS:
            hits, uniq = replay_ours(stream, policy, size)
            if POLICIES[policy].exact_lru:  # the one to compare with libCacheSim's LRU batch for batch
                ours_lru[size] = hits
            rows.append(_row(policy, "ulacache", size, int(hits[warmup_steps:].sum()),
                             int(uniq[warmup_steps:].sum())))
    if version is not None:
        with peer_mod.PeerRunner(stream) as runner:
            for size in sizes:
                for policy in peer_mod.PEERS:
                    rows.append(_row(policy, "libcachesim", size, runner.hits(policy, size, w_ref), counted))
                per_batch = runner.batch_hits("lcs-lru", size)
                ours = ours_lru[size]
                lru_match[str(size)] = {
                    "batches_equal": int((per_batch[warmup_steps:] == ours[warmup_steps:]).sum()),
                    "num_batches": stream.num_batches - warmup_steps,
                    "hits_ours_lru": int(ours[warmup_steps:].sum()),
                    "hits_libcachesim_lru": int(per_batch[warmup_steps:].sum()),
                    "hit_ratio_gap_points": round(100 * (int(ours[warmup_steps:].sum()) -
                                                         int(per_batch[warmup_steps:].sum())) / counted, 3)}
    note = None if version is not None else (
        "libcachesim not installed (pip install -e '.[peers]'): only our policies were run" if peers else
        "peers not requested (--no-peers): only our policies were run")
    meta = {
        "trace": str(trace_path), "group": stream.group, "top_k": stream.top_k, "query_tokens": int(query_tokens),
        "num_requests": int(stream.lengths.size), "concurrency": int(concurrency), "num_steps": stream.num_batches,
        "warmup_steps": int(warmup_steps), "gpu_slots": sizes, "num_positions": stream.num_positions,
        "refs_total": int(stream.num_refs.sum()), "distinct_refs_total": int(stream.ids.size),
        "distinct_refs_counted": counted, "libcachesim": version, "note": note,
        "lru_vs_libcachesim_lru": lru_match or None, "semantics": list(SEMANTICS),
    }
    return rows, meta


def _row(policy: str, impl: str, size: int, hits: int, refs: int) -> dict:
    return {"policy": policy, "implementation": impl, "gpu_slots": size, "hits": hits, "refs": refs,
            "hit_ratio": hits / refs if refs else float("nan"),
            "miss_ratio": 1.0 - hits / refs if refs else float("nan")}
