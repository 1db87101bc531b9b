"""A simulated decode step equals the hand computation of docs/cost-model.md's "Cost ledger" (issue 26 item 2).

Each test runs a small replay (glm-5.2, 8 x H200, one request), takes steps from its timeline, and recomputes their
time from the ledger's formulas with the run's cost values and the model preset's fields, written out here by hand
(no `CostModel` function is called for the expected value). HiSparse runs one simulated indexer group for all
groups (`policy_groups: 1`), so every layer of a step has the same missed rows: the step's H2D rows / layers.
"""
import math

import pandas as pd
import pytest

import sim
from sim.costs import CostModel
from sim.presets import HARDWARE_PRESETS, MODEL_PRESETS

M = MODEL_PRESETS["glm-5.2"]
HW = HARDWARE_PRESETS["h200"]
N = 8  # GPUs
GROUPS = [4] * 15 + [3] * 6  # GLM-5.2 IndexShare: 21 indexer groups of consecutive layers (78 layers)


def _replay(tmp_path, system: str, draft: int, attention: str = "dp", costs: dict | None = None):
    """(timeline, cost values) of a 5-step replay of one request; `costs`: the config's `costs:` section."""
    cfg = {"system": system, "attention": attention, "model": {"preset": "glm-5.2"}, "spec": {"draft_tokens": draft},
           "workload": {"num_requests": 1, "max_concurrency": 1, "seed": 11, "max_steps": 5},
           "fidelity": {"policy_groups": 1, "pilot_steps": 0, "request_fraction": 1.0}, "costs": costs or {}}
    sim.replay(cfg, tmp_path)
    return pd.read_parquet(tmp_path / "timeline.parquet"), CostModel.load("h200", "glm-5.2", overrides=costs).values


class Ledger:
    """The ledger's formulas on raw cost values `v` (docs/cost-model.md "Cost ledger": one line per term)."""

    def __init__(self, v: dict):
        self.v = v

    def kernels(self, n: float) -> float:  # graph_kernel_s per kernel inside the step's CUDA graph
        return n * self.v["graph_kernel_s"]

    def roof(self, flops: float, hbm: float, fp8: bool) -> float:
        peak = HW.fp8_flops if fp8 else HW.bf16_flops
        return max(flops / (peak * self.v["flops_efficiency"]), hbm / (HW.hbm_bw_bytes_s * self.v["hbm_efficiency"]))

    def indexer(self, keys: float, q: int) -> float:
        flops = 2.0 * keys * q * M.index_heads * M.index_head_dim
        return self.kernels(self.v["indexer_kernels"]) + self.roof(
            flops, keys * M.index_bytes_per_token_layer + keys * q * self.v["indexer_score_bytes"], True)

    def attention(self, qtok: float, reads: float, heads: float) -> float:
        flops = qtok * M.top_k * heads * 2.0 * (M.kv_lora_rank + M.rope_dim + M.kv_lora_rank)
        return self.kernels(self.v["attn_kernels_per_layer"]) + self.roof(flops, reads * M.kv_bytes_per_token_layer,
                                                                          False)

    def ffn(self, tokens: float, replicated: bool) -> float:
        moe = (M.weight_bytes - M.attn_weight_bytes) / M.num_layers / N
        routed = moe * M.routed_weight_fraction
        touched = 1.0 - (1.0 - M.experts_per_token / M.num_experts) ** tokens
        attn = M.attn_weight_bytes / M.num_layers / (1 if replicated else N)
        flops = 2.0 * M.active_params / M.num_layers * tokens / N
        return self.kernels(self.v["moe_kernels_per_layer"]) + self.roof(flops, routed * touched + moe - routed + attn,
                                                                         True)

    def collectives(self, tokens_per_gpu: float, tp: bool) -> float:
        lat, bw = self.v["collective_latency_s"], self.v["nvlink_bw_bytes_s"]
        t = lat + (N - 1) / N * tokens_per_gpu * M.experts_per_token * M.hidden_size * 3.0 / bw
        if tp:
            t += lat + 2.0 * (N - 1) / N * tokens_per_gpu * N * M.hidden_size * 2.0 / bw
        return t

    def epilogue(self, q: int, n: int, heads: float, tp: bool) -> float:
        """step_overhead_s + one graph launch per graph (3 with MTP) + the draft passes."""
        over = self.v["step_overhead_s"] + (3 if q > 1 else 1) * self.v["graph_launch_s"]
        draft = 0.0
        if q > 1:
            draft = (q - 1) * self.v["draft_layer_equiv"] * (
                self.attention(n, n * M.top_k, heads) + self.ffn(n, not tp) + self.collectives(n / N, tp))
        return over + draft

    @staticmethod
    def at_batch_1(table: dict) -> float:
        """A per-batch efficiency table at batch 1 (its smallest batch; the tables start at 1)."""
        assert min(float(k) for k in table) == 1.0, "the hand computation covers batch 1 only"
        return float(table[min(table, key=float)])

    def swapin_eff(self, mtp: bool) -> float:
        table = (self.v["hisparse_mtp_swapin_efficiency_by_batch"] if mtp else {}) or \
            self.v["hisparse_swapin_efficiency_by_batch"]
        return self.at_batch_1(table)

    def link_eff(self) -> float:
        return float(self.v["h2d_row_efficiency_by_bytes"][M.kv_bytes_per_token_layer])

    def swapin(self, refs: float, rows: float, mtp: bool) -> tuple[float, float]:
        """(swap-in time on the compute stream, its rows' time on the PCIe link) of one layer, batch 1."""
        v, row, bw = self.v, M.kv_bytes_per_token_layer, self.v["pcie_h2d_bw_bytes_s"]
        fixed = (v["hisparse_mtp_swapin_fixed_s"] if mtp else None) or v["hisparse_swapin_fixed_s"]
        per_ref = (v["hisparse_mtp_per_ref_s"] if mtp else None) or v["hisparse_per_ref_s"]
        eff = self.swapin_eff(mtp)
        link = rows * row / max(eff, self.link_eff()) / bw  # what the link carries
        excess = max(0.0, rows * row / (bw * eff) - link)  # its one block's rate limit beyond that
        return max(fixed, self.kernels(2 if mtp else 1)) + per_ref * refs + excess, link


    def replay(self, rows: float) -> float:
        """One skip layer's replay of the anchor's copies on the side stream (batch 1): its fixed time + the rows at
        its efficiency (unmeasured: no fixed time, the exchange kernel's efficiency)."""
        table = self.v["hisparse_planned_copy_efficiency_by_batch"]
        eff = self.at_batch_1(table) if table else self.link_eff()
        return (self.v["hisparse_planned_copy_fixed_s"] or 0.0) + rows * M.kv_bytes_per_token_layer / eff / \
            self.v["pcie_h2d_bw_bytes_s"]


def _steps(tl: pd.DataFrame):
    return tl[tl["step"] >= 1].itertuples()  # from step 1 on (step 0 has no decode backup yet)


def test_sglang_dp_step_with_drafts_is_the_ledger_sum(tmp_path):
    """GPU-resident SGLang, DP attention, 4 verify tokens: per group the indexer, per layer attention + MoE +
    all-to-all, then overhead and drafts; the other 7 ranks (no request) only run MoE and collectives."""
    tl, v = _replay(tmp_path, "sglang", 4)
    led, q = Ledger(v), 4
    for s in _steps(tl):
        h = s.history_tokens
        refs = q * min(h, M.top_k)
        layer = led.attention(q, refs, M.num_heads) + led.ffn(q, True) + led.collectives(q / N, False)
        want = len(GROUPS) * led.indexer(h, q) + M.num_layers * layer + led.epilogue(q, 1, M.num_heads, False)
        assert s.step_s == pytest.approx(want, rel=1e-9), s.step


def test_sglang_tp_step_is_the_ledger_sum(tmp_path):
    """TP attention: every rank indexes all keys and reads every selected row for its 8 heads; + the all-reduce."""
    tl, v = _replay(tmp_path, "sglang", 0, "tp")
    led = Ledger(v)
    for s in _steps(tl):
        h = s.history_tokens
        layer = led.attention(1, min(h, M.top_k), M.num_heads / N) + led.ffn(1, False) + led.collectives(1 / N, True)
        want = len(GROUPS) * led.indexer(h, 1) + M.num_layers * layer + led.epilogue(1, 1, M.num_heads / N, True)
        assert s.step_s == pytest.approx(want, rel=1e-9), s.step


def test_hisparse_mtp_step_is_the_ledger_sum(tmp_path):
    """HiSparse with 4 verify tokens (SGLang's MTP path): every layer runs one swap-in launch pair for all verify
    tokens, then its copies on PCIe (no copy-call latency: the kernel reads host memory itself), then its compute,
    in series; the decode backup (D2H) runs on a side stream."""
    tl, v = _replay(tmp_path, "hisparse", 4)
    led, q = Ledger(v), 4
    for s in _steps(tl):
        h, rows = s.history_tokens, s.h2d_rows / M.num_layers
        assert rows > 0
        refs = q * min(h, M.top_k)
        mgmt, link = led.swapin(refs, rows, mtp=True)
        layer = led.attention(q, refs, M.num_heads) + led.ffn(q, True) + led.collectives(q / N, False)
        want = (len(GROUPS) * led.indexer(h, q) + M.num_layers * (mgmt + link + layer)
                + led.epilogue(q, 1, M.num_heads, False))
        assert s.step_s == pytest.approx(want, rel=1e-9), s.step
        assert s.mgmt_s == pytest.approx(M.num_layers * mgmt, rel=1e-9)


@pytest.mark.parametrize("replay", [{}, {"hisparse_planned_copy_fixed_s": 3e-5,
                                         "hisparse_planned_copy_efficiency_by_batch": {1: 0.05, 64: 0.8}}])
def test_hisparse_indexshare_step_is_the_ledger_sum(tmp_path, replay):
    """HiSparse without drafts: per group the anchor layer's swap-in kernel, its copies, then layer 1 while the skip
    layers' replays of its copies run back to back on the side stream; layer L waits for the last of them. Replay
    costs as committed (unmeasured) and as a slow replay kernel would have them."""
    tl, v = _replay(tmp_path, "hisparse", 0, costs=replay)
    led = Ledger(v)
    for s in _steps(tl):
        h, rows = s.history_tokens, s.h2d_rows / M.num_layers
        assert rows > 0
        mgmt, x = led.swapin(min(h, M.top_k), rows, mtp=False)
        y = led.replay(rows)
        c = led.attention(1, min(h, M.top_k), M.num_heads) + led.ffn(1, True) + led.collectives(1 / N, False)
        per_group = [led.indexer(h, 1) + mgmt + x + c + max((n - 2) * c, (n - 1) * y - c, 0.0) + c for n in GROUPS]
        want = math.fsum(per_group) + led.epilogue(1, 1, M.num_heads, False)
        assert s.step_s == pytest.approx(want, rel=1e-9), s.step
        assert s.mgmt_s == pytest.approx(len(GROUPS) * mgmt, rel=1e-9)
