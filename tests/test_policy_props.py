"""Property tests: random programs of alloc / decode / access / commit / replay / free for every policy in DP (1 and 2
ranks) and TP (4 ranks). After every step: each logical address maps to exactly one place and no place to two,
tiers exclusive (pb-lru, lru), free counts conserved, current batch never evicted, payloads intact, and failed
operations (CapacityError, bad input) leave the state unchanged."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ulacache import CacheConfig, CapacityError, UlaCache

LAYOUTS = [("dp", 1), ("dp", 2), ("tp", 4)]
POLICIES = ["pb-lru", "lru", "hisparse"]
P = 4  # payload bytes
D = 8  # hisparse device buffer


def make(policy, mode, ranks, gpu=12, cpu=64):
    if policy == "hisparse":
        gpu = 3 * (D + 1)
    return UlaCache(CacheConfig(mode=mode, num_ranks=ranks, gpu_slots=gpu, cpu_slots=cpu, policy=policy,
                                payload_bytes=P, payload_layers=2, num_recent_buckets=2, device_buffer_slots=D,
                                local_buffer_slots=64))


class Driver:
    def __init__(self, cache: UlaCache, seed: int):
        self.c, self.rng = cache, np.random.default_rng(seed)
        self.expect = np.zeros((cache.space.size, 2, P), np.uint8)
        self.live: dict[int, int] = {}  # request id -> rank
        self.next_id = 0
        self.exchanges = 0

    def state(self):
        c = self.c
        return (c.space.phys.copy(), c.num_free_slots(0), c.num_free_slots(1), c.stats(), c.policy.step)

    def unchanged(self, before):
        after = self.state()
        assert np.array_equal(before[0], after[0]) and before[1:] == after[1:]

    def write(self, addrs):
        for layer in range(2):
            data = self.rng.integers(0, 256, (addrs.size, P), dtype=np.uint8)
            self.c.write(addrs, data, layer=layer)
            self.expect[addrs, layer] = data

    def alloc_new(self, a, b):
        rank = a % self.c.config.num_ranks
        n = 1 + b % 24
        before = self.state()
        try:
            addrs = self.c.alloc(self.next_id, n, rank=rank)
        except CapacityError:
            return self.unchanged(before)
        assert addrs.size == n and np.unique(addrs).size == n
        self.live[self.next_id] = rank
        self.next_id += 1
        self.write(addrs)

    def decode(self, a, b):
        if not self.live:
            return
        ids = sorted(self.live)[: 1 + a % len(self.live)]
        before = self.state()
        try:
            addrs = self.c.alloc_many(ids, np.ones(len(ids), np.int64), [self.live[i] for i in ids])
        except CapacityError:
            return self.unchanged(before)
        self.write(addrs)

    def access(self, a, b):
        c = self.c
        if not self.live:
            return
        ids = sorted(self.live)
        rank = None
        if c.config.mode == "dp" and c.config.num_ranks > 1 and a % 2:
            rank = a % c.config.num_ranks
            ids = [i for i in ids if self.live[i] == rank]
            if not ids:
                return
        parts = []
        for rid in self.rng.choice(ids, size=min(len(ids), 1 + b % 2), replace=False).tolist():
            hist = c.request_addresses(rid)
            k = int(self.rng.integers(1, min(6, hist.size) + 1))  # <= D distinct per request (hisparse limit)
            parts.append(self.rng.choice(hist, size=k, replace=False))
        sel = np.concatenate(parts)
        batch = np.concatenate([sel, sel[: sel.size // 2], np.full(a % 3, -1, np.int64)])
        before = self.state()
        try:
            plan = c.access(self.rng.permutation(batch))
        except CapacityError:
            return self.unchanged(before)
        # Until commit, readers see the old places and bytes.
        assert np.array_equal(c.space.phys, before[0])
        assert plan.num_unique == np.unique(sel).size and plan.num_refs == batch.size - a % 3
        assert plan.num_hits + plan.num_misses == plan.num_unique
        ps = plan.policy_state
        if hasattr(ps, "victims"):  # the current batch is never evicted
            assert not np.isin(ps.victims, plan.addrs).any()
        c.commit(plan)
        for _ in range(c.config.payload_layers - 1):
            c.replay(plan)
        self.exchanges += plan.num_exchanges
        if c.policy.exclusive:  # everything the batch selected is now GPU-resident
            assert (c.locate(plan.addrs)[0] == 0).all()
        else:
            assert (c.policy.resident_places(plan.addrs) >= 0).all()
        if c.buffers is not None:
            for r in range(c.config.num_ranks):
                assert np.array_equal(c.read_local(plan.addrs, r, layer=1), self.expect[plan.addrs, 1])

    def free(self, a, b):
        if not self.live or a % 4 == 0:
            before = self.state()
            with pytest.raises(ValueError):
                self.c.free(10**6 + a)
            return self.unchanged(before)
        rid = sorted(self.live)[a % len(self.live)]
        self.c.free(rid)
        del self.live[rid]

    def bad_input(self, a, b):
        before = self.state()
        bad = [np.array([-2]), np.array([0.5]), np.array([self.c.space.size + a])][a % 3]
        with pytest.raises(ValueError):
            self.c.access(bad)
        self.unchanged(before)

    def check(self):
        c = self.c
        c.check_invariants()
        cap = c.capacity_slots()
        assert c.num_free_slots() + c.stats()["allocated_slots"] == cap, "free counts not conserved"
        live = np.flatnonzero(c.space.phys >= 0)
        for layer in range(2):
            assert np.array_equal(c.read(live, layer=layer), self.expect[live, layer]), "payload corrupted"


OPS = ["alloc_new", "alloc_new", "decode", "access", "access", "access", "access", "free", "bad_input"]
program = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000), st.integers(0, 1000)), min_size=5,
                   max_size=60)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode,ranks", LAYOUTS)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=program, seed=st.integers(0, 2**16))
def test_random_programs_keep_invariants(policy, mode, ranks, ops, seed):
    d = Driver(make(policy, mode, ranks), seed)
    d.alloc_new(0, 20)
    for name, a, b in ops:
        getattr(d, name)(a, b)
        d.check()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode,ranks", [("dp", 1), ("tp", 4)])
def test_payloads_intact_after_thousands_of_exchanges(policy, mode, ranks):
    d = Driver(make(policy, mode, ranks, gpu=24, cpu=300), seed=7)
    for i in range(6):
        d.alloc_new(i, 23)
    steps = 0
    while steps < 1000 and (policy == "hisparse" or d.exchanges < 3000):
        d.access(steps, 999)
        if steps % 50 == 0:
            d.decode(steps, 0)
            d.check()
        steps += 1
    d.check()
    if policy != "hisparse":
        assert d.exchanges >= 3000
    else:
        assert d.c.stats()["h2d_rows"] >= 1000
