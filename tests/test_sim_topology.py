"""Node topology (sim/hardware.py `Topology`): per-GPU links behind PCIe switches on CPU sockets, per-socket host
caps, NUMA placement of host KV, and the scaling of each shared cap to the simulated ranks."""
from __future__ import annotations

import dataclasses

import pytest

from sim.costs import CostModel
from sim.hardware import Node, concurrent_exchange_s, make_env, node_caps, pcie_route, topology_of
from sim.presets import HARDWARE_PRESETS, build_hardware

ROWS = 65536


def _costs(preset: str = "h200", **hw) -> CostModel:
    cm = CostModel.load(preset, "glm-5.2")
    return dataclasses.replace(cm, hardware=dataclasses.replace(cm.hardware, **hw)) if hw else cm


def _swap(costs, ranks: int, rows: int = ROWS) -> float:
    return concurrent_exchange_s(costs, 656, [rows] * ranks, [rows] * ranks)[0]


def test_presets_place_four_gpus_per_socket_and_b300_host_path_is_gen5():
    topo = topology_of(_costs())
    assert [topo.socket_of(r) for r in range(8)] == [0] * 4 + [1] * 4
    assert [topo.switch_of(r) for r in (0, 3, 4)] == [(0, 0), (0, 3), (1, 0)]
    b300 = HARDWARE_PRESETS["b300"]
    assert b300.pcie_bw_bytes_s == HARDWARE_PRESETS["h200"].pcie_bw_bytes_s  # ConnectX-8 uplink: Gen5 x16
    assert b300.socket_mem_bw_bytes_s == pytest.approx(8 * 5200e6 * 8)  # Xeon 6776P: DDR5-5200, 2 DIMMs a channel
    with pytest.raises(ValueError, match="host_kv_remote_fraction"):
        build_hardware("h200", {"host_kv_remote_fraction": 1.5})
    with pytest.raises(ValueError, match="host_kv_remote_fraction"):
        build_hardware("h200", {"num_sockets": 1, "host_kv_remote_fraction": 0.5})


def test_calibrated_host_cap_is_per_socket():
    """The 2-GPU fitted cap now binds each socket's 4 GPUs: 8 GPUs swap in the time 4 take, where one node-wide cap
    (one socket) made them twice as slow; 1..4 GPUs are unchanged (all on socket 0)."""
    cm, one = _costs(), _costs(num_sockets=1)
    caps = node_caps(cm, 8)
    assert caps["pcie_host_cap_bytes_s@socket0"] == caps["pcie_host_cap_bytes_s@socket1"] == cm[
        "pcie_host_cap_bytes_s"]
    for k in (1, 2, 4):
        assert _swap(cm, k) == pytest.approx(_swap(one, k), rel=1e-12)
    assert _swap(cm, 8) == pytest.approx(_swap(cm, 4), rel=1e-12)
    assert _swap(one, 8) > 1.9 * (_swap(cm, 8) - cm["pcie_latency_s"])


def test_a_shared_switch_uplink_halves_two_gpus_reads():
    """Two GPUs behind one switch whose uplink carries one GPU link: each reads at half its link; GPUs on
    different switches do not meet there. The uplink is a resource only where it can bind."""
    cm = _costs(gpus_per_switch=2, socket_mem_bw_bytes_s=1e15)
    v = cm.values
    rows = 32768
    alone = concurrent_exchange_s(cm, 656, [rows], [0])[0] - v["pcie_latency_s"]
    pair = concurrent_exchange_s(cm, 656, [rows, rows], [0, 0])[0] - v["pcie_latency_s"]
    assert pair == pytest.approx(2 * alone, rel=1e-9)
    assert "sw0.0_h2d" in pcie_route(cm, "h2d", 1, 656) and "sw0.1_h2d" in pcie_route(cm, "h2d", 2, 656)
    assert not any(k.startswith("sw") for k in node_caps(_costs(), 8))  # one GPU per x16 switch: never binds


def test_remote_host_kv_crosses_the_inter_socket_link():
    """All of a rank's host KV on the other socket, a slow inter-socket link: reads take its rate (line bytes).
    Sockets load alike, so a GPU's remote share is counted on the link into its own socket (the other socket's
    writes mirror its own) and on its own socket's DRAM (the other socket's remote rows mirror its own)."""
    upi = 5e9
    cm = _costs(host_kv_remote_fraction=1.0, inter_socket_bw_bytes_s=upi)
    route = pcie_route(cm, "h2d", 0, 656)
    assert "upi1>0" in route and "mem0" in route and "mem1" not in route
    assert "upi1>0" in pcie_route(cm, "d2h", 0, 656) and "upi0>1" in pcie_route(cm, "h2d", 4, 656)
    t = concurrent_exchange_s(cm, 656, [ROWS], [0])[0] - cm["pcie_latency_s"]
    assert t == pytest.approx(ROWS * 768 / upi, rel=1e-9)  # a 656-B row touches 6 lines
    half = _costs(host_kv_remote_fraction=0.5, inter_socket_bw_bytes_s=upi)
    assert concurrent_exchange_s(half, 656, [ROWS], [0])[0] - cm["pcie_latency_s"] == pytest.approx(t / 2, rel=1e-9)
    # rank 0 alone stands for its 3 socket-mates on the link into socket 0 (its only users: socket 0's GPUs)
    assert _node_time(half, 8, [0]) == pytest.approx(_node_time(half, 8, range(8)), rel=1e-9)


def _node_time(costs, num_gpus: int, ranks, rows: int = ROWS) -> float:
    env = make_env()
    node = Node(env, num_gpus, costs)
    node.simulate(ranks)
    done = {}

    def go(r):
        yield node.h2d[r].transfer(costs.h2d_link_bytes(rows, 656))
        done[r] = env.now

    for r in ranks:
        env.process(go(r))
    env.run()
    return max(done.values())


def test_a_simulated_rank_stands_for_its_switch_and_socket_mates():
    """Rank 0 alone (a symmetric DP run) sees each shared cap scaled to its share of the cap's users (1/4 of its
    socket, 1/2 of its switch); its time equals all 8 ranks transferring at once, and the caps come back in full
    when every rank is simulated."""
    for hw in ({}, {"gpus_per_switch": 2}):
        cm = _costs(**hw)
        all8 = _node_time(cm, 8, range(8))
        assert _node_time(cm, 8, [0]) == pytest.approx(all8, rel=1e-9)
        assert _node_time(cm, 8, [0, 4]) == pytest.approx(all8, rel=1e-9)
        assert all8 == pytest.approx(concurrent_exchange_s(cm, 656, [ROWS] * 8, [0] * 8)[0] - cm["pcie_latency_s"],
                                     rel=1e-9)
    node = Node(make_env(), 8, _costs(gpus_per_switch=2))
    node.simulate([0])
    caps = node.fabric.caps
    assert caps["pcie_host_cap_bytes_s@socket0"] == pytest.approx(_costs()["pcie_host_cap_bytes_s"] / 4)
    assert caps["sw0.0_h2d"] == pytest.approx(node_caps(_costs(gpus_per_switch=2), 8)["sw0.0_h2d"] / 2)
    assert caps["pcie_host_cap_bytes_s@socket1"] == pytest.approx(_costs()["pcie_host_cap_bytes_s"])  # unused
    node.simulate(range(8))
    assert dict(node.fabric.caps) == node_caps(_costs(gpus_per_switch=2), 8)


def test_uncalibrated_node_is_modelled_from_the_datasheet_caps_alone():
    """With no calibrated host cap the datasheet DRAM cap alone shares a socket (here made tight enough to bind):
    4 GPUs swapping at once are slower than one, 8 as slow as 4 (two sockets)."""
    cm = CostModel.load("h200", "glm-5.2", calibration="none")
    caps = node_caps(cm, 8)
    assert "pcie_host_cap_bytes_s@socket0" not in caps and caps["mem0"] == pytest.approx(281.6e9)
    tight = dataclasses.replace(cm, hardware=dataclasses.replace(cm.hardware, socket_mem_bw_bytes_s=60e9))
    assert _swap(tight, 4) > _swap(tight, 1) * 1.2
    assert _swap(tight, 8) == pytest.approx(_swap(tight, 4), rel=1e-12)
