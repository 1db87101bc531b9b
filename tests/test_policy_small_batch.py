"""The small-batch paths (numpy backend: a few tokens allocated or slots taken are handled in Python ints, see
`scalar_updates`) give what the array paths give: random programs run on two caches, one with the scalar paths
turned off, must return the same addresses, plans and errors and leave the same state (mapping, owners, stamps,
free bitmap and summary, bucket bitmaps, free lists, local buffers) after every operation."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ulacache import CacheConfig, CapacityError, UlaCache

LAYOUTS = [("dp", 1), ("dp", 3), ("tp", 4)]


def make(policy, mode, ranks, scalar):
    c = UlaCache(CacheConfig(mode=mode, num_ranks=ranks, gpu_slots=40, cpu_slots=150, policy=policy,
                             num_recent_buckets=2, local_buffer_slots=70))
    c.be.scalar_updates = scalar  # this cache's own backend instance (policy, pools and buffers share it)
    return c


def _stack(s):
    return (s.lo, s.hi, s.fresh, s._buf[:s._len].tolist())


def state(c):
    pol, gpu = c.policy, c.policy.gpu
    out = [c.space.phys, gpu.owner, gpu.stamps, gpu.free_bm, gpu.free_nz, gpu.in_use, gpu.high, gpu.num_free,
           pol.pending_d2h, np.array([gpu.cleared, pol.step, c.space.num_allocated])]
    out += [np.array(_stack(s)[:3] + tuple(_stack(s)[3])) for s in c.space.ids + pol.cpu.free]
    out += [c.space.requests[r].addresses() for r in sorted(c.space.requests)]
    b = getattr(pol, "buckets", None)
    if b is not None:
        out += [b.ring, b.cold, b.count, b.ring_nz, b.cold_nz, b.current_per_rank, np.array([b.epoch, pol.inserted])]
    if c.buffers is not None:
        p = c.buffers.pool
        out += [p.own, p.free, p.in_use, p.high]
    return out


def plan_of(p):
    return [p.num_hits, p.num_misses, p.num_exchanges, p.num_local_hits, p.num_peer_fetches, p.h2d_rows_per_rank,
            p.d2h_rows_per_rank, p.peer_rows_per_rank, p.move_src, p.move_dst]


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y)
        else:
            assert x == y


def step(c, live, op, a, b, rng):
    """One operation on cache c; returns what it returned (or the error it raised)."""
    R = c.config.num_ranks
    try:
        if op == "alloc":
            rid = max(live, default=-1) + 1
            addrs = c.alloc(rid, 1 + a % 40, rank=b % R)
            live[rid] = b % R
            return [addrs]
        if op == "decode" and live:
            ids = sorted(live)[: 1 + a % 3]
            return [c.alloc_many(ids, [1 + (a + i) % (6 if b % 2 else 2) for i in range(len(ids))],
                                 [live[i] for i in ids])]
        if op == "access" and live:
            ids = sorted(live)
            if c.config.mode == "dp":
                ids = [i for i in ids if live[i] == live[ids[a % len(ids)]]]
            hist = np.concatenate([c.request_addresses(i) for i in ids])
            sel = rng.choice(hist, size=min(hist.size, 1 + b % 48), replace=False)
            plan = c.access(np.concatenate([sel, sel[: a % 5], [-1]]))
            c.commit(plan)
            return plan_of(plan)
        if op == "free" and live:
            rid = sorted(live)[a % len(live)]
            c.free(rid)
            del live[rid]
            return [rid]
    except CapacityError as e:
        return ["CapacityError", str(e)]
    return []


OPS = st.sampled_from(["alloc", "decode", "decode", "access", "access", "access", "free"])


@pytest.mark.parametrize("policy", ["pb-lru", "lru"])
@pytest.mark.parametrize("mode,ranks", LAYOUTS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(OPS, st.integers(0, 1000), st.integers(0, 1000)), min_size=5, max_size=50),
       seed=st.integers(0, 2**16))
def test_scalar_paths_match_array_paths(policy, mode, ranks, ops, seed):
    fast, ref = make(policy, mode, ranks, True), make(policy, mode, ranks, False)
    live_f, live_r = {}, {}
    rng_f, rng_r = np.random.default_rng(seed), np.random.default_rng(seed)
    for op, a, b in ops:
        same(step(fast, live_f, op, a, b, rng_f), step(ref, live_r, op, a, b, rng_r))
        same(state(fast), state(ref))
    fast.check_invariants()


def test_scalar_paths_are_taken():
    """The numpy backend offers them, and a one-token decode step takes no array pass over the pool (smoke check
    that the comparison above compares two different paths)."""
    c = make("pb-lru", "tp", 4, True)
    assert c.be.scalar_updates
    c.alloc(0, 20)
    calls = []
    take_one = c.policy.gpu.take_one
    c.policy.gpu.take_one = lambda r: calls.append(r) or take_one(r)
    c.alloc_many([0], [1])
    assert calls == [0]  # water fill: the first of the ranks with the most free slots, one slot on ints
    take_few = c.policy.gpu._take_few
    c.policy.gpu._take_few = lambda counts: calls.append(list(counts)) or take_few(counts)
    c.alloc_many([0], [2])
    assert calls == [0, [0, 1, 1, 0]]  # then the ranks left with the most


def _twin_pools(ranks: int, slots: int, taken: int):
    """Two equal pools of `slots` per rank with `taken` per rank taken fresh, and their numpy backends: the first with
    the scalar (few-slot) paths on, the second with them off."""
    from ulacache.backends.numpy_backend import NumpyBackend
    from ulacache.pools import Pool

    pools, bes = [], []
    for scalar in (True, False):
        be = NumpyBackend()
        be.scalar_updates = scalar
        p = Pool(ranks, slots)
        p.take_free(be, np.full(ranks, taken, dtype=np.int64))
        pools.append(p)
        bes.append(be)
    return pools, bes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3]), st.integers(1, 64))
def test_take_few_matches_array_path_on_large_pools(seed, ranks, want):
    """Pool.take_free of a few slots (Python ints, reading the words below high in growing chunks) returns what the
    backend's select_first path returns and leaves the same bitmap, counters and high marks, on pools whose holes
    lie far apart (thousands of words below high: beyond the first chunks)."""
    rng = np.random.default_rng(seed)
    pools, bes = _twin_pools(ranks, 200_000, 150_000)  # fresh takes: array path (more than FEW_SLOTS)
    for _ in range(4):  # free a few scattered slots (holes far apart), then take a few
        holes = np.sort(rng.choice(ranks * pools[0].cap, size=int(rng.integers(0, 8)), replace=False))
        holes = holes[(holes % pools[0].cap) < pools[0].high[holes // pools[0].cap]]
        holes = holes[pools[0].free[holes >> 3] & (1 << (holes & 7)).astype(np.uint8) == 0]
        counts = np.array([int(x) for x in rng.multinomial(want, [1 / ranks] * ranks)], dtype=np.int64)
        got = []
        for p, be in zip(pools, bes):
            p.give_back(be, holes.astype(np.int64))
            got.append(p.take_free(be, counts))
        same(list(got[0]), list(got[1]))
        same([pools[0].free, pools[0].in_use, pools[0].high, pools[0].low],
             [pools[1].free, pools[1].in_use, pools[1].high, pools[1].low])
        words = pools[0].free.view("<u8").reshape(ranks, -1)  # no free slot below a rank's lowest free word
        assert not (words.astype(bool) & (np.arange(words.shape[1]) < pools[0].low[:, None])).any()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=9), st.integers(0, 50))
def test_tp_token_runs_match_interleave(quota, offset):
    """A TP allocation writes each rank's tokens by strided runs (`_runs`): the positions `interleave` gives it."""
    from ulacache.policies.exclusive import _runs, interleave

    seq = interleave(np.array(quota, dtype=np.int64))
    runs = _runs(quota, offset)
    for r in range(len(quota)):
        pos = [p for sl in runs[r] for p in range(sl.start, sl.stop, sl.step)]
        assert pos == (np.flatnonzero(seq == r) + offset).tolist()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 3, 8]), st.integers(64, 3000))
def test_take_runs_match_array_path(seed, ranks, want):
    """Pool.take_free of many slots per rank whose lowest free slots may form one run (blocks of slots given back,
    as a local buffer's after a request's copies are dropped; a few scattered holes breaking some runs) returns
    what the backend's select_first path returns and leaves the same bitmap, counters and marks."""
    rng = np.random.default_rng(seed)
    pools, bes = _twin_pools(ranks, 5000, 3000)
    for _ in range(5):
        cap = pools[0].cap
        lo = rng.integers(0, ranks * cap, size=int(rng.integers(0, 4)))
        blocks = [np.arange(a, min(a + int(rng.integers(1, 2000)), (a // cap + 1) * cap)) for a in lo.tolist()]
        holes = np.unique(np.concatenate(blocks + [rng.integers(0, ranks * cap, size=int(rng.integers(0, 3)))]))
        taken = (pools[0].free[holes >> 3] & (1 << (holes & 7)).astype(np.uint8)) == 0
        holes = holes[taken & ((holes % cap) < pools[0].slots)].astype(np.int64)
        counts = np.array([int(x) for x in rng.multinomial(want, [1 / ranks] * ranks)], dtype=np.int64)
        got = []
        for p, be in zip(pools, bes):
            p.give_back(be, holes)
            got.append(p.take_free(be, counts))
        same(list(got[0]), list(got[1]))
        same([pools[0].free, pools[0].in_use, pools[0].high, pools[0].low, np.array([pools[0].cap])],
             [pools[1].free, pools[1].in_use, pools[1].high, pools[1].low, np.array([pools[1].cap])])
        free_bits = np.unpackbits(pools[0].free, bitorder="little").view(bool)
        pools[0].own[:] = np.where(free_bits | ~pools[0].valid(), -1, 0)  # (owners: what the bitmap says)
        pools[0].check(lambda ok, what: None if ok else pytest.fail(what), "pool")


def test_take_runs_path_is_taken():
    """A take of many slots per rank from a pool given back whole takes the run path (smoke check that the
    comparison above compares two different paths)."""
    from ulacache.backends.numpy_backend import NumpyBackend
    from ulacache.pools import Pool

    be, p = NumpyBackend(), Pool(4, 3000)
    s, _ = p.take_free(be, np.full(4, 2000, dtype=np.int64))
    p.give_back(be, s)
    calls = []
    runs = p._take_runs
    p._take_runs = lambda counts: calls.append(list(counts)) or runs(counts)
    s2, f2 = p.take_free(be, np.array([700, 0, 1500, 64], dtype=np.int64))
    assert calls == [[700, 0, 1500, 64]] and f2.tolist() == [700, 0, 1500, 64]
    assert s2[:700].tolist() == list(range(700)) and s2[700:].tolist()[:2] == [2 * p.cap, 2 * p.cap + 1]
