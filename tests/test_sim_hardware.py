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


# ---------------------------------------------------------------------------------------------- node model (fabric)
def _fabric_finish(sizes, starts, caps, routes):
    from sim.hardware import Fabric, Route

    env = make_env()
    fab = Fabric(env, caps)
    done = {}

    def start(i):
        yield env.timeout(starts[i])
        ev = Route(fab, f"r{i}", routes[i], 1.0, 0.0).transfer(sizes[i])
        yield ev
        done[i] = env.now

    for i in range(len(sizes)):
        env.process(start(i))
    env.run()
    return done


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(1.0, 500.0), st.floats(0.0, 5.0)), min_size=1, max_size=6))
def test_fabric_with_one_resource_is_a_ps_link(flows):
    sizes = [s for s, _ in flows]
    starts = [t for _, t in flows]
    want, _ = _finish_times(sizes, starts, bw=100.0)
    got = _fabric_finish(sizes, starts, {"l": 100.0}, [{"l": 1.0}] * len(flows))
    for i in want:
        assert got[i] == pytest.approx(want[i], rel=1e-9, abs=1e-9)


def test_maxmin_shared_cap_binds_before_own_links():
    from sim.hardware import fluid_finish_s, maxmin_rates

    caps = {"a": 10.0, "b": 10.0, "host": 12.0}
    routes = [{"a": 1.0, "host": 1.0}, {"b": 1.0, "host": 1.0}]
    assert maxmin_rates(routes, caps) == pytest.approx([6.0, 6.0])
    # payload weights: equal rates, but a flow whose payload is half its occupancy loads the host half as much
    assert maxmin_rates([{"a": 1.0, "host": 0.5}, {"b": 1.0, "host": 1.0}], caps) == pytest.approx([8.0, 8.0])
    # once the small flow is done, the other gets its own link's full rate
    t = fluid_finish_s([6.0, 30.0], routes, caps)
    assert t[0] == pytest.approx(1.0) and t[1] == pytest.approx(1.0 + 24.0 / 10.0)
    with pytest.raises(ValueError):
        maxmin_rates([{"nowhere": 1.0}], caps)


class _Costs:
    """The bits of sim.costs.CostModel the node reads (row efficiency 0.5 on every PCIe link)."""

    class model:  # noqa: N801
        kv_bytes_per_token_layer = 656

    def __init__(self, host_cap=None):
        self.values = {"pcie_h2d_bw_bytes_s": 100.0, "pcie_d2h_bw_bytes_s": 100.0, "pcie_latency_s": 0.0,
                       "nvlink_bw_bytes_s": 400.0, "nvlink_latency_s": 0.0, "pcie_host_cap_bytes_s": host_cap}

    def h2d_link_bytes(self, rows, row_bytes):
        return rows * row_bytes / 0.5

    d2h_link_bytes = h2d_link_bytes

    def peer_s(self, rows, row_bytes):
        return rows * row_bytes / 400.0


def test_line_bytes():
    from sim.hardware import line_bytes

    assert [line_bytes(r) for r in (128, 656, 1152, 2048)] == [128, 768, 1152, 2048]


def test_node_model_caps_concurrent_gpus_and_scales_to_simulated_ranks():
    from sim.hardware import Node, concurrent_exchange_s

    # 2 GPUs reading 10 rows of 128 B (1280 payload = line bytes, 2560 occupancy bytes) under a 60 B/s host cap
    ex, _ = concurrent_exchange_s(_Costs(60.0), 128, [10, 10], [0, 0])
    assert ex == pytest.approx(1280 / 30.0)
    ex1, _ = concurrent_exchange_s(_Costs(60.0), 128, [10], [0])
    assert ex1 == pytest.approx(2560 / 100.0)  # one GPU alone: its own link (50 payload B/s) binds
    assert concurrent_exchange_s(_Costs(None), 128, [10, 10], [0, 0])[0] == pytest.approx(25.6)

    env = make_env()
    node = Node(env, 4, _Costs(60.0))
    assert node.fabric is not None
    out = {}

    def go():
        yield node.h2d[0].transfer(2 * 656 * 10)  # 10 rows of 656 B: 6560 payload bytes
        out["t"] = env.now

    env.process(go())
    env.run()
    # rank 0 alone stands for 4 GPUs: host share 60 / 4 = 15 B/s of lines; 656-B rows touch 6 lines (768 B)
    assert out["t"] == pytest.approx(10 * 768 / 15.0)
    node.simulate([0, 1, 2, 3])
    assert node.fabric.caps["pcie_host_cap_bytes_s"] == pytest.approx(60.0)
    assert Node(make_env(), 2, _Costs(None)).fabric is None  # no node model: plain links
