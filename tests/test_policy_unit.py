"""Unit tests of the ulacache policy library: config, allocation, access/commit semantics, TP, replay, validation."""
import numpy as np
import pytest

from ulacache import CacheConfig, CapacityError, Plan, UlaCache


def make(**kw):
    base = dict(gpu_slots=4, cpu_slots=8, policy="pb-lru")
    base.update(kw)
    return UlaCache(CacheConfig(**base))


def snapshot(c: UlaCache):
    """Everything observable that bad input must leave unchanged."""
    addrs = np.flatnonzero(c.space.phys >= 0)
    out = [addrs, c.space.phys.copy(), c.stats(), c.num_free_slots(0), c.num_free_slots(1), c.policy.step]
    if c.payload.store is not None:
        out.append(c.payload.store.dense(c.layout().num_places))
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y)
        else:
            assert x == y


# -- config ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    dict(mode="pp"), dict(num_ranks=0), dict(gpu_slots=0), dict(cpu_slots=-1), dict(policy="fifo"),
    dict(backend="jax"), dict(payload_bytes=-1), dict(num_recent_buckets=0), dict(gpu_slots=1.5),
    dict(policy="hisparse", cpu_slots=0), dict(policy="hisparse", gpu_slots=100, device_buffer_slots=100),
    dict(mode=3), dict(num_ranks=True),
])
def test_bad_config_raises_value_error(bad):
    with pytest.raises(ValueError):
        CacheConfig(**bad)


def test_config_from_dict_rejects_unknown_key():
    with pytest.raises(ValueError, match="gpu_slot"):
        CacheConfig.from_dict({"gpu_slot": 4})
    assert CacheConfig.from_dict({"gpu_slots": 8}).gpu_slots == 8
    with pytest.raises(ValueError):
        UlaCache({"gpu_slots": 4})


def test_row_bytes_default_and_override():
    assert CacheConfig().effective_row_bytes == 656
    assert CacheConfig(payload_bytes=16).effective_row_bytes == 16
    assert CacheConfig(payload_bytes=16, row_bytes=1152).effective_row_bytes == 1152


# -- allocation --------------------------------------------------------------------------------------------------------
def test_alloc_places_gpu_first_then_cpu_and_capacity_error_changes_nothing():
    c = make()
    a = c.alloc(1, 6)
    assert a.dtype == np.int64 and np.unique(a).size == 6
    tier, rank, slot = c.locate(a)
    assert tier.tolist() == [0, 0, 0, 0, 1, 1] and (rank == 0).all()
    assert c.num_free_slots() == 6 and c.num_free_slots(0) == 0 and c.num_free_slots(1) == 6
    assert c.capacity_slots() == 12 and c.capacity_slots(0) == 4
    before = snapshot(c)
    with pytest.raises(CapacityError):
        c.alloc(2, 7)
    assert_same(before, snapshot(c))
    c.check_invariants()
    assert isinstance(CapacityError("x"), RuntimeError) and not isinstance(CapacityError("x"), ValueError)


def test_dp_addresses_unique_across_ranks_and_rank_local():
    c = make(num_ranks=2)
    a0, a1 = c.alloc(1, 5, rank=0), c.alloc(2, 5, rank=1)
    assert np.intersect1d(a0, a1).size == 0
    assert (c.locate(a0)[1] == 0).all() and (c.locate(a1)[1] == 1).all()
    with pytest.raises(ValueError, match="rank"):
        c.alloc(1, 1, rank=1)  # request 1 lives on rank 0
    with pytest.raises(ValueError):
        c.alloc(3, 1, rank=2)
    c.check_invariants()


def test_alloc_many_matches_one_by_one():
    c1, c2 = make(gpu_slots=64, cpu_slots=64), make(gpu_slots=64, cpu_slots=64)
    for rid in range(3):
        c1.alloc(rid, 10 + rid)
    c2.alloc_many([0, 1, 2], [10, 11, 12])
    for rid in range(3):
        assert np.array_equal(c1.request_addresses(rid), c2.request_addresses(rid))
        assert all(np.array_equal(x, y) for x, y in zip(c1.locate(c1.request_addresses(rid)),
                                                          c2.locate(c2.request_addresses(rid))))
    step = c2.alloc_many([0, 1, 2], [1, 1, 1])  # one decode token each
    assert step.size == 3 and c2.num_requests == 3
    with pytest.raises(ValueError):
        c2.alloc_many([0, 0], [1, 1])
    with pytest.raises(ValueError):
        c2.alloc_many([0, 1], [1])
    with pytest.raises(ValueError):
        c2.alloc_many([0], [-1])


def test_free_returns_slots_and_rejects_unknown():
    c = make()
    a = c.alloc(1, 6)
    c.free(1)
    assert c.num_free_slots() == 12
    c.check_invariants()
    for bad in (1, 99, "x", 1.0):
        with pytest.raises(ValueError):
            c.free(bad)
    with pytest.raises(ValueError, match="unallocated"):
        c.locate(a)


# -- access / commit ---------------------------------------------------------------------------------------------------
def test_exchange_is_a_swap_into_the_vacated_cpu_slot():
    c = make(payload_bytes=4)
    a = c.alloc(1, 12)
    c.write(a, np.repeat(np.arange(12, dtype=np.uint8)[:, None], 4, axis=1))
    t, r, s = c.locate(a)
    cpu_8, cpu_9 = s[8], s[9]
    plan = c.access(np.array([[a[8], a[9], -1], [a[8], -1, -1]]))
    assert (plan.num_refs, plan.num_unique, plan.num_hits, plan.num_misses, plan.num_exchanges) == (3, 2, 0, 2, 2)
    assert (plan.h2d_rows, plan.d2h_rows, plan.peer_rows) == (2, 2 + 8, 0)  # + 8 tokens allocated onto the CPU
    assert plan.h2d_rows_per_rank.tolist() == [2] and plan.peer_rows_per_rank.tolist() == [0]
    # Until commit, readers see the old valid places and bytes.
    assert c.locate(a[8])[0] == 1 and (c.read(a[[8, 9]])[:, 0] == [8, 9]).all()
    c.commit(plan)
    t2, _, s2 = c.locate(a)
    # Victims: slots 0 and 1 (all four GPU entries are equally recent; lowest slot first) swap with 8 and 9.
    assert t2[[8, 9]].tolist() == [0, 0] and s2[[8, 9]].tolist() == [0, 1]
    assert t2[[0, 1]].tolist() == [1, 1] and s2[[0, 1]].tolist() == [cpu_8, cpu_9]
    assert (c.read(a)[:, 0] == np.arange(12)).all()
    st = c.stats()
    assert st["exchanges"] == 2 and st["h2d_bytes"] == 2 * 4 and st["hits"] == 0
    c.check_invariants()


def test_pending_plan_blocks_mutation_and_stale_commit():
    c = make(payload_bytes=2)
    a = c.alloc(1, 12)
    plan = c.access(a[8:10])
    for call in (lambda: c.alloc(2, 1), lambda: c.free(1), lambda: c.access(a[:1]),
                 lambda: c.write(a[:1], np.zeros((1, 2), np.uint8))):
        with pytest.raises(ValueError, match="pending"):
            call()
    c.commit(plan)
    with pytest.raises(ValueError):
        c.commit(plan)
    with pytest.raises(ValueError):
        c.commit("plan")


@pytest.mark.parametrize("bad, match", [
    (np.array([0.0, 1.0]), "integer"), (np.array([True]), "integer"), (np.array([-2]), ">= 0"),
    (np.array([10**9]), "beyond"), (np.array([11]), "unallocated"),
])
def test_access_bad_input_raises_and_changes_nothing(bad, match):
    c = make(payload_bytes=2)
    c.alloc(1, 10)
    before = snapshot(c)
    with pytest.raises(ValueError, match=match):
        c.access(bad)
    assert_same(before, snapshot(c))
    c.commit(c.access(np.array([0, 9])))  # still usable
    c.check_invariants()


def test_access_freed_address_and_wrong_rank_raise():
    c = make(num_ranks=2)
    a = c.alloc(1, 3, rank=0)
    b = c.alloc(2, 3, rank=1)
    with pytest.raises(ValueError, match="another rank"):
        c.access(np.concatenate([a, b]), rank=0)
    c.free(1)
    with pytest.raises(ValueError, match="unallocated"):
        c.access(a)
    c.commit(c.access(np.concatenate([b, [-1]]), rank=1))


def test_working_set_larger_than_gpu_raises_capacity_error_and_changes_nothing():
    c = make(payload_bytes=2)
    a = c.alloc(1, 12)
    before = snapshot(c)
    with pytest.raises(CapacityError):
        c.access(a[:5])
    assert_same(before, snapshot(c))
    c.commit(c.access(a[:4]))
    c.check_invariants()


def test_pblru_evicts_cold_before_recent_and_never_current():
    c = make(gpu_slots=4, cpu_slots=8, num_recent_buckets=2)
    a = c.alloc(1, 12)  # a[0..3] on GPU, stamp 0
    c.commit(c.access(a[[0, 1]]))  # step 1
    for _ in range(2):  # steps 2, 3: a[2], a[3] recent; a[0], a[1] age 3 > 2: cold
        c.commit(c.access(a[[2, 3]]))
    plan = c.access(a[[2, 8, 9]])  # a[2] hit (current), two misses
    c.commit(plan)
    tier = c.locate(a)[0]
    assert tier[[0, 1]].tolist() == [1, 1]  # the cold entries went first
    assert tier[[2, 3, 8, 9]].tolist() == [0, 0, 0, 0]  # the recent entry a[3] and the current a[2] stay
    c.check_invariants()


def test_pblru_epochs_end_by_insertion_volume_not_by_access():
    """An epoch ends before an access once a (K + 1)-th of the GPU slots were inserted during it (policies/pblru.py)."""
    c = make(gpu_slots=64, cpu_slots=200, num_recent_buckets=3)  # epoch volume 16
    a = c.alloc(1, 64)  # fills the GPU: 64 insertions in epoch 0
    clock = lambda: (c.device_state().epoch, c.device_state().epoch_inserted)
    assert clock() == (0, 64) and c.device_state().epoch_volume == 16
    c.commit(c.access(a[0:4]))
    assert clock() == (1, 0)  # 64 >= 16: the access opened epoch 1
    c.commit(c.access(a[4:8]))  # hits only: no insertion, same epoch
    b = c.alloc(2, 100)  # all on the CPU tier: no GPU insertion
    c.commit(c.access(b[0:10]))
    assert clock() == (1, 10)
    assert (c.locate(a[8:18])[0] == 1).all() and (c.locate(a[:8])[0] == 0).all()  # epoch 0 evicted, lowest slot first
    c.commit(c.access(b[10:20]))
    assert clock() == (1, 20)
    c.commit(c.access(b[20:22]))
    assert clock() == (2, 2)  # 20 >= 16 inserted: the next access rotated
    c.check_invariants()


def test_pblru_epoch_ends_before_an_access_that_would_need_the_current_bucket():
    c = make(gpu_slots=8, cpu_slots=8, num_recent_buckets=3)  # epoch volume 2
    a = c.alloc(1, 9)
    c.commit(c.access(a[0:4]))  # 8 GPU insertions: epoch 1
    c.commit(c.access(a[4:8]))  # no insertion: still epoch 1, the current bucket holds the whole pool
    assert c.device_state().epoch == 1
    c.commit(c.access(a[8:9]))  # would need a current slot: epoch 2 first, then the oldest slot goes
    assert c.device_state().epoch == 2
    assert c.locate(a[0])[0] == 1 and (c.locate(a[1:])[0] == 0).all()
    c.check_invariants()


def test_pblru_many_buckets_age_past_int8():
    """512 recent buckets: slots older than 127 epochs are found in their bucket (used to crash in bucket_of)."""
    c = make(gpu_slots=2048, cpu_slots=64, num_recent_buckets=512)  # epoch volume 4
    old = c.alloc(1, 1)
    hist = c.alloc(2, 1500)
    for step in range(130):  # 4 GPU insertions per step: every access opens an epoch
        hist = np.concatenate([hist, c.alloc_many([2], [4], [0])])
        c.commit(c.access(hist[step * 8:(step + 1) * 8]))
    assert c.device_state().epoch > 128
    c.commit(c.access(old))  # a hit 130 epochs old moves from its recent bucket to the current one
    c.check_invariants()
    c.free(2)
    c.check_invariants()


def test_lru_evicts_least_recent_exactly():
    c = make(gpu_slots=4, cpu_slots=8, policy="lru")
    a = c.alloc(1, 12)
    for i in (3, 0, 2, 1):  # touch order: a[3] least recent ... a[1] most recent
        c.commit(c.access(a[[i]]))
    c.commit(c.access(a[[8]]))
    assert c.locate(a[3])[0] == 1 and (c.locate(a[[0, 1, 2, 8]])[0] == 0).all()
    c.commit(c.access(a[[9, 10]]))
    assert (c.locate(a[[0, 2]])[0] == 1).all() and (c.locate(a[[1, 8, 9, 10]])[0] == 0).all()
    c.check_invariants()


def test_replay_moves_each_layer_and_counts_transfers():
    c = make(payload_bytes=3, payload_layers=3)
    a = c.alloc(1, 12)
    for layer in range(3):
        c.write(a, np.full((12, 3), 10 * layer, np.uint8) + np.arange(12, dtype=np.uint8)[:, None], layer=layer)
    plan = c.access(a[8:11])
    c.commit(plan)
    with pytest.raises(ValueError, match="replay"):
        c.access(a[:1])  # layers 1 and 2 not moved yet
    c.replay(plan)
    c.replay(plan, layer=2)
    with pytest.raises(ValueError):
        c.replay(plan)
    for layer in range(3):
        assert (c.read(a, layer=layer)[:, 0] == 10 * layer + np.arange(12)).all()
    st = c.stats()
    assert st["replays"] == 2 and st["h2d_rows"] == 3 * plan.h2d_rows and st["exchanges"] == plan.num_exchanges
    c.check_invariants()
    plan2 = c.access(a[:2])
    c.commit(plan2)
    with pytest.raises(ValueError, match="most recently"):
        c.replay(plan)


def test_stats_bytes_use_row_bytes():
    c = make(row_bytes=1000)
    a = c.alloc(1, 12)
    c.commit(c.access(a[8:10]))
    st = c.stats()
    assert st["h2d_bytes"] == 2000 and st["d2h_bytes"] == st["d2h_rows"] * 1000 and st["row_bytes"] == 1000
    assert set(["references", "unique_references", "hits", "misses", "exchanges", "local_hits", "peer_fetches",
                "h2d_bytes", "d2h_bytes", "peer_bytes"]) <= set(st)


def test_payload_validation():
    c = make(payload_bytes=2)
    a = c.alloc(1, 3)
    with pytest.raises(ValueError):
        c.write(a, np.zeros((3, 3), np.uint8))
    with pytest.raises(ValueError):
        c.write(a, np.zeros((3, 2), np.int32))
    with pytest.raises(ValueError):
        c.write(a[[0, 0]], np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError):
        c.read(a, layer=1)
    with pytest.raises(ValueError, match="payload_bytes"):
        make().read(np.array([0]))


# -- TP ----------------------------------------------------------------------------------------------------------------
def test_tp_spreads_homes_and_reuses_local_buffers():
    c = make(mode="tp", num_ranks=4, gpu_slots=8, cpu_slots=8, local_buffer_slots=32, payload_bytes=2)
    a = c.alloc(1, 32)  # GPU first, spread by free space: 8 per rank
    tier, rank, _ = c.locate(a)
    assert (tier == 0).all() and np.bincount(rank, minlength=4).tolist() == [8, 8, 8, 8]
    c.write(a, np.stack([np.arange(32), np.arange(32)], 1).astype(np.uint8))
    sel = a[:12]
    homes = np.bincount(c.locate(sel)[1], minlength=4)
    plan = c.access(sel)
    assert plan.num_hits == 12 and plan.num_local_hits == 0
    remote = 12 - homes  # every rank fetches what it does not store
    assert plan.peer_rows_per_rank.tolist() == remote.tolist() and plan.num_peer_fetches == remote.sum()
    c.commit(plan)
    for r in range(4):
        assert (c.read_local(sel, r) == c.read(sel)).all()
    plan2 = c.access(sel)
    assert plan2.num_local_hits == remote.sum() and plan2.num_peer_fetches == 0 and plan2.peer_rows == 0
    c.commit(plan2)
    assert c.stats()["peer_bytes"] == remote.sum() * 2
    with pytest.raises(ValueError):
        c.access(sel, rank=0)
    c.check_invariants()


def test_tp_promotes_cpu_entries_into_their_home_gpu_pool():
    c = make(mode="tp", num_ranks=2, gpu_slots=2, cpu_slots=4, local_buffer_slots=8)
    a = c.alloc(1, 12)
    t, r, _ = c.locate(a)
    cpu = a[t == 1][:2]
    home = c.locate(cpu)[1]
    c.commit(c.access(cpu))
    t2, r2, _ = c.locate(cpu)
    assert (t2 == 0).all() and (r2 == home).all()
    c.check_invariants()


def test_tp_local_buffer_too_small_raises_capacity_error():
    c = make(mode="tp", num_ranks=2, gpu_slots=8, cpu_slots=0, local_buffer_slots=2)
    a = c.alloc(1, 16)
    with pytest.raises(CapacityError):
        c.access(a)
    c.commit(c.access(a[:4]))


def test_tp_buffer_overflow_with_misses_changes_nothing():
    """A batch refused for the local buffer must not have taken GPU slots for its misses (the simulator serves it
    in sub-batches next)."""
    c = make(mode="tp", num_ranks=2, gpu_slots=8, cpu_slots=16, local_buffer_slots=3)
    a = c.alloc(1, 32)  # 16 on the GPUs, 16 on the CPUs
    free = c.num_free_slots(tier=0)
    cpu = a[c.locate(a)[0] == 1]
    with pytest.raises(CapacityError):
        c.access(cpu[:12])
    assert c.num_free_slots(tier=0) == free
    c.check_invariants()
    for part in (cpu[:4], cpu[4:8], cpu[8:12]):
        c.commit(c.access(part))
        c.check_invariants()
    c.alloc(1, 8)  # allocation still finds the free slots the counts report
    c.check_invariants()


def test_tp_free_invalidates_buffer_copies():
    c = make(mode="tp", num_ranks=2, gpu_slots=8, cpu_slots=0, local_buffer_slots=8, payload_bytes=1)
    a = c.alloc(1, 8)
    c.commit(c.access(a))
    c.free(1)
    c.check_invariants()
    b = c.alloc(2, 8)  # reuses the addresses: no stale copies may be hit
    plan = c.access(b)
    assert plan.num_local_hits == 0
    c.commit(plan)
    c.check_invariants()


def test_plan_repr_and_counts():
    c = make()
    a = c.alloc(1, 6)
    plan = c.access(a[:2])
    assert isinstance(plan, Plan) and "num_refs=2" in repr(plan)
    assert plan.counts()["num_unique"] == 2


def test_stats_rows_held_count_entries_and_copies():
    c = make(mode="tp", num_ranks=2, gpu_slots=4, cpu_slots=8, local_buffer_slots=8)
    a = c.alloc(1, 10)
    st = c.stats()
    assert (st["gpu_rows_held"], st["cpu_rows_held"], st["local_buffer_rows_held"]) == (8, 2, 0)
    plan = c.access(a[:4])
    c.commit(plan)
    st = c.stats()
    assert st["local_buffer_rows_held"] == plan.num_peer_fetches
    assert st["physical_rows_held"] == 10 + plan.num_peer_fetches


def test_payload_bytes_follow_the_places_written_not_the_budget():
    """Payload mode over a budget of ~110M places x 64 B (7 GB dense) costs pages only for what is written."""
    c = UlaCache(CacheConfig(mode="dp", num_ranks=1, gpu_slots=10_000_000, cpu_slots=100_000_000, payload_bytes=64))
    a = c.alloc(1, 50_000)
    data = np.random.default_rng(0).integers(0, 255, (a.size, 64), dtype=np.uint8)
    c.write(a, data)
    assert np.array_equal(c.read(a), data)
    plan = c.access(a[::7])
    c.commit(plan)
    assert np.array_equal(c.read(a), data)
    c.check_invariants()
    assert c.payload.store.nbytes < 64 << 20


def test_pblru_epoch_clock_past_int16_matches_a_fresh_clock():
    """pb-lru stamps start as int16 epochs and widen as the clock passes 2**15 - 1: a cache whose clock starts just
    below it places every entry as one starting at 0 (buckets go by age, never by the clock's value)."""
    runs = []
    for start in (0, 2**15 - 3):
        c = make(gpu_slots=64, cpu_slots=400, num_recent_buckets=3)
        c.policy.buckets.epoch = start  # test-only: move the clock
        a = c.alloc(1, 300)
        rng = np.random.default_rng(5)
        for _ in range(30):
            c.commit(c.access(rng.choice(a, size=40, replace=False)))
            c.check_invariants()
        runs.append((c.locate(a), c.device_state().epoch - start, c.policy.gpu.stamp.dtype))
    (l0, e0, d0), (l1, e1, d1) = runs
    assert e0 == e1 >= 4 and d0 == np.int16 and d1 == np.int32
    assert all(np.array_equal(x, y) for x, y in zip(l0, l1))


def test_large_tp_batch_located_by_home_runs():
    """A TP batch of >= translate._RUN_SHIFT_MIN distinct addresses is located by home runs: the same places as locate
    gives, and an address beyond its home row's allocation is refused by name (the smallest one)."""
    from ulacache.translate import _RUN_SHIFT_MIN
    n = 3 * _RUN_SHIFT_MIN
    c = UlaCache(CacheConfig(mode="tp", num_ranks=4, gpu_slots=n, cpu_slots=n, policy="pb-lru"))
    a = c.alloc(1, n)
    b = c.alloc(2, n // 2)
    sel = np.concatenate([a[::2], b, [-1]])
    rng = np.random.default_rng(0)
    plan = c.access(rng.permutation(sel))
    assert plan.num_unique == sel.size - 1 and np.array_equal(plan.addrs, np.sort(sel[:-1]))
    assert plan.num_hits + plan.num_misses == plan.num_unique
    c.commit(plan)
    c.check_invariants()
    c.free(2)
    with pytest.raises(ValueError, match=f"unallocated address {int(np.sort(b)[0])}"):
        c.access(np.concatenate([a, b]))
