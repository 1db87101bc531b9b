"""Property test of the TP local buffers against a plain-Python model of their contract: per rank, every entry of an
access batch homed elsewhere is a hit when the rank holds a copy, else a miss; misses (ascending address) take
free buffer slots (lowest first), then the occupied slots not used by the batch by (last-use access, slot); freed
requests' copies go. Random programs of alloc / decode / access / free, dense and hash maps, the stamp log compacted
or not; after every access each rank's map equals the model's."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ulacache import CacheConfig, CapacityError, UlaCache, lru_log, slot_map

R, SLOTS = 3, 10


class Model:
    """Each rank's buffer: address -> [slot, last access]."""

    def __init__(self, per_rank_addresses: int):
        self.spr = per_rank_addresses
        self.held = [dict() for _ in range(R)]

    def access(self, addrs: list[int], now: int) -> None:
        for r in range(R):  # loop over ranks
            held = self.held[r]
            remote = [a for a in addrs if a // self.spr != r]
            misses = [a for a in remote if a not in held]
            for a in remote:
                if a in held:
                    held[a][1] = now
            used = {s for s, _ in held.values()}
            free = [s for s in range(SLOTS) if s not in used]
            batch = set(remote)
            old = sorted((t, s, a) for a, (s, t) in held.items() if a not in batch)
            dests = free[: len(misses)] + [s for _, s, _ in old[: max(0, len(misses) - len(free))]]
            by_slot = {s: a for a, (s, _) in held.items()}
            for a, s in zip(misses, dests):
                if s in by_slot:
                    del held[by_slot[s]]
                held[a] = [s, now]

    def free(self, addrs) -> None:
        for held in self.held:
            for a in addrs:
                held.pop(int(a), None)


OPS = ["alloc", "decode", "access", "access", "access", "access", "free"]
program = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 1000), st.integers(0, 1000)), min_size=5,
                   max_size=50)


@pytest.mark.parametrize("dense_limit,floor", [(1 << 40, 4096), (0, 0)])  # floor 0: the log compacts often
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=program, seed=st.integers(0, 2**16))
def test_buffers_follow_the_exact_lru_model(monkeypatch, dense_limit, floor, ops, seed):
    monkeypatch.setattr(slot_map, "DENSE_LIMIT_BYTES", dense_limit)  # the same values for every example
    monkeypatch.setattr(lru_log, "COMPACT_FLOOR", floor)
    c = UlaCache(CacheConfig(mode="tp", num_ranks=R, gpu_slots=6, cpu_slots=2000, local_buffer_slots=SLOTS))
    rng = np.random.default_rng(seed)
    model, live, next_id = Model(c.space.slots_per_rank), [], 0
    for name, a, b in ops:
        if name == "alloc" or not live:
            c.alloc(next_id, 1 + a % 40)
            live.append(next_id)
            next_id += 1
        elif name == "decode":
            c.alloc_many(live, np.ones(len(live), np.int64))
        elif name == "free":
            rid = live.pop(a % len(live))
            model.free(c.request_addresses(rid))
            c.free(rid)
        else:
            hist = np.concatenate([c.request_addresses(r) for r in live])
            sel = rng.choice(hist, size=min(hist.size, 1 + b % 24), replace=False)
            try:
                plan = c.access(np.concatenate([sel, sel[: a % 3]]))
            except CapacityError:
                continue
            c.commit(plan)
            model.access(sorted(sel.tolist()), plan.now)
            for r in range(R):  # loop over ranks
                keys = sorted(model.held[r])
                want = [model.held[r][k][0] for k in keys]
                assert c.buffers.slots_of(np.array(keys, np.int64), r).tolist() == want
                assert c.buffers.held() == sum(len(h) for h in model.held)
        c.buffers.check()
