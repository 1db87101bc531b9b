"""Capacity at matched budgets: where the bytes go, and admitted concurrency ordered as capacity dictates."""
import pytest

from sim.config import build, resolve
from sim.systems import budget_for, make_system

MEAN_TOKENS = 113_000.0  # multi-lexsum mean input + output


def _system(**keys):
    sets = [f"{k.replace('__', '.')}={v}" for k, v in keys.items()]
    cfg = build(resolve({}, sets))
    return make_system(cfg, budget_for(cfg), MEAN_TOKENS), cfg


def _requests_fit(system):
    cap = system.capacity
    by_tokens = cap.logical_tokens_per_space / MEAN_TOKENS
    by_reserve = cap.reserve_capacity_per_space / max(cap.reserve_slots_per_request, 1)
    by_buffer = cap.buffer_reserve_capacity_per_space / max(cap.reserve_slots_per_request, 1)
    return min(by_tokens, by_reserve, by_buffer, cap.max_requests_per_space) * cap.num_spaces


@pytest.mark.parametrize("hw", ["h200", "b300"])
@pytest.mark.parametrize("attention", ["dp", "tp"])
@pytest.mark.parametrize("model", ["glm-5", "glm-5.2", "deepseek-v3.2"])
def test_capacity_orders_ulacache_over_hisparse_over_sglang(hw, attention, model):
    fit = {}
    for name in ("sglang", "hisparse", "ulacache"):
        s, _ = _system(system=name, attention=attention, hardware__preset=hw, model__preset=model,
                       spec__draft_tokens=4)
        fit[name] = min(round(_requests_fit(s), 6), 256)  # workload.max_concurrency caps the batch
    # both host-memory systems hold more than the GPU-resident one; under TP UlaCache stores each entry once where
    # HiSparse replicates it per rank. Under DP HiSparse's pools sized per cap (its ratio chosen so the device pool
    # holds little beyond the cap's buffers) may admit more than UlaCache's default split (which keeps GPU room for
    # the working sets): no order is claimed there
    assert min(fit["ulacache"], fit["hisparse"]) >= fit["sglang"] > 0, fit
    if attention == "tp":
        assert fit["ulacache"] >= fit["hisparse"], fit


def test_matched_budgets_and_where_the_bytes_go():
    budgets = set()
    for name in ("sglang", "hisparse", "ulacache"):
        s, cfg = _system(system=name, attention="tp")
        budgets.add((s.budget.gpu_kv_bytes_per_gpu, s.budget.cpu_kv_bytes_per_gpu))
        fp = s.footprint(1000.0, 1, [1000.0], buffer_slots=10.0)
        if name in ("sglang", "hisparse"):  # TP replicates history on every rank
            assert fp["replica_slots"] == pytest.approx(1000.0 * (cfg.num_gpus - 1))
        else:
            assert fp["replica_slots"] == 0
        assert fp["physical_slots"] == pytest.approx(fp["unique_slots"] + fp["replica_slots"] + 10.0)
    assert len(budgets) == 1


def test_ulacache_tp_pools_fit_the_gpu_budget():
    s, cfg = _system(system="ulacache", attention="tp", spec__draft_tokens=4)
    cap, kv, ix = s.capacity, s.kv_tok, s.ix_tok
    used = (cap.gpu_pool_slots + cap.local_buffer_slots) * kv + (cap.gpu_pool_slots + cap.cpu_pool_slots) * ix
    assert used <= s.budget.gpu_kv_bytes_per_gpu * 1.000001
    assert cap.cpu_pool_slots * kv <= s.budget.cpu_kv_bytes_per_gpu * 1.000001


def test_dp_attention_replicates_attention_weights():
    tp, _ = _system(attention="tp")
    dp, _ = _system(attention="dp")
    assert dp.budget.weight_bytes_per_gpu > tp.budget.weight_bytes_per_gpu
    assert dp.budget.gpu_kv_bytes_per_gpu < tp.budget.gpu_kv_bytes_per_gpu


def test_budget_that_cannot_hold_the_weights():
    with pytest.raises(ValueError, match="cannot hold the weights"):
        _system(hardware__num_gpus=4)


@pytest.mark.parametrize("cpu_gb", [4.0, 400.0])
@pytest.mark.parametrize("ratio", [None, 8])
def test_hisparse_index_keys_cover_its_logical_pool(cpu_gb, ratio):
    """SGLang's logical (host) pool and index buffer are an integer ratio x the device pool; the device pool fills
    the GPU budget with its index buffer unless the host cannot hold ratio x it (then it is smaller, as a lower
    --mem-fraction-static makes it). The ratio is the config's, or chosen for the cap."""
    keys = {} if ratio is None else {"hisparse__host_to_device_ratio": ratio}
    s, cfg = _system(system="hisparse", hardware__preset="b300", memory__cpu_kv_bytes_per_gpu=cpu_gb * 1e9, **keys)
    cap = s.capacity
    r = cap.notes["host_to_device_ratio"]
    assert r == (ratio or r) and isinstance(r, int) and r >= 1
    assert cap.static_index_slots_per_rank == pytest.approx(cap.logical_tokens_per_space)
    assert cap.logical_tokens_per_space == pytest.approx(r * cap.notes["device_tokens_per_rank"])
    host = cpu_gb * 1e9 / s.kv_tok
    assert cap.logical_tokens_per_space <= host * (1 + 1e-9)
    used = cap.notes["device_tokens_per_rank"] * s.kv_tok + cap.static_index_slots_per_rank * s.ix_tok
    assert used <= s.budget.gpu_kv_bytes_per_gpu * (1 + 1e-9)
    if cap.logical_tokens_per_space < host * (1 - 1e-9):  # the host does not bind: the GPU budget is used exactly
        assert used == pytest.approx(s.budget.gpu_kv_bytes_per_gpu, rel=1e-9)


@pytest.mark.parametrize("hw", ["h200", "b300"])
@pytest.mark.parametrize("attention", ["dp", "tp"])
@pytest.mark.parametrize("draft", [0, 4])
def test_ulacache_admits_on_unique_slots_and_fits_both_budgets(hw, attention, draft):
    """No per-request reserve: admission is bounded by m (G + C) alone; the split fits the GPU and CPU budgets."""
    s, cfg = _system(system="ulacache", attention=attention, hardware__preset=hw, spec__draft_tokens=draft,
                     model__preset="glm-5")
    cap, kv, ix = s.capacity, s.kv_tok, s.ix_tok
    assert cap.reserve_slots_per_request == 0 and s.reserve_slots(100_000.0) == 0
    assert cap.reserve_capacity_per_space == float("inf") == cap.buffer_reserve_capacity_per_space
    assert cap.logical_tokens_per_space == pytest.approx(cap.ranks_per_space * (cap.gpu_pool_slots
                                                                                 + cap.cpu_pool_slots), abs=16)
    used = (cap.gpu_pool_slots + cap.local_buffer_slots) * kv + (cap.gpu_pool_slots + cap.cpu_pool_slots) * ix
    assert used <= s.budget.gpu_kv_bytes_per_gpu * 1.000001
    assert cap.cpu_pool_slots * kv <= s.budget.cpu_kv_bytes_per_gpu * 1.000001
    assert (cap.local_buffer_slots > 0) == (attention == "tp")


def test_default_buffer_and_pool_hold_the_no_split_working_set():
    """TP default rule: at n* = min(no-split concurrency, cap) requests the buffer holds the remote working set and
    the pool at least the home one (each with its spread margin); the CPU pool takes what the GPU leaves."""
    cfg = build(resolve({}, ["attention=tp", "model.preset=glm-5", "spec.draft_tokens=4"]))
    s = make_system(cfg, budget_for(cfg), MEAN_TOKENS, union_slots_per_request=3300.0)
    cap, m = s.capacity, cfg.num_gpus
    n = cap.notes["target_requests_per_space"]
    assert n == pytest.approx(min(s.no_split_concurrency(), 256))
    assert cap.local_buffer_slots == int(s.with_spread(n * 3300.0 * (m - 1) / m))
    assert cap.gpu_pool_slots >= int(s.with_spread(n * 3300.0 / m))
    assert s.gpu_bytes_at(n) <= s.budget.gpu_kv_bytes_per_gpu * 1.000001
    bound = make_system(cfg, budget_for(cfg), MEAN_TOKENS)  # unmeasured: the q x top_k bound, a larger buffer
    assert bound.union_slots == 4 * cfg.model.top_k
    assert bound.capacity.local_buffer_slots > cap.local_buffer_slots


def test_local_buffer_fraction_trades_buffer_for_admission():
    """An explicit share of the GPU KV budget for the buffer: a smaller one leaves room for more logical slots."""
    caps = {}
    for frac in (0.05, 0.3):
        s, cfg = _system(system="ulacache", attention="tp", model__preset="glm-5", spec__draft_tokens=4,
                         ulacache__local_buffer_fraction=frac, workload__max_concurrency=1024)
        caps[frac] = s.capacity
        assert s.capacity.local_buffer_slots == int(frac * s.budget.gpu_kv_bytes_per_gpu / s.kv_tok)
    assert caps[0.05].logical_tokens_per_space > caps[0.3].logical_tokens_per_space


def test_union_measured_on_the_workload_selections():
    import numpy as np

    import traces
    from sim.systems import measure_union_slots
    from traces.errors import TraceError

    prof = traces.load_profile("multi-lexsum")
    requests = traces.generate_requests(prof, 8, 11)
    spec = {**prof.selections, "num_groups": 78, "top_k": 2048}
    source = traces.SyntheticSelections(traces.SelectionSpec.from_dict(spec, "test"), seed=11)
    one = build(resolve({}, ["model.preset=glm-5"]))
    four = build(resolve({}, ["model.preset=glm-5", "spec.draft_tokens=4"]))
    assert measure_union_slots(source, requests, one) == 2048.0
    u = measure_union_slots(source, requests, four)
    assert 2048 < u < 4 * 2048  # verify tokens share part of their selections

    class Missing:
        def select(self, *args):
            raise TraceError("no captured selections")

    assert measure_union_slots(Missing(), requests, four) is None
    assert np.isfinite(u)


def test_overflowing_batches_run_in_costed_passes(profile, monkeypatch):
    """A GPU pool smaller than a step's working set: the policy serves the batch in sub-batches and each pass is
    timed (the same run with every pass folded into one is faster; the policy's outcomes are the same)."""
    import sim
    import sim.policy

    cfg = {"system": "ulacache", "attention": "dp", "model": {"preset": "glm-5", "weight_bytes": 100e9},
           "hardware": {"preset": "h200", "num_gpus": 2}, "ulacache": {"gpu_pool_slots": 2500},
           "workload": {"profile": profile, "num_requests": 5, "max_concurrency": 5, "seed": 3},
           "memory": {"gpu_kv_bytes_per_gpu": 0.6e9, "cpu_kv_bytes_per_gpu": 20e9},
           "fidelity": {"policy_groups": 2, "pilot_steps": 0, "request_fraction": 1.0}}
    split = sim.replay(cfg)
    assert split["policy_batch_splits"] > 0
    ratios = sim.policy.PolicyRunner._ratios
    monkeypatch.setattr(sim.policy.PolicyRunner, "_ratios", lambda self, t, r: {**ratios(self, t, r), "passes": 1.0})
    folded = sim.replay(cfg)
    assert folded["gpu_hit_rate"] == split["gpu_hit_rate"] and folded["decode_steps"] == split["decode_steps"]
    assert split["decode_time_s"] > folded["decode_time_s"]



@pytest.mark.parametrize("hw", ["h200", "b300"])
@pytest.mark.parametrize("draft", [0, 4])
@pytest.mark.parametrize("longest", [60_001, 131_077])
def test_tp_batch1_default_pools_hold_the_longest_request_to_its_end(hw, draft, longest):
    """Default sizing at cap 1 under TP cuts the pools to what the cap can use; that must count the request's last
    verify tokens and the per-rank rounding of TP homes (a rank holds at most ceil(S / m) + 1 of S entries).
    Before: the pools held max_tokens / m per rank and the last decode steps raised CapacityError."""
    s, cfg = _system(system="ulacache", attention="tp", hardware__preset=hw, model__preset="glm-5",
                     cpu_storage="true", spec__draft_tokens=draft, workload__max_concurrency=1)
    s = make_system(cfg, budget_for(cfg), MEAN_TOKENS, s.union_slots, longest)
    cap, m = s.capacity, s.capacity.ranks_per_space
    need = s.need_slots(longest - 100, 100)
    assert cap.logical_tokens_per_space >= need
    assert cap.gpu_pool_slots + cap.cpu_pool_slots >= -(-need // m) + 1
