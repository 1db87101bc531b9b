"""The executor API (issue 13 item 4): PlaceLayout decode/encode, Plan.exchanges and UlaCache.device_state, used
the way an outside executor would: a model of every place's bytes driven only by the public API must stay equal
to what the library says is where (every entry and every TP buffer copy)."""
import numpy as np
import pytest

from ulacache import CacheConfig, PlaceLayout, UlaCache


def make(mode, ranks, policy):
    return UlaCache(CacheConfig(mode=mode, num_ranks=ranks, gpu_slots=130 if policy == "hisparse" else 100,
                                cpu_slots=1500, policy=policy,
                                local_buffer_slots=300, device_buffer_slots=40, num_recent_buckets=2))


def test_decode_and_encode_round_trip():
    lay = PlaceLayout(num_ranks=3, gpu_slots=100, gpu_seg=128, cpu_slots=50, buffer_slots=70, buffer_seg=128)
    places = np.array([0, 99, 128, 383, lay.cpu_base, lay.cpu_base + 149, lay.buffer_base, lay.buffer_base + 256 + 69])
    tier, rank, slot = lay.decode(places)
    assert tier.tolist() == [0, 0, 0, 0, 1, 1, 2, 2]
    assert rank.tolist() == [0, 0, 1, 2, 0, 2, 0, 2]
    assert slot.tolist() == [0, 99, 0, 127, 0, 49, 0, 69]
    ok = slot < np.choose(tier, [100, 50, 70])
    assert np.array_equal(lay.encode(tier[ok], rank[ok], slot[ok]), places[ok])
    assert lay.decode([-1])[0].tolist() == [-1]
    with pytest.raises(ValueError):
        lay.encode([0], [0], [100])


@pytest.mark.parametrize("mode,ranks,policy", [("dp", 1, "pb-lru"), ("dp", 2, "lru"), ("tp", 4, "pb-lru"),
                                               ("tp", 4, "lru"), ("dp", 2, "hisparse")])
def test_an_executor_on_the_public_api_tracks_every_entry(mode, ranks, policy):
    c = make(mode, ranks, policy)
    lay = c.layout()
    rows = np.full(lay.num_places, -1, dtype=np.int64)  # the "bytes" at each place: the address they encode
    rng = np.random.default_rng(0)
    reqs = {}
    for i in range(6):
        a = c.alloc(i, int(rng.integers(40, 120)), rank=i % ranks)
        reqs[i] = i % ranks
        rows[c.places(a)] = a
    for step in range(25):
        if policy == "hisparse":
            parts = [rng.choice(c.request_addresses(r), 10, replace=False) for r in sorted(reqs) if reqs[r] == 0]
        else:
            parts = [rng.choice(c.request_addresses(r), 14, replace=False) for r in sorted(reqs)]
        plan = c.access(np.concatenate(parts))
        ex = plan.exchanges
        assert ex.miss_addrs.size == plan.num_misses and not ex.miss_addrs.flags.writeable
        assert np.array_equal(rows[ex.peer_src], ex.peer_addrs)  # fetch sources before the plan (reads first)
        incoming = rows[ex.miss_src].copy()
        v = ex.victims >= 0
        outgoing = rows[ex.miss_dst[v]].copy()
        rows[ex.miss_dst] = incoming
        if ex.swap:
            rows[ex.miss_src[v]] = outgoing
        rows[ex.peer_dst] = rows[ex.peer_src_after]  # gathers from GPU pools after the exchange
        assert (lay.decode(ex.peer_src_after)[0] == 0).all()
        c.commit(plan)
        live = np.concatenate([c.request_addresses(r) for r in sorted(reqs)])
        assert np.array_equal(rows[c.places(live)], live), "an entry is not where the library says"
        tier, rank, slot = c.locate(live)
        assert np.array_equal(lay.encode(tier, rank, slot), c.places(live))
        if c.buffers is not None:  # every buffer copy holds its address
            b = lay.buffer_base
            for r in range(ranks):
                held = live[c.buffers.slots_of(live, r) >= 0]
                pl = b + r * lay.buffer_seg + c.buffers.slots_of(held, r)
                assert np.array_equal(rows[pl], held)
        if policy == "hisparse":  # the copies this plan made hold their address
            assert np.array_equal(rows[ex.miss_dst], ex.miss_addrs)
        a = c.alloc_many(sorted(reqs), [1] * len(reqs), [reqs[r] for r in sorted(reqs)])
        rows[c.places(a)] = a
        moves = c.policy.alloc_moves
        if moves is not None and moves[0].size:
            rows[moves[1]] = rows[moves[0]]


@pytest.mark.parametrize("policy", ["pb-lru", "lru"])
def test_device_state_is_a_consistent_dense_snapshot(policy):
    c = make("tp", 2, policy)
    a = c.alloc(0, 450)
    c.commit(c.access(a[::3]))
    st = c.device_state()
    lay = st.layout
    assert st.owner.size == lay.cpu_base and st.free_bm.size * 8 == lay.cpu_base and st.phys.size + 1 == st.marker_size
    on_gpu = st.phys[a] < lay.cpu_base
    assert np.array_equal(st.owner[st.phys[a][on_gpu]], a[on_gpu])
    free = np.unpackbits(st.free_bm, bitorder="little").astype(bool)
    valid = (np.arange(lay.cpu_base) % lay.gpu_seg) < lay.gpu_slots
    assert np.array_equal(free, valid & (st.owner < 0))
    assert st.step == 1 and (st.stamps[st.phys[a[::3]]] == (st.epoch if policy == "pb-lru" else 1)).all()
    if policy == "pb-lru":
        assert st.ring.shape == (st.num_recent + 1, lay.cpu_base // 8)
        members = np.unpackbits(st.ring, axis=1, bitorder="little").sum(0) + np.unpackbits(st.cold, bitorder="little")
        assert np.array_equal(members.astype(bool), st.owner >= 0)
    with pytest.raises(ValueError):
        st.owner[0] = 5
    plan = c.access(a[:5])
    with pytest.raises(ValueError):
        c.device_state()
    c.commit(plan)
    with pytest.raises(ValueError):
        make("dp", 1, "hisparse").device_state()


def test_place_layout_decode_one_tier_and_mixed():
    """decode's one-tier path (scalar base and segment) gives what the per-place formula gives, as the mixed path."""
    from ulacache.layout import PlaceLayout

    lay = PlaceLayout(num_ranks=3, gpu_slots=60, gpu_seg=64, cpu_slots=7, buffer_slots=5, buffer_seg=64)
    bases = (0, lay.cpu_base, lay.buffer_base)
    segs = (lay.gpu_seg, lay.cpu_slots, lay.buffer_seg)

    def expect(p):
        if p < 0:
            return -1, -1, -1
        t = int(p >= lay.cpu_base) + int(p >= lay.buffer_base)
        return t, (p - bases[t]) // segs[t], (p - bases[t]) % segs[t]

    rng = np.random.default_rng(5)
    for places in (rng.integers(0, lay.cpu_base, 40), lay.cpu_base + rng.integers(0, 21, (4, 5)),
                   rng.integers(lay.buffer_base, lay.num_places, 9), rng.integers(-1, lay.num_places, 50), [7]):
        tier, rank, slot = lay.decode(places)
        assert tier.dtype == np.int8 and rank.dtype == slot.dtype == np.int64 and tier.shape == np.shape(places)
        got = list(zip(tier.ravel().tolist(), rank.ravel().tolist(), slot.ravel().tolist()))
        assert got == [expect(int(p)) for p in np.ravel(places)]
