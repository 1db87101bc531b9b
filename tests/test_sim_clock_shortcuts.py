"""`run_until` / `run_for` (sim/hardware.py) move simpy's clock as `env.run(until=...)` would: the same clock, the
same event count and ids, the same order of every other event; and `GroupWork.of` builds the dataclass's object."""
import numpy as np
import pytest

import sim.hardware as hardware
from sim.hardware import events_scheduled, make_env, run_for, run_until
from sim.timing import GroupWork


def _script(seed: int, fast: bool):
    """A random mix of runs to a time, runs for a delay, pending timeouts and processes (some ending before the
    stop, some after, some at its very moment): the log of (time, event id, label) of every callback, the clock
    and the events scheduled."""
    env = make_env()
    rng = np.random.default_rng(seed)
    log = []

    def note(label):
        return lambda ev: log.append((env.now, label))

    def proc(k, delays):
        for d in delays:
            yield env.timeout(d)
            log.append((env.now, f"proc{k}"))

    for k in range(60):
        kind = int(rng.integers(0, 5))
        if kind == 0:  # something pending, maybe before the next stop
            env.timeout(float(rng.choice([0.0, rng.uniform(0, 2e-3)]))).callbacks.append(note(f"t{k}"))
        elif kind == 1:
            env.process(proc(k, [float(x) for x in rng.uniform(0, 1e-3, int(rng.integers(1, 3)))]))
        elif kind == 2:
            at = env.now + float(rng.choice([rng.uniform(1e-9, 1e-3), 1e-3]))
            run_until(env, at) if fast else env.run(until=at)
        elif kind == 3:
            d = float(rng.uniform(1e-9, 1e-3))
            run_for(env, d) if fast else env.run(until=env.timeout(d))
        else:  # stop on an event the caller made, as the timer's groups do
            ev = env.timeout(float(rng.uniform(0, 5e-4)))
            env.run(until=ev)
    env.run()
    return log, env.now, events_scheduled(env)


@pytest.mark.parametrize("seed", range(12))
def test_clock_shortcuts_match_simpy(seed):
    assert _script(seed, True) == _script(seed, False)


def test_clock_shortcuts_take_the_closed_form_on_a_quiet_queue():
    env = make_env()
    run_until(env, 1.0)
    run_for(env, 0.5)
    assert env.now == 1.5 and events_scheduled(env) == 4 and not env._queue


def test_a_wrong_event_count_is_caught(monkeypatch):
    """Planted error: a shortcut that takes one event id instead of two must make the scripts differ."""
    def one_id(env, at):
        at = float(at)
        hardware._pop_spent_stops(env)
        if env._queue and env._queue[0][0] <= at:
            env.run(until=at)
            return
        next(env._eid)
        env._now = env._now + (at - env._now)

    monkeypatch.setattr(hardware, "run_until", one_id)
    monkeypatch.setitem(globals(), "run_until", one_id)
    assert any(_script(seed, True) != _script(seed, False) for seed in range(12))


def test_a_clock_set_past_a_pending_event_is_caught(monkeypatch):
    """Planted error: a shortcut that ignores the pending events must make the scripts differ."""
    def blind(env, at):
        next(env._eid)
        next(env._eid)
        env._now = float(at)

    monkeypatch.setitem(globals(), "run_until", blind)
    assert any(_script(seed, True) != _script(seed, False) for seed in range(12))


FIELDS = dict(indexer_s=1e-5, allgather_s=0.0, attention_s=2e-5, ffn_s=3e-5, collective_s=1e-6, prefetch=True,
              d2h_blocking=True)
LINKS = dict(mgmt_s=1e-6, h2d_bytes=5.0, d2h_bytes=0.0, peer_bytes=100.0, peer_after_h2d_bytes=7.0)


def test_group_work_of_is_the_dataclass():
    fast, slow = GroupWork.of(3, FIELDS, LINKS), GroupWork(layers=3, **FIELDS, **LINKS)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert GroupWork.of(3, FIELDS, {**LINKS, "h2d_bytes": 6.0}) != slow
    with pytest.raises(AttributeError):
        fast.layers = 4  # still frozen


def test_group_work_of_falls_back_for_defaults_and_unknown_keys():
    links = {k: v for k, v in LINKS.items() if k != "peer_after_h2d_bytes"}
    assert GroupWork.of(2, FIELDS, links) == GroupWork(layers=2, **FIELDS, **links)
    with pytest.raises(TypeError):
        GroupWork.of(2, FIELDS, {**LINKS, "bogus": 1.0})
