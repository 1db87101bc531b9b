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
    assert fit["ulacache"] >= fit["hisparse"] >= fit["sglang"] > 0, fit


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
def test_hisparse_index_keys_cover_its_logical_pool(cpu_gb):
    """SGLang's index buffer is device x ratio; where the host pool caps the logical pool below that, the keys cover
    only the host pool and the GPU bytes left over go to the device pool; the GPU budget is used exactly."""
    s, cfg = _system(system="hisparse", hardware__preset="b300", memory__cpu_kv_bytes_per_gpu=cpu_gb * 1e9)
    cap = s.capacity
    assert cap.static_index_slots_per_rank == pytest.approx(cap.logical_tokens_per_space)
    assert cap.logical_tokens_per_space <= cfg.hisparse["host_to_device_ratio"] * cap.gpu_pool_slots + 1
    assert cap.logical_tokens_per_space <= cpu_gb * 1e9 / s.kv_tok * (1 + 1e-9)
    used = cap.gpu_pool_slots * s.kv_tok + cap.static_index_slots_per_rank * s.ix_tok
    assert used == pytest.approx(s.budget.gpu_kv_bytes_per_gpu, rel=1e-4)
