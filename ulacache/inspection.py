"""Read-only views of a UlaCache: where addresses live, the place layout, the device snapshot, free slots, statistics
and the invariant check. Functions of the cache (`UlaCache` delegates to them); `Counters` keeps the statistics the
facade adds to at commit and replay."""
from __future__ import annotations

from collections import Counter

import numpy as np

from .inputs import check_rank, int_scalar
from .layout import DeviceState, PlaceLayout

STAT_KEYS = ("accesses", "replays", "references", "unique_references", "hits", "misses", "exchanges",
             "local_hits", "peer_fetches", "h2d_rows", "d2h_rows", "peer_rows")


class Counters:
    """Cumulative counts over committed plans; replays add their transfers. Bytes = rows x `row_bytes`."""

    def __init__(self, row_bytes: int):
        self.row_bytes = row_bytes
        self.counts: Counter = Counter()

    def commit(self, plan) -> None:
        s = self.counts
        s["accesses"] += 1
        s["references"] += plan.num_refs
        s["unique_references"] += plan.num_unique
        s["hits"] += plan.num_hits
        s["misses"] += plan.num_misses
        s["local_hits"] += plan.num_local_hits
        s["exchanges"] += plan.num_exchanges
        s["peer_fetches"] += plan.num_peer_fetches
        rb = self.row_bytes  # `transfers`, inline (the commit path: one call less)
        for key, per_rank in (("h2d_", plan.h2d_rows_per_rank), ("d2h_", plan.d2h_rows_per_rank),
                              ("peer_", plan.peer_rows_per_rank)):
            rows = sum(per_rank.tolist())
            s[key + "rows"] += rows
            s[key + "bytes"] += rows * rb

    def replay(self, plan) -> None:
        self.counts["replays"] += 1
        self.transfers(plan)

    def transfers(self, plan) -> None:
        """Rows and bytes of the plan's links (per-rank rows summed as Python ints: a few ranks, no reductions)."""
        s, rb = self.counts, self.row_bytes
        for key, per_rank in (("h2d_", plan.h2d_rows_per_rank), ("d2h_", plan.d2h_rows_per_rank),
                              ("peer_", plan.peer_rows_per_rank)):
            rows = sum(per_rank.tolist())
            s[key + "rows"] += rows
            s[key + "bytes"] += rows * rb


def stats(cache) -> dict:
    """Cumulative counters over committed plans (replays add their transfers), bytes = rows x row_bytes; plus what is
    held now: allocated logical slots and the rows held per tier (copies and TP replicas included)."""
    counts = cache.counters.counts
    out = {k: int(counts.get(k, 0)) for k in STAT_KEYS}
    for link in ("h2d", "d2h", "peer"):
        out[f"{link}_bytes"] = int(counts.get(f"{link}_bytes", 0))
    out["hit_rate"] = out["hits"] / out["unique_references"] if out["unique_references"] else 0.0
    out["row_bytes"] = cache.counters.row_bytes
    out["allocated_slots"] = int(cache.space.num_allocated)
    out["requests"] = len(cache.space.requests)
    # Token rows held right now, every rank: entries (pb-lru/lru) or copies (hisparse buffers, replicas).
    gpu_rows, cpu_rows = cache.policy.held_rows()
    out["gpu_rows_held"], out["cpu_rows_held"] = gpu_rows, cpu_rows
    out["local_buffer_rows_held"] = cache.buffers.held() if cache.buffers is not None else 0
    out["physical_rows_held"] = gpu_rows + cpu_rows + out["local_buffer_rows_held"]
    return out


def places(cache, addrs) -> np.ndarray:
    """Current unified place (int64, see `layout`) of each allocated address, same shape."""
    a = cache.index.addresses(addrs, "addrs")
    return cache.index.places(a, "addrs").reshape(np.shape(addrs))


def locate(cache, addrs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tier int8: 0 GPU / 1 CPU, rank, slot) of each address's current place (hisparse: its CPU entry)."""
    a = cache.index.addresses(addrs, "addrs")
    tier, rank, slot = layout(cache).decode(cache.index.places(a, "addrs"))
    shape = np.shape(addrs)
    return tier.reshape(shape), rank.reshape(shape), slot.reshape(shape)


def layout(cache) -> PlaceLayout:
    """How unified places map to (tier, rank, slot): GPU pools, CPU pools, TP local buffers."""
    pol, b = cache.policy, cache.buffers
    return PlaceLayout(num_ranks=pol.num_gpu_places // pol.gpu_seg, gpu_slots=cache.config.gpu_slots,
                       gpu_seg=pol.gpu_seg, cpu_slots=cache.config.cpu_slots,
                       buffer_slots=b.slots if b is not None else 0, buffer_seg=b.seg if b is not None else 0)


def device_state(cache) -> DeviceState:
    """Dense read-only snapshot of the pb-lru/lru state a device twin mirrors (sized by the budget; see
    layout.DeviceState). ValueError for hisparse. The caller makes sure no plan is pending."""
    pol = cache.policy
    if not pol.exclusive:
        raise ValueError(f"device_state covers pb-lru and lru, not {cache.config.policy!r}")
    buckets = getattr(pol, "buckets", None)
    nbytes = pol.num_gpu_places // 8
    ring = buckets.ring if buckets is not None else np.zeros((0, nbytes), np.uint8)
    cold = buckets.cold if buckets is not None else np.zeros(0, np.uint8)
    ro = [np.ascontiguousarray(x) for x in (cache.space.phys.astype(np.int64), pol.gpu.owner, pol.gpu.stamps,
                                            pol.gpu.free_bm, ring, cold)]
    for x in ro:
        x.setflags(write=False)
    clock = (buckets.epoch, pol.inserted, pol.epoch_volume) if buckets is not None else (0, 0, 0)
    return DeviceState(layout(cache), cache.config.policy, int(pol.step),
                       buckets.num_recent if buckets is not None else 0, *ro, marker_size=cache.space.size + 1,
                       epoch=int(clock[0]), epoch_inserted=int(clock[1]), epoch_volume=int(clock[2]))


def slots(cache, per_tier: tuple[np.ndarray, np.ndarray], tier, rank) -> int:
    """Token slots of (GPU, CPU) per-rank counts: tier 0 GPU, 1 CPU, None = logical slots a new token can take (GPU +
    CPU for pb-lru/lru, CPU for hisparse, whose GPU slots are per-request buffers). rank None = all ranks."""
    g, c = per_tier
    exclusive = cache.policy.exclusive
    if tier is None:
        per = g + c if exclusive else c
    elif tier in (0, 1) and not isinstance(tier, bool):
        per = (g, c)[tier]
    else:
        raise ValueError(f"tier must be 0 (GPU), 1 (CPU) or None, got {tier!r}")
    if rank is None:
        return int(per.sum()) if (exclusive or not cache.tp) else int(per[0])
    return int(per[check_rank(rank, cache.config.num_ranks)])


def request_addresses(cache, request_id: int) -> np.ndarray:
    """A copy of the request's addresses, in allocation order."""
    rid = int_scalar(request_id, "request_id")
    if rid not in cache.space.requests:
        raise ValueError(f"unknown request {rid}")
    return cache.space.requests[rid].addresses().copy()


def check_invariants(cache, last) -> None:
    """AssertionError naming the first broken invariant: mapping bijective, pools conserved, buckets exact, copies
    (hisparse buffers, TP local buffers) identical to their authoritative entries in payload mode (every layer the
    last committed plan `last` moved)."""
    cache.policy.check_invariants()
    if cache.buffers is not None:
        cache.buffers.check()
    cache.payload.check_copies(last)


__all__ = ["Counters", "STAT_KEYS", "check_invariants", "device_state", "layout", "locate", "places",
           "request_addresses", "slots", "stats"]
