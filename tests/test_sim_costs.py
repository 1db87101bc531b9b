"""Cost model: defaults, calibration by default (and derived for B300), unknown keys, the per-piece formulas."""
import dataclasses

import pytest
import simpy
import yaml

from sim import calibration
from sim.costs import CostModel
from sim.hardware import Node
from sim.hisparse_costs import HiSparseCosts
from sim.presets import HARDWARE_PRESETS, MODEL_PRESETS, build_hardware
from sim.systems import HiSparse, System
from sim.timing import GroupWork, StepTimer


def test_uncalibrated_defaults_fill_from_the_preset():
    cm = CostModel.load("h200", "glm-5.2", calibration="none")
    hw = HARDWARE_PRESETS["h200"]
    assert cm["pcie_h2d_bw_bytes_s"] == hw.pcie_bw_bytes_s
    assert cm["launch_s"] == hw.kernel_launch_s
    assert cm["h2d_row_efficiency"] == 0.36
    assert cm.model is MODEL_PRESETS["glm-5.2"]
    assert cm.provenance["calibration"] is None


def test_h200_default_is_the_committed_calibration():
    cal, _ = calibration.read(calibration.CALIBRATION_DIR / "h200.yaml")
    cm = CostModel.load("h200", "glm-5")
    assert cm.provenance["calibration"] == "hw/calibration/h200.yaml"
    assert "derivation" not in cm.provenance
    for key in ("pcie_h2d_bw_bytes_s", "nvlink_bw_bytes_s", "launch_s", "mgmt_per_ref_s", "pcie_latency_s"):
        assert cm[key] == cal[key]
    # 656-B rows: the measured exchange efficiency (0.79), not the naive gather (0.36), for every system using it
    assert cm.h2d_link_bytes(1000, 656) == pytest.approx(1000 * 656 / cal["h2d_row_efficiency_by_bytes"][656])


def test_b300_is_derived_from_h200_with_datasheet_ratios():
    cal, _ = calibration.read(calibration.CALIBRATION_DIR / "h200.yaml")
    h200, b300 = HARDWARE_PRESETS["h200"], HARDWARE_PRESETS["b300"]
    cm = CostModel.load("b300", "glm-5")
    pcie = b300.pcie_bw_bytes_s / h200.pcie_bw_bytes_s
    assert cm["pcie_h2d_bw_bytes_s"] == pytest.approx(cal["pcie_h2d_bw_bytes_s"] * pcie)
    assert cm["pcie_d2h_bw_bytes_s"] == pytest.approx(cal["pcie_d2h_bw_bytes_s"] * pcie)
    assert cm["nvlink_bw_bytes_s"] == pytest.approx(cal["nvlink_bw_bytes_s"] * 2.0)
    assert cm["mgmt_per_ref_s"] == pytest.approx(cal["mgmt_per_ref_s"] * 4.8 / 8.0)
    for key in ("launch_s", "pcie_latency_s", "nvlink_latency_s", "hbm_efficiency", "mgmt_kernels"):
        assert cm[key] == cal[key]  # carried over unchanged
    assert cm.h2d_link_bytes(1, 656) == CostModel.load("h200", "glm-5").h2d_link_bytes(1, 656)
    assert set(cm.provenance["derivation"]) >= {"nvlink_bw_bytes_s", "mgmt_per_ref_s"}
    assert pcie == 1.0  # a B300 node's host path is Gen5 x16 like H200's (sim/presets.py, issue 26 item 7)


def test_hardware_overrides_still_move_the_calibrated_links():
    hw = build_hardware("h200", {"pcie_bw_bytes_s": 111e9})
    base = CostModel.load("h200", "glm-5")
    cm = CostModel.load(hw, "glm-5")
    assert cm["pcie_h2d_bw_bytes_s"] == pytest.approx(2 * base["pcie_h2d_bw_bytes_s"])
    assert cm["nvlink_bw_bytes_s"] == base["nvlink_bw_bytes_s"]


def test_config_costs_win_over_the_calibration(tmp_path):
    cm = CostModel.load("h200", "glm-5", overrides={"h2d_row_efficiency_by_bytes": {656: 0.5}, "launch_s": 1e-5})
    assert cm.h2d_link_bytes(1, 656) == pytest.approx(656 / 0.5)
    assert cm["launch_s"] == 1e-5
    assert cm.provenance["config_costs"] == ["h2d_row_efficiency_by_bytes", "launch_s"]


def test_explicit_calibration_file_and_tables(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"provenance": {"device": "H200", "date": "2026-11-30", "command": "x"},
                                   "costs": {"mgmt_per_ref_s": 1e-10, "h2d_row_efficiency_by_bytes":
                                             {656: 0.5, 1152: 0.9}}}))
    cm = CostModel.load("h200", "glm-5", calibration=cal)
    assert cm["mgmt_per_ref_s"] == 1e-10
    assert cm.h2d_link_bytes(1, 656) == pytest.approx(656 / 0.5)
    assert cm.h2d_link_bytes(1, 904) == pytest.approx(904 / 0.7)  # interpolated
    assert cm.management_s(2_000_000, 1_000_000, 0) == pytest.approx(cm.launch_s(5) + 2e-4)
    assert cm.provenance["calibration"] == str(cal)


@pytest.mark.parametrize("costs, msg", [
    ({"costs": {"no_such_key": 1}}, "unknown cost key"),
    ({"costs": {"mgmt_per_ref_s": "fast"}}, "non-negative number"),
    ({"costs": {"hbm_efficiency": 2.0}}, "must be in (0, 1]"),
    ({"costs": {"cuda_graphs": 2}}, "cuda_graphs must be 0 or 1"),
    ({"costs": {"hisparse_swapin_efficiency_by_batch": {1: 1.5}}}, "efficiency in (0, 1]"),
    ({"provenance": {}, "costs": {}, "extra": 1}, "unknown calibration key"),
    ({"provenance": {}}, "needs a top-level 'costs:'"),
])
def test_bad_calibration_is_refused(tmp_path, costs, msg):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump(costs))
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        CostModel.load("h200", "glm-5", calibration=cal)


def test_compute_pieces_scale_sensibly():
    cm = CostModel.load("h200", "deepseek-v3.2")
    assert cm.attention_s(1024, 2 * 1024 * 2048, 16) > cm.attention_s(1024, 1024 * 2048, 16)
    assert cm.indexer_s(8 * 131072, 8 * 131072 * 4) > cm.indexer_s(131072, 131072 * 4)
    # decode at batch 256 reads (nearly) every expert: MoE time ~ weights / HBM bandwidth per layer
    full = cm.ffn_s(256, 8, attn_replicated=False)
    one = cm.ffn_s(1, 8, attn_replicated=False)
    assert full > 5 * one
    assert cm.collective_s(1e6, 1) == 0.0 and cm.collective_s(1e6, 8) > 0


# ---- item 5: CUDA graphs
def test_decode_kernels_cost_a_graph_kernel_not_a_launch_each():
    graphs = CostModel.load("h200", "glm-5")
    eager = CostModel.load("h200", "glm-5", overrides={"cuda_graphs": 0})
    assert graphs.kernel_overhead_s(10) == pytest.approx(10 * graphs["graph_kernel_s"])
    assert eager.kernel_overhead_s(10) == pytest.approx(10 * eager["launch_s"])
    # a batch-1 layer: attention + MoE + indexer kernels; the eager model pays ~4.7 us each, the graph ~0.75 us
    per_layer = lambda cm: cm.attention_s(1, 2048, 8) + cm.ffn_s(1, 8, False) + cm.indexer_s(65536, 65536)
    kernels = sum(graphs[k] for k in ("attn_kernels_per_layer", "moe_kernels_per_layer", "indexer_kernels"))
    saved = per_layer(eager) - per_layer(graphs)
    assert saved == pytest.approx(kernels * (eager["launch_s"] - graphs["graph_kernel_s"]))
    assert saved * 78 > 2.5e-3  # > 2.5 ms of a glm-5 step (78 layers) was launch overhead
    # one graph launch per step (3 with EAGLE/MTP: verify, draft, draft-extend); none counted eagerly
    assert graphs.step_overhead_s(False) == pytest.approx(graphs["step_overhead_s"] + graphs["graph_launch_s"])
    assert graphs.step_overhead_s(True) == pytest.approx(graphs["step_overhead_s"] + 3 * graphs["graph_launch_s"])
    assert eager.step_overhead_s(True) == pytest.approx(eager["step_overhead_s"])


# ---- item 4: TP communication
def test_allgather_moves_n_minus_1_contributions_per_rank():
    cm = CostModel.load("h200", "glm-5")
    b, n = 4096 * 2048 * 8.0, 8
    assert cm.collective_link_bytes(b, n, "allgather") == pytest.approx(7 * b)
    assert cm.collective_s(b, n, "allgather") == pytest.approx(cm["collective_latency_s"] + 7 * b / cm["nvlink_bw_bytes_s"])
    # all-reduce / all-to-all keep their whole-buffer meaning
    assert cm.collective_link_bytes(b, n, "allreduce") == pytest.approx(2 * 7 / 8 * b)
    assert cm.collective_link_bytes(b, n, "alltoall") == pytest.approx(7 / 8 * b)


def test_distributed_topk_adds_the_merge_of_n_times_k_candidates():
    cm = CostModel.load("h200", "glm-5")
    q, n = 1024, 8
    b = q * 2048 * 8.0
    merge = cm.topk_merge_s(q, n * 2048)
    assert merge > cm.kernel_overhead_s(1)
    assert merge == pytest.approx(cm.kernel_overhead_s(1) + q * (n * 2048 * 8 + 2048 * 4)
                                  / (cm.hardware.hbm_bw_bytes_s * cm["hbm_efficiency"]))
    assert cm.distributed_topk_s(b, q, n) == pytest.approx(cm.collective_s(b, n, "allgather") + merge)
    assert cm.distributed_topk_s(b, q, 1) == 0.0
    assert cm.topk_merge_s(q, 16 * 2048) > merge


def _one_group(costs, work: GroupWork) -> float:
    env = simpy.Environment()
    timer = StepTimer(env, Node(env, 1, costs))
    t, _ = timer.run([[work]], [0], {})
    return t


def test_peer_fetch_of_a_promoted_row_waits_for_its_promotion():
    cm = CostModel.load("h200", "glm-5", calibration="none",
                        overrides={"pcie_latency_s": 0.0, "nvlink_latency_s": 0.0})
    base = dict(layers=1, indexer_s=0.0, allgather_s=0.0, mgmt_s=0.0, d2h_bytes=0.0, attention_s=0.0, ffn_s=0.0,
                collective_s=0.0, prefetch=True, d2h_blocking=True)
    h2d = cm["pcie_h2d_bw_bytes_s"] * 1e-3  # 1 ms alone on PCIe
    peer = cm["nvlink_bw_bytes_s"] * 1e-3  # 1 ms alone on NVLink
    together = _one_group(cm, GroupWork(h2d_bytes=h2d, peer_bytes=peer, **base))
    chained = _one_group(cm, GroupWork(h2d_bytes=h2d, peer_bytes=0.0, peer_after_h2d_bytes=peer, **base))
    assert together == pytest.approx(1e-3, rel=1e-6)
    assert chained == pytest.approx(2e-3, rel=1e-6)


# ---- item 3: HiSparse's swap-in
def test_hisparse_swapin_efficiency_fallback_and_table():
    cm = CostModel.load("h200", "glm-5", calibration="none")
    assert HiSparseCosts(cm).swapin_efficiency(1) == HiSparseCosts(cm).swapin_efficiency(256) == 0.36
    tab = CostModel.load("h200", "glm-5", overrides={"hisparse_swapin_efficiency_by_batch": {1: 0.1, 16: 0.5,
                                                                                            256: 0.8}})
    assert HiSparseCosts(tab).swapin_efficiency(1) == pytest.approx(0.1)
    assert HiSparseCosts(tab).swapin_efficiency(4) == pytest.approx(0.3)  # log-interpolated
    assert HiSparseCosts(tab).swapin_efficiency(1000) == pytest.approx(0.8)
    # the link carries the payload at the exchange efficiency (or the swap-in's where higher); the rest of the
    # swap-in's time at small batch is its blocks' rate limit, not link occupancy
    ex = tab.h2d_link_bytes(1, 656) / 656
    assert HiSparseCosts(tab).swapin_link_bytes(100, 656, 16) == pytest.approx(100 * 656 * min(ex, 1 / 0.5))
    bw = tab["pcie_h2d_bw_bytes_s"]
    for batch, eff in ((1, 0.1), (16, 0.5), (256, 0.8)):
        hc = HiSparseCosts(tab)
        total = hc.swapin_link_bytes(1000, 656, batch) / bw + hc.swapin_excess_s(1000, 656, batch)
        assert total == pytest.approx(max(1000 * 656 / (bw * eff), tab.h2d_link_bytes(1000, 656) / bw))


def test_systems_pick_their_own_mechanism_costs():
    cm = CostModel.load("h200", "glm-5", overrides={"hisparse_swapin_efficiency_by_batch": {1: 0.1, 256: 0.8}})
    # HiSparse's copies: link occupancy at the exchange efficiency + its swap-in kernel's rate limit at its batch
    # (on the compute stream); UlaCache's: the calibrated exchange alone
    from types import SimpleNamespace

    hs = SimpleNamespace(cfg=SimpleNamespace(model=cm.model), q=1, query_chunk=lambda: 1, mtp=False)
    assert HiSparse.h2d_link_bytes(hs, cm, 100, 656, 1) == pytest.approx(cm.h2d_link_bytes(100, 656))
    assert System.h2d_link_bytes(None, cm, 100, 656, 1) == pytest.approx(cm.h2d_link_bytes(100, 656))
    assert HiSparse.management_s(hs, cm, 2048, 2048, 900, 1) == pytest.approx(
        cm["hisparse_swapin_fixed_s"] + cm["hisparse_per_ref_s"] * 2048 + HiSparseCosts(cm).swapin_excess_s(900, 656, 1))
    # outside the MTP kernel's limits: one non-MTP call per chunk of verify tokens the buffer holds
    chunked = SimpleNamespace(cfg=SimpleNamespace(model=cm.model), q=4, query_chunk=lambda: 2, mtp=False)
    assert HiSparse.management_s(chunked, cm, 4 * 2048, 0, 0, 1) == pytest.approx(
        2 * cm["hisparse_swapin_fixed_s"] + cm["hisparse_per_ref_s"] * 4 * 2048)
    # SGLang's MTP path: one launch pair per layer for all 4 verify tokens (the MTP keys where measured)
    mtp = SimpleNamespace(cfg=SimpleNamespace(model=cm.model), q=4, query_chunk=lambda: 2, mtp=True)
    fixed = cm["hisparse_mtp_swapin_fixed_s"] or cm["hisparse_swapin_fixed_s"]
    per_ref = cm["hisparse_mtp_per_ref_s"] or cm["hisparse_per_ref_s"]
    assert HiSparse.management_s(mtp, cm, 4 * 2048, 0, 0, 1) == pytest.approx(
        max(fixed, cm.kernel_overhead_s(2)) + per_ref * 4 * 2048)
    assert HiSparseCosts(cm).swapin_excess_s(900, 656, 1) == pytest.approx(
        900 * 656 / cm["pcie_h2d_bw_bytes_s"] * (1 / 0.1 - cm.h2d_link_bytes(1, 656) / 656))
    assert cm["hisparse_swapin_fixed_s"] > 10 * cm.kernel_overhead_s(1)  # one block scans its 4096-slot buffer
    bare = CostModel.load("h200", "glm-5", overrides={"hisparse_swapin_fixed_s": 0.0})
    assert HiSparseCosts(bare).management_s(0.0 + 1) == pytest.approx(
        bare.kernel_overhead_s(1) + bare["hisparse_per_ref_s"])
    assert System.management_s(None, cm, 2048, 2048, 900, 1) == pytest.approx(cm.management_s(2048, 2048, 900))


# ---- item 5: the MTP draft layer in the budgets
def test_mtp_draft_layer_weights_and_kv_count_when_speculating():
    from sim.config import build, resolve
    from sim.systems import budget_for, make_system

    m = MODEL_PRESETS["glm-5"]
    one_layer = m.weight_bytes / m.num_layers
    assert m.weight_bytes_per_gpu(8, True, True) - m.weight_bytes_per_gpu(8, True) == pytest.approx(one_layer / 8)
    dp_extra = m.weight_bytes_per_gpu(8, False, True) - m.weight_bytes_per_gpu(8, False)
    attn_layer = m.attn_weight_bytes / m.num_layers
    assert dp_extra == pytest.approx((one_layer - attn_layer) / 8 + attn_layer)  # its attention replicated under DP
    assert m.kv_bytes_per_token_with_draft(True) == 656 * 79 and m.kv_bytes_per_token_with_draft(False) == 656 * 78
    assert m.index_bytes_per_token_with_draft(True) == 132 * 79
    base = {"system": "sglang", "attention": "tp", "model": {"preset": "glm-5"}}
    off = build(resolve(base))
    on = build(resolve({**base, "spec": {"draft_tokens": 4}}))
    assert budget_for(off).gpu_kv_bytes_per_gpu - budget_for(on).gpu_kv_bytes_per_gpu == pytest.approx(one_layer / 8)
    s_off = make_system(off, budget_for(off), 80_000.0)
    s_on = make_system(on, budget_for(on), 80_000.0)
    assert s_on.capacity.logical_tokens_per_space < s_off.capacity.logical_tokens_per_space


def test_node_host_caps_are_optional_and_derived_like_pcie():
    cm = CostModel.load("h200", "glm-5")
    assert cm["pcie_host_cap_bytes_s"] is None or cm["pcie_host_cap_bytes_s"] > 0
    h200 = HARDWARE_PRESETS["h200"]
    b300 = dataclasses.replace(HARDWARE_PRESETS["b300"], pcie_bw_bytes_s=2 * h200.pcie_bw_bytes_s)  # a faster host link
    out, notes = calibration.derive({"pcie_host_h2d_cap_bytes_s": 100e9, "launch_s": 5e-6}, h200, b300)
    assert out["pcie_host_h2d_cap_bytes_s"] == pytest.approx(100e9 * b300.pcie_bw_bytes_s / h200.pcie_bw_bytes_s)
    assert out["launch_s"] == 5e-6 and "launch_s" not in notes
    # HiSparse's swap-in keeps its absolute rate (blocks x bytes in flight / read latency) on a faster link
    out, notes = calibration.derive({"hisparse_swapin_efficiency_by_batch": {1: 0.04, 64: 0.9}}, h200, b300)
    r = h200.pcie_bw_bytes_s / b300.pcie_bw_bytes_s
    assert out["hisparse_swapin_efficiency_by_batch"] == pytest.approx({1: 0.04 * r, 64: 0.9 * r})
    assert "hisparse_swapin_efficiency_by_batch" in notes
    capped = CostModel.load("h200", "glm-5", overrides={"pcie_host_h2d_cap_bytes_s": 80e9})
    assert capped["pcie_host_h2d_cap_bytes_s"] == 80e9


# ---- item 6 (cost part): a chunk of chunked prefill
def test_prefill_chunk_cost():
    cm = CostModel.load("h200", "glm-5.2")
    m = cm.model
    assert cm.prefill_chunk_s(0, 1000, 8, True) == 0.0
    first = cm.prefill_chunk_s(8192, 0, 8, False)
    late = cm.prefill_chunk_s(8192, 120_000, 8, False)
    assert late > first  # the indexer scores every earlier key: later chunks cost more
    extra_pairs = 8192 * 120_000
    idx_flops = 2.0 * extra_pairs * m.index_heads * m.index_head_dim * m.num_index_groups
    assert late - first == pytest.approx(idx_flops / (cm.hardware.fp8_flops * cm["flops_efficiency"]), rel=0.05)
    # TP splits attention heads over the ranks: a chunk is cheaper per GPU than under DP (all heads on one rank)
    assert cm.prefill_chunk_s(8192, 60_000, 8, True) < cm.prefill_chunk_s(8192, 60_000, 8, False)
    # a 64K-token prompt in 8K chunks takes tenths of a second to seconds on 8 H200 (not microseconds, not minutes)
    total = sum(cm.prefill_chunk_s(8192, c, 8, False) for c in range(0, 65536, 8192))
    assert 0.1 < total < 10.0


def test_mixed_prefill_rides_on_the_decode_batch():
    """A prompt piece in a decode step adds its attention + indexer and what its tokens add to the batch's MoE and
    collectives (weights read once for both): less than the same piece alone, never free."""
    cm = CostModel.load("h200", "glm-5")
    alone = cm.mixed_prefill_s([[(4096, 30_000)]], 0.0, 8, True)
    assert alone == cm.prefill_chunk_s(4096, 30_000, 8, True)
    mixed = cm.mixed_prefill_s([[(4096, 30_000)]], 256.0, 8, True)
    assert 0 < mixed < alone
    assert cm.mixed_prefill_s([[]] * 8, 64.0, 8, False) == 0.0
    # DP: every rank schedules its own piece; the step waits for the rank with the most prompt work
    one = cm.mixed_prefill_s([[(1024, 0)]] + [[]] * 7, 64.0, 8, False)
    two = cm.mixed_prefill_s([[(1024, 0)], [(1024, 50_000)]] + [[]] * 6, 64.0, 8, False)
    late = cm.mixed_prefill_s([[(1024, 50_000)]] + [[]] * 7, 64.0, 8, False)
    assert one < two and two >= late
    # a distributed indexer scores 1/N of the keys on each rank; draft layers over the prompt cost more
    assert cm.mixed_prefill_s([[(4096, 60_000)]], 0.0, 8, True, key_share=1 / 8) < cm.prefill_chunk_s(
        4096, 60_000, 8, True)
    assert cm.mixed_prefill_s([[(4096, 0)]], 0.0, 8, True, extra_layers=1.0) > cm.prefill_chunk_s(4096, 0, 8, True)


def test_replay_uses_the_calibration_by_default_and_none_on_request():
    import sim

    cfg = {"system": "sglang", "attention": "tp", "model": {"preset": "glm-5.2"},
           "workload": {"num_requests": 1, "max_concurrency": 1, "seed": 1, "max_steps": 3}}
    calibrated = sim.replay(cfg, None)
    bare = sim.replay(cfg, None, calibration="none")
    graphs_off = sim.replay(cfg, None, overrides=["costs.cuda_graphs=0"])
    assert calibrated["cost_model"]["calibration"] == "hw/calibration/h200.yaml"
    assert bare["cost_model"]["calibration"] is None
    # eager launches cost ~4 us per kernel more, on every layer: the batch-1 step is several ms slower
    assert graphs_off["step_ms_mean"] - calibrated["step_ms_mean"] > 2.0
