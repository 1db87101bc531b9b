"""The Fabric's shortcuts change no bit: the rank-renamed max-min memo, and one re-plan per batch of starts."""
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.hardware import Fabric, Route, make_env, maxmin_rates

KINDS = ("h2d", "d2h", "nvl")


def _node(rng: random.Random, num_ranks: int):
    caps = {}
    bw = {k: rng.choice([55.29e9, 55.30e9, 387.6e9, rng.uniform(1.0, 100.0)]) for k in KINDS}
    for r in range(num_ranks):
        for k in KINDS:
            caps[f"{k}{r}"] = bw[k]
    caps["host"] = rng.choice([150.46e9, rng.uniform(1.0, 300.0)])
    w = {"h2d": rng.uniform(0.3, 1.5), "d2h": rng.uniform(0.3, 1.5)}
    routes = {(k, r): ({f"{k}{r}": 1.0, "host": w[k]} if k != "nvl" else {f"{k}{r}": 1.0})
              for r in range(num_ranks) for k in KINDS}
    return caps, routes


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_maxmin_rates_are_bitwise_invariant_under_renaming_ranks(seed):
    """What the memo relies on: renaming ranks (all ranks alike) moves no bit of any rate, however the flows of the
    ranks interleave and whatever ties the per-resource steps make."""
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    caps, routes = _node(rng, n)
    seq = [(rng.choice(KINDS), rng.randrange(n)) for _ in range(rng.randint(1, 30))]
    perm = list(range(n))
    rng.shuffle(perm)
    a = maxmin_rates([routes[k, r] for k, r in seq], caps)
    b = maxmin_rates([routes[k, perm[r]] for k, r in seq], caps)
    assert [x.hex() for x in a] == [x.hex() for x in b]


def _run(caps, routes, flows, groups=(), batch=False):
    """Finish time of each flow on a Fabric; flows = (start time, route key, bytes); flows that start at the same
    time start in one callback (held, with `batch`)."""
    env = make_env()
    fab = Fabric(env, caps, groups=groups)
    links = {key: Route(fab, f"{key}", route, 1.0, 0.0) for key, route in routes.items()}
    done = {}
    by_time: dict[float, list] = {}
    for i, (t, key, size) in enumerate(flows):
        by_time.setdefault(t, []).append((i, key, size))

    def wait(i, ev):
        yield ev
        done[i] = env.now

    def starter(t, batch_flows):
        yield env.timeout(t)
        if batch:
            fab.hold()
        evs = [(i, links[key].transfer(size)) for i, key, size in batch_flows]
        if batch:
            fab.release()
        for i, ev in evs:
            env.process(wait(i, ev))

    for t, fl in by_time.items():
        env.process(starter(t, fl))
    env.run()
    return [done[i].hex() for i in range(len(flows))]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fabric_memo_and_batched_starts_move_no_bit(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 6)
    caps, routes = _node(rng, n)
    # besides each rank's own routes: one crossing two ranks (no renaming then) and one on the shared cap only
    routes["cross", 0] = {"nvl0": 1.0, "h2d1": 1.0}
    routes["shared", 0] = {"host": 0.7}
    keys = list(routes)
    flows = [(rng.choice([0.0, 0.0, 1e-3, 2e-3, rng.uniform(0, 5e-3)]), rng.choice(keys), rng.uniform(1e3, 1e8))
             for _ in range(rng.randint(1, 25))]
    plain = _run(caps, routes, flows)
    groups = [tuple(f"{k}{r}" for k in KINDS) for r in range(n)]
    assert _run(caps, routes, flows, groups=groups) == plain
    assert _run(caps, routes, flows, groups=groups, batch=True) == plain


def test_fabric_caps_change_only_through_set_cap():
    fab = Fabric(make_env(), {"a": 1.0, "b": 1.0}, groups=[("a",), ("b",)])
    with pytest.raises(TypeError):
        fab.caps["a"] = 2.0
    fab.set_cap("a", 2.0)
    assert fab.caps["a"] == 2.0
    assert fab._canon_memo is None  # the ranks are no longer alike: no renaming
    fab.set_cap("a", 1.0)
    assert fab._canon_memo is not None


def _trace_all_of(seed: int, use_simpy: bool) -> list:
    """Several waiters on random sets of timeouts (ties, some already processed when the waiter starts waiting),
    each scheduling more work when it resumes: the order and times of everything that happens."""
    import simpy

    from sim.timing import all_of

    rng = random.Random(seed)
    env = make_env()
    log = []
    evs = [env.timeout(rng.choice([0.0, 1.0, 1.0, 2.0, 3.0])) for _ in range(8)]
    for e, ev in enumerate(evs):
        ev.callbacks.append(lambda _e, e=e: log.append(("ev", e, env.now)))

    def waiter(w, delay, picks):
        yield env.timeout(delay)
        group = [evs[i] for i in picks]
        if len(group) == 1:  # a plain waiter beside the condition waiters: their relative order is what matters
            yield group[0]
        else:
            yield simpy.AllOf(env, group) if use_simpy else all_of(env, group)
        log.append(("woke", w, env.now))
        yield env.timeout(rng.choice([0.0, 1.0]))
        log.append(("after", w, env.now))

    for w in range(8):
        env.process(waiter(w, rng.choice([0.0, 1.0, 2.5]), rng.sample(range(8), rng.choice([1, 1, 2, 3, 4]))))
    env.run()
    return log


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_all_of_orders_events_as_simpy_allof(seed):
    assert _trace_all_of(seed, use_simpy=False) == _trace_all_of(seed, use_simpy=True)


def _maxmin_reference(routes, caps):
    """maxmin_rates as first written (sets and per-round sums over every active flow): the float operations the
    bookkeeping of the current one must keep."""
    n = len(routes)
    rates = [0.0] * n
    active = set(range(n))
    crossed = set().union(*routes) if routes else set()
    caps = {res: cap for res, cap in caps.items() if res in crossed}
    used = dict.fromkeys(caps, 0.0)
    while active:
        step, tight = None, None
        for res, cap in caps.items():
            w = sum(routes[f].get(res, 0.0) for f in active)
            if w > 0:
                d = max(0.0, cap - used[res]) / w
                if step is None or d < step:
                    step, tight = d, res
        for f in active:
            rates[f] += step
            for res, w in routes[f].items():
                if res in used:
                    used[res] += step * w
        full = {res for res, cap in caps.items() if used[res] >= cap * (1 - 1e-12)} | {tight}
        active = {f for f in active if not any(res in full for res in routes[f])}
    return rates


@pytest.mark.parametrize("seed", range(30))
def test_maxmin_rates_keep_the_reference_float_operations(seed):
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.integers(1, 9))
    caps = {}
    for r in range(num_ranks):
        caps[f"h2d{r}"], caps[f"d2h{r}"], caps[f"nvl{r}"] = (float(rng.uniform(1e10, 6e10)), float(rng.uniform(1e10, 6e10)),
                                                              float(rng.uniform(1e11, 4e11)))
    caps["pcie_host_cap_bytes_s"] = float(rng.uniform(5e10, 2e11))
    if rng.random() < 0.5:
        caps["pcie_host_h2d_cap_bytes_s"] = float(rng.uniform(5e10, 2e11))
    kinds = [lambda r, w: {f"h2d{r}": 1.0, "pcie_host_h2d_cap_bytes_s": w, "pcie_host_cap_bytes_s": w},
             lambda r, w: {f"d2h{r}": 1.0, "pcie_host_d2h_cap_bytes_s": w, "pcie_host_cap_bytes_s": w},
             lambda r, w: {f"nvl{r}": 1.0}]
    routes = [kinds[int(rng.integers(3))](int(rng.integers(num_ranks)), float(rng.uniform(1.0, 1.5)))
              for _ in range(int(rng.integers(1, 30)))]  # (weights differ per route: the sums' order shows)
    assert maxmin_rates(routes, caps) == _maxmin_reference(routes, caps)
