"""The step timer's shortcuts (ranks computed instead of simulated) give the same clock, parts and event count as
simulating every rank."""
import itertools

import numpy as np
import pytest

import sim.timing as timing
from sim.costs import CostModel
from sim.hardware import Node, events_scheduled, make_env
from sim.timing import GroupWork, StepTimer


def _work(rng, busy: bool, prefetch: bool) -> GroupWork:
    u = lambda a, b: float(rng.uniform(a, b))  # noqa: E731
    return GroupWork(layers=int(rng.integers(1, 5)), indexer_s=u(0, 2e-5) * busy, allgather_s=u(0, 1e-5),
                     mgmt_s=u(0, 1e-5) * busy, h2d_bytes=u(1e5, 1e7) * busy, d2h_bytes=u(0, 1e6) * busy,
                     peer_bytes=u(0, 1e6) * busy * prefetch, attention_s=u(1e-6, 3e-5) * busy,
                     ffn_s=u(1e-6, 1e-5), collective_s=u(0, 1e-5), prefetch=prefetch, d2h_blocking=prefetch,
                     peer_after_h2d_bytes=u(0, 1e6) * busy * prefetch)


def _steps(monkeypatch, skip: bool, seed: int, preset: str):
    """Ten steps of 4 ranks (the first two busy, the others sharing one quiet work) on one node: every step's
    (seconds, parts), the clock and the events counted."""
    if not skip:
        monkeypatch.setattr(timing, "_arrival_floor", lambda w, t0: -np.inf)
    costs = CostModel.load(preset, "glm-5")
    env = make_env()
    timer = StepTimer(env, Node(env, 4, costs))
    rng = np.random.default_rng(seed)
    out = []
    for step in range(10):
        prefetch = bool(step % 2)
        quiet = _work(rng, False, prefetch)
        work = [[_work(rng, True, prefetch)], [_work(rng, True, prefetch)], [quiet], [quiet]]
        out.append(timer.run(work, [0, 1, 2, 3], {"overhead_s": 1e-5}))
    return out, env.now, events_scheduled(env)


@pytest.mark.parametrize("seed,preset", list(itertools.product(range(4), ("h200", "b300"))))
def test_quiet_ranks_left_out_change_no_bit(monkeypatch, seed, preset):
    fast = _steps(monkeypatch, True, seed, preset)
    monkeypatch.undo()
    slow = _steps(monkeypatch, False, seed, preset)
    assert fast == slow


def test_a_quiet_rank_that_may_arrive_last_is_still_simulated():
    """A quiet rank slower than a busy rank's compute must run on simpy (its arrival ends the group)."""
    costs = CostModel.load("h200", "glm-5")
    env = make_env()
    timer = StepTimer(env, Node(env, 2, costs))
    busy = GroupWork(layers=1, indexer_s=0.0, allgather_s=0.0, mgmt_s=0.0, h2d_bytes=1e3, d2h_bytes=0.0,
                     peer_bytes=0.0, attention_s=1e-6, ffn_s=0.0, collective_s=0.0, prefetch=True,
                     d2h_blocking=True)
    slow = GroupWork(layers=1, indexer_s=0.0, allgather_s=0.0, mgmt_s=0.0, h2d_bytes=0.0, d2h_bytes=0.0,
                     peer_bytes=0.0, attention_s=0.0, ffn_s=1e-3, collective_s=0.0, prefetch=True, d2h_blocking=True)
    t, parts = timer.run([[busy], [slow]], [0, 1], {})
    assert t == env.now and t >= 1e-3
    assert parts["ffn_s"] == 1e-3


def _solo_steps(monkeypatch, fast: bool, seed: int, preset: str, num_busy: int, num_quiet: int):
    """Forty steps where `num_busy` ranks transfer (h2d + d2h, or h2d + peer + blocking d2h on one layer; some
    with no management time, so they start at once) and `num_quiet` ranks only compute (sometimes for long, so one
    of them is simulated too): every step's (seconds, parts), the clock and the events counted."""
    if not fast:
        monkeypatch.setattr(StepTimer, "_solo", lambda *a: None)
    costs = CostModel.load(preset, "glm-5")
    env = make_env()
    num_ranks = num_busy + num_quiet
    timer = StepTimer(env, Node(env, num_ranks, costs))
    rng = np.random.default_rng(seed)
    out = []
    for step in range(40):
        prefetch = bool(step % 3 == 1)
        work = []
        for _ in range(num_busy):
            busy = _work(rng, True, prefetch).__dict__
            if prefetch:  # one layer: its transfers all gate it, no chained fetch
                busy |= {"layers": 1, "peer_after_h2d_bytes": 0.0}
            if step % 5 == 2:  # a small backup / a large one that outlives the layers
                busy |= {"d2h_bytes": float(rng.choice([0.0, 1e3, 3e7]))}
            if step % 4 == 3:
                busy |= {"indexer_s": 0.0, "allgather_s": 0.0, "mgmt_s": 0.0}
            work.append([GroupWork(**busy)])
        quiet = _work(rng, False, prefetch)
        if step % 6 == 5:
            quiet = GroupWork(**{**quiet.__dict__, "ffn_s": 1e-3})
        work += [[quiet]] * num_quiet
        out.append(timer.run(work, list(range(num_ranks)), {"overhead_s": 1e-5}))
    return out, env.now, events_scheduled(env)


@pytest.mark.parametrize("seed,preset,num_busy,num_quiet",
                         [(s, p, b, q) for s in range(2) for p in ("h200", "b300") for b, q in ((1, 0), (1, 3), (3, 0),
                                                                                               (2, 2))])
def test_ranks_computed_change_no_bit(monkeypatch, seed, preset, num_busy, num_quiet):
    """StepTimer._solo (the simulated ranks timed without simpy) gives the same clock, parts and event count as
    their simpy processes; what it cannot time (a backup outliving the layers, prefetch) falls back to simpy."""
    fast = _solo_steps(monkeypatch, True, seed, preset, num_busy, num_quiet)
    monkeypatch.undo()
    slow = _solo_steps(monkeypatch, False, seed, preset, num_busy, num_quiet)
    assert fast == slow


@pytest.mark.parametrize("num_busy,num_quiet", [(1, 0), (3, 0), (2, 2)])
def test_solo_is_used(monkeypatch, num_busy, num_quiet):
    """The shortcut above is taken, and declined at times (else the test above could pass vacuously)."""
    taken = []
    orig = StepTimer._solo

    def spy(self, *a):
        arrivals = orig(self, *a)
        taken.append(arrivals is not None)
        return arrivals

    monkeypatch.setattr(StepTimer, "_solo", spy)
    _solo_steps(monkeypatch, True, 0, "h200", num_busy, num_quiet)
    assert sum(taken) >= 10 and not all(taken)


def test_group_work_hash_is_its_fields_hash():
    """GroupWork's cached hash lists every field, in order (a field added to the class but not to the hash fails)."""
    import dataclasses

    w = _work(np.random.default_rng(5), True, True)
    assert hash(w) == hash(dataclasses.astuple(w)) == hash(w)
    assert [f.name for f in dataclasses.fields(w)][-1] == "h2d_replay_bytes"
