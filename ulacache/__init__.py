"""UlaCache policy library: one logical address space over GPU and CPU KV pools (docs/architecture.md).

    from ulacache import UlaCache, CacheConfig, CapacityError, Plan

    cache = UlaCache(CacheConfig(mode="dp", num_ranks=1, gpu_slots=4096, cpu_slots=65536, policy="pb-lru"))
    addrs = cache.alloc(request_id, num_tokens, rank=0)          # int64 logical addresses
    addrs = cache.alloc_many(request_ids, counts, ranks=None)     # one call for a whole decode step
    plan = cache.access(selected)        # any shape, -1 = padding; Plan counts: num_refs, num_unique, num_hits,
    cache.commit(plan)                   #   num_misses, num_exchanges, num_local_hits, num_peer_fetches, h2d_rows,
    cache.replay(plan)                   #   d2h_rows, peer_rows, *_rows_per_rank (int64[num_ranks])
    tier, rank, slot = cache.locate(addrs)
    cache.num_free_slots(tier=None, rank=None); cache.capacity_slots(tier=None, rank=None)
    cache.write(addrs, payload, layer=0); cache.read(addrs, layer=0); cache.read_local(addrs, rank)  # payload mode
    cache.free(request_id); cache.stats(); cache.check_invariants()
    cache.layout().decode(places); cache.places(addrs); plan.exchanges; cache.device_state()   # executor API

Module map: config (CacheConfig), address_space (logical ids, address -> place table), pools (GPU/CPU pools and
free lists), bitmaps (PB-LRU buckets), policies/ (pb-lru, lru, hisparse behind one registry), local_buffer +
slot_map (TP local buffers), plan, layout (the typed place layout, exchange lists and device snapshot executors
read), cache (the facade), translate (checked address -> place translation of a batch), payload + payload_io
(payload bytes and their movement), inspection (locate, stats, device snapshot, invariant check), inputs (argument
checks), backends/ (array primitives: numpy reference, torch, cupy), workload (a synthetic locality workload for
tests and benchmarks).
"""
from .cache import UlaCache
from .config import CacheConfig
from .errors import CapacityError
from .layout import DeviceState, Exchanges, PlaceLayout
from .plan import Plan

__all__ = ["CacheConfig", "CapacityError", "DeviceState", "Exchanges", "Plan", "PlaceLayout", "UlaCache"]
