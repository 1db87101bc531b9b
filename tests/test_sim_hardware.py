"""The simpy node: processor-sharing links share bandwidth fairly; latency is not occupancy; barriers."""
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sim.hardware import Barrier, Link, events_scheduled, make_env


def _finish_times(sizes, starts, bw=100.0):
    env = make_env()
    link = Link(env, "l", bw, latency_s=0.0)
    done = {}

    def start(i):
        yield env.timeout(starts[i])
        ev = link.transfer(sizes[i])
        yield ev
        done[i] = env.now

    for i in range(len(sizes)):
        env.process(start(i))
    env.run()
    return done, link


def test_two_equal_transfers_share_the_link():
    done, link = _finish_times([100.0, 100.0], [0.0, 0.0])
    assert done[0] == pytest.approx(2.0) and done[1] == pytest.approx(2.0)
    assert link.busy_s == pytest.approx(2.0)


def test_small_transfer_finishes_first_then_large_gets_full_bandwidth():
    done, _ = _finish_times([50.0, 200.0], [0.0, 0.0])
    assert done[0] == pytest.approx(1.0)  # 50 B at 50 B/s while shared
    assert done[1] == pytest.approx(2.5)  # 150 B left at 100 B/s


def test_late_joiner_slows_the_first():
    done, _ = _finish_times([100.0, 20.0], [0.0, 0.5])
    # first: 50 B alone by t=0.5, then shares: the joiner's 20 B take 0.4 s, then 30 B left alone -> 0.3 s
    assert done[1] == pytest.approx(0.9)
    assert done[0] == pytest.approx(1.2)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 500.0), st.floats(0.0, 5.0)), min_size=1, max_size=8))
@example([(1.0, 0.0), (1.0, 1e-06)])  # a joiner's last 1e-4 B used to be dropped by an absolute byte floor
def test_work_conserving(flows):
    """A PS link is never idle while work is pending: the last finish equals the fluid bound."""
    sizes = [s for s, _ in flows]
    starts = [t for _, t in flows]
    done, link = _finish_times(sizes, starts, bw=100.0)
    assert len(done) == len(flows)
    # busy time equals total bytes / bandwidth (no time lost, none invented)
    assert link.busy_s == pytest.approx(sum(sizes) / 100.0, rel=1e-6)
    for i, (s, t) in enumerate(flows):
        assert done[i] >= t + s / 100.0 - 1e-9  # never faster than alone


def test_barrier_releases_when_all_arrive():
    env = make_env()
    b = Barrier(env, 3)
    out = []

    def party(r, delay):
        yield env.timeout(delay)
        yield b.arrive(r)
        out.append((r, env.now))

    for r, d in enumerate([1.0, 3.0, 2.0]):
        env.process(party(r, d))
    env.run()
    assert all(t == pytest.approx(3.0) for _, t in out)
    assert max(b.arrivals)[1] == 1  # the critical rank
    assert events_scheduled(env) > 0
