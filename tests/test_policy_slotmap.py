"""The TP local-buffer address -> slot maps: the hash map behaves like a dict; TP caches work on hash maps too."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ulacache.slot_map as slot_map
from ulacache import CacheConfig, UlaCache
from ulacache.address_space import AddressSpace
from ulacache.slot_map import DenseSlotMaps, HashSlotMap, HashSlotMaps


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 5000), max_size=40, unique=True)), max_size=40))
def test_hash_map_matches_a_dict(ops):
    capacity = 64
    space = AddressSpace(1, 5001, 5001)
    space.pop_ids(0, 5001)  # the dense table covers the addresses handed out
    maps = [HashSlotMaps(1, capacity), DenseSlotMaps(1, space)]
    ref: dict[int, int] = {}
    rng = np.random.default_rng(0)
    for insert, keys in ops:
        if insert:  # insert the absent keys while the map has room
            new = [k for k in keys if k not in ref][: capacity - len(ref)]
            vals = rng.integers(0, capacity, len(new))
            for m in maps:
                k = np.array(new, dtype=np.int64)
                m.set(np.zeros(k.size, np.int64), k, vals.astype(np.int64))
            ref.update(zip(new, vals.tolist()))
        else:
            gone = [k for k in keys if k in ref]
            for m in maps:
                m.delete(np.zeros(len(gone), np.int64), np.array(gone, dtype=np.int64))
            for k in gone:
                del ref[k]
        probe = np.arange(0, 5001, 7, dtype=np.int64)
        expect = np.array([ref.get(int(k), -1) for k in probe])
        for m in maps:
            assert np.array_equal(m.get(0, probe), expect)
            assert np.array_equal(m.get_all(probe)[0], expect)
            keys_, vals_ = m.items(0)
            assert keys_.tolist() == sorted(ref) and vals_.tolist() == [ref[k] for k in sorted(ref)]


def test_hash_map_survives_many_insert_delete_cycles():
    m, rng = HashSlotMap(100), np.random.default_rng(1)
    held = np.zeros(0, dtype=np.int64)
    for _ in range(300):  # tombstones pile up and force rebuilds
        drop = held[rng.random(held.size) < 0.5]
        m.delete(drop)
        held = np.setdiff1d(held, drop)
        new = np.setdiff1d(rng.choice(10**9, 100 - held.size, replace=False), held)
        m.set(new, new % 97)
        held = np.union1d(held, new)
        assert np.array_equal(m.get(held), held % 97)
    assert m.bits <= 9  # stays sized by the capacity, not by the keys' range


def _tp_steps(c: UlaCache) -> list:
    """60 access + commit steps of a TP cache with requests replaced on the way: each step's plan counts."""
    rng = np.random.default_rng(3)
    a = c.alloc_many([1, 2, 3], [300, 300, 300])
    c.write(a, rng.integers(0, 255, (a.size, 2), dtype=np.uint8))
    out = []
    for step in range(60):
        sel = rng.choice(a, 40, replace=False)
        plan = c.access(sel)
        c.commit(plan)
        out.append(plan.counts())
        for r in range(4):
            assert np.array_equal(c.read_local(plan.addrs, r), c.read(plan.addrs))
        if step % 20 == 19:  # replace the oldest request: freed addresses are reused, copies must not be
            live = sorted(c.space.requests)
            c.free(live[0])
            new = c.alloc(100 + step, 300)
            c.write(new, rng.integers(0, 255, (new.size, 2), dtype=np.uint8))
            a = np.concatenate([c.request_addresses(r) for r in sorted(c.space.requests)])
            c.check_invariants()
    c.check_invariants()
    return out


def _tp_cache(policy: str, **kw) -> UlaCache:
    return UlaCache(CacheConfig(mode="tp", num_ranks=4, gpu_slots=40, cpu_slots=200, policy=policy,
                                local_buffer_slots=48, payload_bytes=2, **kw))


@pytest.mark.parametrize("policy", ["pb-lru", "lru"])
def test_tp_cache_on_hash_maps_matches_dense_maps(policy, monkeypatch):
    results = []
    for limit in (slot_map.DENSE_LIMIT_BYTES, 0):
        monkeypatch.setattr(slot_map, "DENSE_LIMIT_BYTES", limit)
        c = _tp_cache(policy)
        assert isinstance(c.buffers.maps, HashSlotMaps if limit == 0 else DenseSlotMaps)
        results.append(_tp_steps(c))
    assert results[0] == results[1]


@pytest.mark.parametrize("policy", ["pb-lru", "lru"])
def test_dense_map_budget_overrides_the_library_rule(policy, monkeypatch):
    """CacheConfig.dense_map_bytes: the caller's budget, not the rule (here patched to refuse any dense table), picks
    the maps; the plans are the same either way, and a budget below the table's size gives hash maps."""
    monkeypatch.setattr(slot_map, "DENSE_LIMIT_BYTES", 0)
    monkeypatch.setattr(slot_map, "DENSE_OVER_HASH", 0)
    runs = {}
    for budget, kind in ((0, HashSlotMaps), (1 << 30, DenseSlotMaps), (1, HashSlotMaps)):
        c = _tp_cache(policy, dense_map_bytes=budget)
        assert isinstance(c.buffers.maps, kind)
        runs[budget] = _tp_steps(c)
        assert isinstance(c.buffers.maps, kind)  # (the address space grew on the way: the choice held)
    assert runs[0] == runs[1 << 30] == runs[1]
    with pytest.raises(ValueError, match="dense_map_bytes must be >= 0"):
        CacheConfig(dense_map_bytes=-1)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 8]), st.integers(1, 300), st.floats(0.0, 1.0))
def test_remote_lookup_matches_a_plain_model(seed, ranks, batch, held_fraction):
    """DenseSlotMaps.remote against a per-rank loop: each rank looks up the batch's addresses homed elsewhere; misses
    grouped by rank, ascending within."""
    rng = np.random.default_rng(seed)
    per_rank = 400
    space = AddressSpace(ranks, per_rank, per_rank)
    for r in range(ranks):
        space.pop_ids(r, per_rank)
    maps = DenseSlotMaps(ranks, space, capacity=1000)
    keys = np.arange(ranks * per_rank, dtype=np.int64)
    for r in range(ranks):
        k = keys[(keys // per_rank != r) & (rng.random(keys.size) < held_fraction)]
        maps.set(np.full(k.size, r, np.int64), k, rng.integers(0, 1000, k.size))
    addrs = np.unique(rng.integers(0, ranks * per_rank, batch))
    bounds = np.searchsorted(addrs, np.arange(ranks + 1) * per_rank).tolist()
    want_miss, want_hits = [], []
    for r in range(ranks):  # loop over ranks (the model)
        remote = [i for i in range(addrs.size) if not bounds[r] <= i < bounds[r + 1]]
        miss = [i for i in remote if maps.get(r, addrs[i:i + 1])[0] < 0]
        want_miss += miss
        want_hits.append(len(remote) - len(miss))
    hits, miss, m_counts, _ = maps.remote(addrs, space.index(addrs), bounds)
    assert hits.tolist() == want_hits
    assert miss.tolist() == want_miss
    assert m_counts.sum() == miss.size
