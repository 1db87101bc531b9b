"""HiSparse as SGLang runs it (issue 26): the swap-in's copies pay no copy-call latency, one MTP launch pair per
layer under speculative decoding, the IndexShare side-stream replay without it, pools sized per concurrency cap."""
import pytest

from sim.config import build, resolve
from sim.costs import CostModel
from sim.events import TraceRecorder
from sim.hardware import Node, make_env
from sim.hisparse_costs import HiSparseCosts
from sim.systems import budget_for, make_system
from sim.timing import GroupWork, StepTimer

MEAN, LONGEST = 113_000.0, 140_000.0


def _system(*sets):
    cfg = build(resolve({}, ["system=hisparse", *sets]))
    return make_system(cfg, budget_for(cfg), MEAN, None, LONGEST)


def _group_s(costs, work: GroupWork, traced: bool) -> float:
    """One group on one rank: by the timer's computed path, or (traced) every rank on simpy."""
    env = make_env()
    rec = TraceRecorder()
    rec.enabled = traced
    t, _ = StepTimer(env, Node(env, 1, costs), rec).run([[work]], [0], {})
    return t


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("prefetch", [False, True])
def test_a_kernel_reading_host_memory_pays_no_copy_call_latency(traced, prefetch):
    costs = CostModel.load("h200", "glm-5.2")
    base = dict(layers=3, indexer_s=1e-5, allgather_s=0.0, mgmt_s=6e-5, h2d_bytes=2e6, d2h_bytes=1e4, peer_bytes=0.0,
                attention_s=2e-5, ffn_s=5e-5, collective_s=1e-5, prefetch=prefetch, d2h_blocking=False)
    copy_call = _group_s(costs, GroupWork(**base), traced)
    zero_copy = _group_s(costs, GroupWork(**base, h2d_pays_latency=False), traced)
    assert copy_call - zero_copy == pytest.approx(costs["pcie_latency_s"], rel=1e-9)
    assert _group_s(costs, GroupWork(**base, h2d_pays_latency=False), not traced) == pytest.approx(zero_copy,
                                                                                                   rel=1e-12)


def test_mtp_path_is_one_launch_pair_per_layer_and_indexshare_replay_only_without_drafts():
    costs = CostModel.load("h200", "glm-5.2")
    plain, spec, long_chain = _system(), _system("spec.draft_tokens=4"), _system("spec.draft_tokens=6")
    assert (plain.mtp, plain.prefetch) == (False, True)  # anchor plans, skip layers replay on the side stream
    assert (spec.mtp, spec.prefetch) == (True, False)  # SGLang turns the replay off under spec
    assert not long_chain.mtp  # 6 verify tokens: past the MTP kernel's 2-4 steps
    for s in (plain, spec, long_chain):
        assert s.h2d_pays_latency is False and s.d2h_blocking is False
    refs = 4 * 2048
    one_pair = spec.management_s(costs, refs, 0, 0, 1)
    assert one_pair == pytest.approx(HiSparseCosts(costs).management_s(refs, 1, mtp=True))
    chunks = -(-6 // long_chain.query_chunk())
    assert long_chain.management_s(costs, 6 * 2048, 0, 0, 1) == pytest.approx(
        HiSparseCosts(costs).management_s(6 * 2048, chunks))
    # the MTP pair's excess is read from the MTP gather's table where measured (else the non-MTP kernel's)
    rows = 1000.0
    mtp_excess = HiSparseCosts(costs).swapin_excess_s(rows, 656, 1, mtp=True)
    assert spec.management_s(costs, refs, 0, rows, 1) == pytest.approx(one_pair + mtp_excess)


def test_mtp_keys_fall_back_to_the_non_mtp_kernel_until_measured():
    bare = CostModel.load("h200", "glm-5.2", overrides={"hisparse_mtp_swapin_fixed_s": None,
                                                        "hisparse_mtp_per_ref_s": None,
                                                        "hisparse_mtp_swapin_efficiency_by_batch": {}})
    assert HiSparseCosts(bare).management_s(100, mtp=True) == pytest.approx(
        max(bare["hisparse_swapin_fixed_s"], bare.kernel_overhead_s(2)) + 100 * bare["hisparse_per_ref_s"])
    assert HiSparseCosts(bare).swapin_efficiency(1, mtp=True) == HiSparseCosts(bare).swapin_efficiency(1)
    fit = CostModel.load("h200", "glm-5.2", overrides={"hisparse_mtp_swapin_fixed_s": 2e-5,
                                                       "hisparse_mtp_per_ref_s": 1e-11,
                                                       "hisparse_mtp_swapin_efficiency_by_batch": {1: 0.7, 64: 0.9}})
    assert HiSparseCosts(fit).management_s(100, mtp=True) == pytest.approx(2e-5 + 100 * 1e-11)
    assert HiSparseCosts(fit).swapin_efficiency(1, mtp=True) == pytest.approx(0.7)
    # the non-MTP table untouched
    assert HiSparseCosts(fit).swapin_efficiency(1) == HiSparseCosts(bare).swapin_efficiency(1)


@pytest.mark.parametrize("hw", ["h200", "b300"])
@pytest.mark.parametrize("attention", ["dp", "tp"])
@pytest.mark.parametrize("draft", [0, 4])
def test_pools_are_resized_per_cap_as_sglang_would_size_them(hw, attention, draft):
    """Per cap: an integer ratio; the device pool holds the cap's buffers where it can; the logical pool reaches what
    the cap's requests can use or the most admitted; never more host pool than the CPU budget, never more GPU bytes
    than the GPU budget; a larger cap never admits fewer."""
    fits = []
    for cap in (1, 16, 64, 256, 512):
        s = _system(f"hardware.preset={hw}", f"attention={attention}", f"spec.draft_tokens={draft}",
                    f"workload.max_concurrency={cap}")
        c, per = s.capacity, s.device_slots_per_request()
        r, device, logical = c.notes["host_to_device_ratio"], c.notes["device_tokens_per_rank"], c.logical_tokens_per_space
        running = c.notes["max_running_requests_per_space"]
        assert isinstance(r, int) and logical == pytest.approx(r * device)
        assert device * s.kv_tok + logical * s.ix_tok <= s.budget.gpu_kv_bytes_per_gpu * (1 + 1e-9)
        assert logical * s.kv_tok <= s.budget.cpu_kv_bytes_per_gpu * (1 + 1e-9)
        enough = logical >= running * (LONGEST + s.q) and device >= running * per
        if r > 1:  # a smaller ratio would not have served the cap as well
            d1, l1 = s.pools_at(r - 1)
            assert not (l1 >= running * (LONGEST + s.q) and d1 >= running * per)
        fits.append(min(logical / MEAN, device / per, running) * c.num_spaces if not enough else running * c.num_spaces)
        assert per == 4096 + 64 + (128 if draft else 0)  # buffer + page (+ MTP staging ring at 4 verify tokens)
    assert fits == sorted(fits)


def test_an_explicit_ratio_is_sglangs_fixed_sizing():
    s = _system("hisparse.host_to_device_ratio=8", "attention=tp")
    kv, ix = s.kv_tok, s.ix_tok
    device = min(s.budget.gpu_kv_bytes_per_gpu / (kv + 8 * ix), s.budget.cpu_kv_bytes_per_gpu / kv / 8)
    assert s.capacity.notes["host_to_device_ratio"] == 8
    assert s.capacity.reserve_capacity_per_space == pytest.approx(device)
    assert s.capacity.logical_tokens_per_space == pytest.approx(8 * device)


def test_indexshare_replay_costs_its_own_kernel_where_measured():
    """The skip layers' replay (SGLang's copy_cache_planned) has its own fixed time and efficiency when `hw` measured
    them; unmeasured, its rows move at the exchange's efficiency; under drafts there is no replay."""
    bare = CostModel.load("h200", "glm-5.2")
    if not bare["hisparse_planned_copy_efficiency_by_batch"] and not bare["hisparse_planned_copy_fixed_s"]:
        assert HiSparseCosts(bare).replay_link_bytes(1000, 656, 4) == pytest.approx(bare.h2d_link_bytes(1000, 656))
    fit = CostModel.load("h200", "glm-5.2", overrides={"hisparse_planned_copy_fixed_s": 5e-6,
                                                       "hisparse_planned_copy_efficiency_by_batch": {1: 0.2, 16: 0.8}})
    bw = fit["pcie_h2d_bw_bytes_s"]
    assert HiSparseCosts(fit).replay_link_bytes(1000, 656, 4) / bw == pytest.approx(5e-6 + 1000 * 656 / (0.5 * bw))
    assert HiSparseCosts(fit).replay_link_bytes(0, 656, 4) == 0.0
    plain, spec = _system(), _system("spec.draft_tokens=4")
    assert plain.h2d_replay_link_bytes(fit, 1000, 656, 4) == HiSparseCosts(fit).replay_link_bytes(1000, 656, 4)
    assert spec.h2d_replay_link_bytes(fit, 1000, 656, 4) is None
    ula = make_system(build(resolve({}, ["system=ulacache"])), budget_for(build(resolve({}, ["system=ulacache"]))),
                      MEAN)
    assert ula.h2d_replay_link_bytes(fit, 1000, 656, 4) is None  # its prefetched layers use its exchange kernel
