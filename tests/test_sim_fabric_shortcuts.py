"""The fabric's shortcuts inside simpy (done events of a wake-up processed in place when nothing else is due at that
instant; the re-plan of a wake-up skipped when a chained fetch's start supersedes it) give the same clock, parts,
bytes and event count as scheduling every event."""
import itertools

import numpy as np
import pytest

from sim.costs import CostModel
from sim.hardware import Fabric, Node, events_scheduled, make_env
from sim.timing import GroupWork, StepTimer

_START = Fabric.start


def _recording_starts(monkeypatch) -> list:
    """Every transfer start from now on, in order (owner name, clock): the order the fabric's rates and the event ids
    depend on."""
    starts = []
    monkeypatch.setattr(Fabric, "start", lambda self, owner, *a: starts.append((owner.name, self.env.now))
                        or _START(self, owner, *a))
    return starts


def _two_ranks(monkeypatch, fast: bool):
    """A fresh clock and a node of two simulated ranks, with the shortcuts on or off and starts not recorded."""
    monkeypatch.setattr(Fabric, "shortcuts", fast)
    monkeypatch.setattr(Fabric, "start", _START)
    env = make_env()
    node = Node(env, 2, CostModel.load("h200", "glm-5"))
    node.simulate([0, 1])
    return env, node


def _work(rng, prefetch: bool) -> GroupWork:
    """Random rank work; some parts often zero, and values from a few levels (some tiny) so that events tie."""
    def u(a, b, zero=0.0):
        if rng.random() < zero:
            return 0.0
        return float(rng.choice([a, b, (a + b) / 2, a / 100])) if rng.random() < 0.3 else float(rng.uniform(a, b))

    blocking = bool(rng.random() < 0.8)
    return GroupWork(layers=int(rng.integers(1, 5)), indexer_s=u(0, 2e-5, 0.2), allgather_s=u(0, 1e-5, 0.3),
                     mgmt_s=u(0, 1e-5, 0.3), h2d_bytes=u(1e4, 1e7, 0.2), d2h_bytes=u(1e4, 1e6, 0.3),
                     peer_bytes=u(1e4, 1e7, 0.3), attention_s=u(1e-6, 3e-5, 0.1), ffn_s=u(1e-6, 1e-5, 0.1),
                     collective_s=u(0, 1e-5, 0.3), prefetch=prefetch, d2h_blocking=blocking or not prefetch,
                     peer_after_h2d_bytes=u(1e4, 1e7, 0.4))


def _steps(monkeypatch, fast: bool, seed: int, num_ranks: int, start_s: float):
    """Thirty steps of three groups on every rank (some ranks sharing a work object), from clock `start_s` (late
    clocks round short spans away: events coincide): each step's (seconds, parts), the clock, the events counted
    and every link's bytes."""
    monkeypatch.setattr(Fabric, "shortcuts", fast)
    starts = _recording_starts(monkeypatch)
    costs = CostModel.load("h200", "glm-5")
    env = make_env()
    node = Node(env, num_ranks, costs)
    timer = StepTimer(env, node)
    if start_s:
        env.run(until=start_s)
    rng = np.random.default_rng(seed)
    out = []
    for step in range(30):
        prefetch = bool(step % 3)
        work = []
        for r in range(num_ranks):
            if r and rng.random() < 0.3:
                work.append(work[-1])  # the same objects: equal start times, ties broken by event order
            else:
                work.append([_work(rng, prefetch) for _ in range(3)])
        ranks = list(range(num_ranks)) if step % 5 else list(range(0, num_ranks, 2))
        out.append(timer.run(work[:len(ranks)], ranks, {"overhead_s": 1e-5}, dedup=bool(step % 2)))
    links = [link.bytes_total for links in (node.h2d, node.d2h, node.nvlink) for link in links]
    return out, env.now, events_scheduled(env), links, starts


@pytest.mark.parametrize("seed,num_ranks,start_s",
                         list(itertools.product(range(4), (1, 3, 4), (0.0, 3e7, 1e9))))
def test_fabric_shortcuts_change_no_bit(monkeypatch, seed, num_ranks, start_s):
    assert _steps(monkeypatch, True, seed, num_ranks, start_s) == _steps(monkeypatch, False, seed, num_ranks, start_s)


def _until_transfer(monkeypatch, fast: bool):
    env, node = _two_ranks(monkeypatch, fast)
    first = node.h2d[0].transfer(1e6)
    second = node.h2d[1].transfer(4e6)
    env.run(until=first)
    stop = (env.now, first.triggered, first.callbacks, second.triggered, node.fabric.busy(), events_scheduled(env),
            len(env._queue))
    env.run()
    return stop, env.now, events_scheduled(env)


def test_a_run_until_a_transfer_still_stops_there(monkeypatch):
    """A transfer's done event given to simpy as `until` is processed by simpy (its stop), not in place."""
    fast = _until_transfer(monkeypatch, True)
    assert fast == _until_transfer(monkeypatch, False)
    assert fast[0][1:5] == (True, [], False, True)


def _coinciding(monkeypatch, fast: bool):
    """Rank 0's H2D (with a chained fetch) ends at the very instant rank 1's timeout starts its own H2D, the
    timeout queued after the wake-up: simpy processes the timeout before the H2D's done event (which the wake-up
    schedules), so rank 1's transfer starts before rank 0's chained fetch. Returns the start order and the clock."""
    probe, node = _two_ranks(monkeypatch, fast)
    node.h2d[0].transfer(3e6)
    probe.run()
    at = probe.now  # when rank 0's H2D ends alone
    env, node = _two_ranks(monkeypatch, fast)
    starts = _recording_starts(monkeypatch)
    h2d = node.h2d[0].transfer(3e6)
    h2d.callbacks.append(lambda _e: node.nvlink[0].transfer(1e6))
    node.followed(h2d)
    env.timeout(at).callbacks.append(lambda _e: node.h2d[1].transfer(2e6))
    env.run()
    return starts, env.now, events_scheduled(env)


def test_done_events_wait_for_events_due_at_their_instant(monkeypatch):
    fast = _coinciding(monkeypatch, True)
    assert fast == _coinciding(monkeypatch, False)
    assert [name for name, _ in fast[0]] == ["gpu0 pcie h2d", "gpu1 pcie h2d", "gpu0 nvlink in"]
    assert fast[0][1][1] == fast[0][2][1]


def _urgent(monkeypatch, fast: bool):
    """Two equal H2Ds (ranks 0 and 1) end at one wake-up; the first's done event starts a process, whose urgent
    Initialize simpy runs before the second done event: rank 0's fetch starts before rank 1's."""
    env, node = _two_ranks(monkeypatch, fast)
    starts = _recording_starts(monkeypatch)

    def fetch():
        yield node.nvlink[0].transfer(1e6)

    a, b = node.h2d[0].transfer(2e6), node.h2d[1].transfer(2e6)
    a.callbacks.append(lambda _e: env.process(fetch()))
    b.callbacks.append(lambda _e: node.nvlink[1].transfer(1e6))
    env.run()
    return starts, env.now, events_scheduled(env)


def test_an_urgent_event_scheduled_in_place_runs_before_the_next_done_event(monkeypatch):
    fast = _urgent(monkeypatch, True)
    assert fast == _urgent(monkeypatch, False)
    assert [name for name, _ in fast[0]] == ["gpu0 pcie h2d", "gpu1 pcie h2d", "gpu0 nvlink in", "gpu1 nvlink in"]
