"""UlaCache.clone: a copy is in the exact state the same calls would have built, and independent of its source."""
import numpy as np
import pytest

from ulacache import CacheConfig, CapacityError, UlaCache

CONFIGS = [
    dict(policy="pb-lru", mode="dp", num_ranks=2),
    dict(policy="pb-lru", mode="tp", num_ranks=4, local_buffer_slots=96),
    dict(policy="lru", mode="tp", num_ranks=2, local_buffer_slots=64),
    dict(policy="hisparse", mode="dp", num_ranks=2, device_buffer_slots=48),
]


def make(kw):
    return UlaCache(CacheConfig(gpu_slots=64, cpu_slots=256, **kw))


def prologue(c: UlaCache, tp: bool):
    c.alloc(1, 90, rank=0)
    c.alloc(2, 40, rank=0 if tp else 1)


def drive(c: UlaCache, tp: bool, seed: int) -> list:
    """A fixed sequence of accesses, allocations and a free; returns every observable outcome."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(30):
        rid = 1 + step % 2
        addrs = c.request_addresses(rid)
        sel = rng.choice(addrs, size=min(24, addrs.size), replace=False)
        try:
            plan = c.access(sel)
        except CapacityError:
            out.append("capacity")
            continue
        out.append(sorted(plan.counts().items()))
        out += [plan.move_src.copy(), plan.move_dst.copy()]
        c.commit(plan)
        out.append(c.alloc_many([1, 2], [1, 2], None if tp else [0, 1]))
        if step == 20:
            c.free(2)
            out.append(c.alloc(2, 8, rank=0 if tp else 1))
    out.append(sorted(c.stats().items()))
    out.append(c.places(np.concatenate([c.request_addresses(1), c.request_addresses(2)])))
    return out


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y for x, y in zip(a, b))


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: f"{kw['policy']}-{kw['mode']}")
def test_clone_continues_as_the_same_calls_would(kw):
    tp = kw["mode"] == "tp"
    built, source = make(kw), make(kw)
    prologue(built, tp)
    prologue(source, tp)
    copy = source.clone()
    expect = drive(built, tp, seed=5)
    assert same(drive(copy, tp, seed=5), expect)
    copy.check_invariants()
    # the source was left as it was: driving it now gives the same outcomes again
    assert same(drive(source, tp, seed=5), expect)


def test_clone_is_independent_and_refused_while_pending():
    c = make(CONFIGS[1])
    prologue(c, True)
    before = c.stats()
    d = c.clone()
    d.commit(d.access(d.request_addresses(1)[:16]))
    d.alloc(3, 5)
    assert c.stats() == before and c.num_requests == 2 and d.num_requests == 3
    plan = c.access(c.request_addresses(2)[:4])
    with pytest.raises(ValueError, match="pending"):
        c.clone()
    c.commit(plan)
    c.clone().check_invariants()
