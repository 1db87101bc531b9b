"""The simulator's cost model: pure per-piece cost functions shared with `hw validate`.

`CostModel.load(hardware, model, calibration)` merges (lowest to highest precedence) the preset roofline figures,
`sim/costs.yaml`, a config's `costs:` section and a calibration file (`provenance:` + `costs:`). Unknown keys are
rejected. Link functions come in two forms: `*_link_bytes` is the occupancy a transfer puts on a link of raw
bandwidth (the simpy link shares that bandwidth fairly among concurrent transfers), `*_s` is the time of the
transfer alone on its link (latency + occupancy / bandwidth) -- the same formula, for predictions.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import yaml

from sim.presets import HARDWARE_PRESETS, MODEL_PRESETS, HardwareSpec, ModelSpec

DEFAULTS_PATH = Path(__file__).with_name("costs.yaml")
_TABLE_KEYS = ("h2d_row_efficiency_by_bytes", "d2h_row_efficiency_by_bytes", "peer_row_efficiency_by_bytes")


def _defaults() -> dict:
    data = yaml.safe_load(DEFAULTS_PATH.read_text())
    assert isinstance(data, dict)
    return data


def _merge_costs(base: dict, extra: dict, where: str) -> dict:
    if not isinstance(extra, dict):
        raise ValueError(f"{where}: costs must be a mapping")
    out = dict(base)
    for key, value in extra.items():
        if key not in base:
            raise ValueError(f"{where}: unknown cost key {key!r}")
        if key in _TABLE_KEYS:
            if not isinstance(value, dict) or not all(
                    isinstance(k, (int, float)) and isinstance(v, (int, float)) and 0 < v <= 1
                    for k, v in value.items()):
                raise ValueError(f"{where}: cost key {key} must map row bytes to an efficiency in (0, 1]")
        elif value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"{where}: cost key {key} must be a non-negative number, got {value!r}")
        out[key] = value
    return out


def read_calibration(path: Path) -> dict:
    """The `costs:` of a calibration file (top-level keys: provenance, costs; anything else is an error)."""
    path = Path(path)
    if not path.is_file():
        raise OSError(f"calibration file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise ValueError(f"{path}: calibration is not valid YAML") from None
    if not isinstance(data, dict) or "costs" not in data:
        raise ValueError(f"{path}: a calibration file needs a top-level 'costs:' mapping")
    extra = set(data) - {"provenance", "costs"}
    if extra:
        raise ValueError(f"{path}: unknown calibration key {sorted(extra)[0]!r} (expected provenance, costs)")
    return data["costs"] or {}


@dataclasses.dataclass(frozen=True)
class CostModel:
    hardware: HardwareSpec
    model: ModelSpec
    values: dict  # resolved cost keys (no nulls left except empty tables)
    provenance: dict

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, hardware: HardwareSpec | str, model: ModelSpec | str, calibration: Path | None = None,
             overrides: dict | None = None) -> "CostModel":
        hw = HARDWARE_PRESETS[hardware] if isinstance(hardware, str) else hardware
        md = MODEL_PRESETS[model] if isinstance(model, str) else model
        values = _defaults()
        values = _merge_costs(values, overrides or {}, "config costs")
        provenance = {"defaults": str(DEFAULTS_PATH.name)}
        if calibration is not None:
            values = _merge_costs(values, read_calibration(Path(calibration)), str(calibration))
            provenance["calibration"] = str(calibration)
        fill = {
            "launch_s": hw.kernel_launch_s, "pcie_h2d_bw_bytes_s": hw.pcie_bw_bytes_s,
            "pcie_d2h_bw_bytes_s": hw.pcie_bw_bytes_s, "pcie_latency_s": hw.pcie_latency_s,
            "nvlink_bw_bytes_s": hw.nvlink_bw_bytes_s, "nvlink_latency_s": hw.nvlink_latency_s,
        }
        for key, value in fill.items():
            if values.get(key) is None:
                values[key] = value
        for key, value in values.items():
            if value is None:
                raise ValueError(f"cost key {key} has no value")
        for key in ("hbm_efficiency", "flops_efficiency", "h2d_row_efficiency", "d2h_row_efficiency",
                    "peer_row_efficiency"):
            if not 0 < values[key] <= 1:
                raise ValueError(f"cost key {key} must be in (0, 1], got {values[key]}")
        for key in ("pcie_h2d_bw_bytes_s", "pcie_d2h_bw_bytes_s", "nvlink_bw_bytes_s"):
            if values[key] <= 0:
                raise ValueError(f"cost key {key} must be positive")
        return cls(hw, md, values, provenance)

    def __getitem__(self, key: str):
        return self.values[key]

    # ------------------------------------------------------------------ primitives
    def launch_s(self, num_kernels: float = 1) -> float:
        return self.values["launch_s"] * num_kernels

    def roofline_s(self, flops: float, hbm_bytes: float, fp8: bool = True) -> float:
        """Time of a kernel bounded by compute or HBM bandwidth, at the model's efficiencies."""
        peak = self.hardware.fp8_flops if fp8 else self.hardware.bf16_flops
        return max(flops / (peak * self.values["flops_efficiency"]),
                   hbm_bytes / (self.hardware.hbm_bw_bytes_s * self.values["hbm_efficiency"]))

    def _efficiency(self, kind: str, row_bytes: float) -> float:
        table = self.values.get(f"{kind}_row_efficiency_by_bytes") or {}
        if table:
            xs = np.array(sorted(float(k) for k in table))
            ys = np.array([float(table[k]) for k in sorted(table, key=float)])
            return float(np.interp(row_bytes, xs, ys))
        return float(self.values[f"{kind}_row_efficiency"])

    # ------------------------------------------------------------------ links
    def h2d_link_bytes(self, num_rows: float, row_bytes: float) -> float:
        return num_rows * row_bytes / self._efficiency("h2d", row_bytes)

    def d2h_link_bytes(self, num_rows: float, row_bytes: float) -> float:
        return num_rows * row_bytes / self._efficiency("d2h", row_bytes)

    def peer_link_bytes(self, num_rows: float, row_bytes: float) -> float:
        return num_rows * row_bytes / self._efficiency("peer", row_bytes)

    def h2d_s(self, num_rows: float, row_bytes: float) -> float:
        """Scattered rows pinned host -> GPU, alone on the link (0 rows: no transfer)."""
        if num_rows <= 0:
            return 0.0
        v = self.values
        return v["pcie_latency_s"] + self.h2d_link_bytes(num_rows, row_bytes) / v["pcie_h2d_bw_bytes_s"]

    def d2h_s(self, num_rows: float, row_bytes: float) -> float:
        if num_rows <= 0:
            return 0.0
        v = self.values
        return v["pcie_latency_s"] + self.d2h_link_bytes(num_rows, row_bytes) / v["pcie_d2h_bw_bytes_s"]

    def peer_s(self, num_rows: float, row_bytes: float) -> float:
        """Scattered rows gathered from peer GPUs over this GPU's NVLink ingress."""
        if num_rows <= 0:
            return 0.0
        v = self.values
        return v["nvlink_latency_s"] + self.peer_link_bytes(num_rows, row_bytes) / v["nvlink_bw_bytes_s"]

    def exchange_s(self, h2d_rows: float, d2h_rows: float, row_bytes: float) -> float:
        """A swap batch: both PCIe directions run concurrently; done when the slower one is."""
        return max(self.h2d_s(h2d_rows, row_bytes), self.d2h_s(d2h_rows, row_bytes))

    # ------------------------------------------------------------------ cache management
    def management_s(self, num_refs: float, num_unique: float, num_misses: float) -> float:
        """One access batch of the pb-lru/lru policy (dedup .. replacement) on one GPU."""
        v = self.values
        if num_refs <= 0:
            return 0.0
        return (self.launch_s(v["mgmt_kernels"]) + v["mgmt_per_ref_s"] * num_refs
                + v["mgmt_per_unique_s"] * num_unique + v["mgmt_per_miss_s"] * num_misses)

    def hisparse_management_s(self, num_refs: float, num_misses: float) -> float:
        """HiSparse's per-layer swap-in kernel: hash the top-k, mark hits, assign LRU slots to misses."""
        v = self.values
        if num_refs <= 0:
            return 0.0
        return self.launch_s(1) + v["hisparse_per_ref_s"] * num_refs + v["mgmt_per_miss_s"] * num_misses

    # ------------------------------------------------------------------ model compute (one GPU, one layer)
    def indexer_s(self, num_keys: float, num_query_keys: float) -> float:
        """Score `num_keys` stored index keys (read once) for `num_query_keys` (key, query) pairs, then top-k."""
        m = self.model
        flops = 2.0 * num_query_keys * m.index_heads * m.index_head_dim
        hbm = num_keys * m.index_bytes_per_token_layer + num_query_keys * self.values["indexer_score_bytes"]
        return self.launch_s(self.values["indexer_kernels"]) + self.roofline_s(flops, hbm, fp8=True)

    def attention_s(self, num_query_tokens: float, num_kv_reads: float, heads: float) -> float:
        """Sparse MLA decode attention: each query token reads its top-k latent rows for `heads` heads."""
        m = self.model
        per_pair = 2.0 * (m.kv_lora_rank + m.rope_dim + m.kv_lora_rank)
        flops = num_query_tokens * m.top_k * heads * per_pair
        hbm = num_kv_reads * m.kv_bytes_per_token_layer
        return self.launch_s(self.values["attn_kernels_per_layer"]) + self.roofline_s(flops, hbm, fp8=False)

    def ffn_s(self, num_tokens: float, num_gpus: int, attn_replicated: bool) -> float:
        """MoE/FFN + projections of one layer on one GPU: weights read (touched experts) vs 2 x active FLOPs."""
        m = self.model
        if num_tokens <= 0:
            return 0.0
        moe_bytes = (m.weight_bytes - m.attn_weight_bytes) / m.num_layers / num_gpus
        routed = moe_bytes * m.routed_weight_fraction
        touched = 1.0 - (1.0 - m.experts_per_token / m.num_experts) ** num_tokens
        attn_bytes = m.attn_weight_bytes / m.num_layers / (1 if attn_replicated else num_gpus)
        hbm = routed * touched + (moe_bytes - routed) + attn_bytes
        flops = 2.0 * m.active_params / m.num_layers * num_tokens / num_gpus
        return self.launch_s(self.values["moe_kernels_per_layer"]) + self.roofline_s(flops, hbm, fp8=True)

    def collective_s(self, num_bytes: float, num_gpus: int, kind: str = "allreduce") -> float:
        """Ring all-reduce / all-gather / all-to-all of `num_bytes` per GPU on NVLink."""
        if num_gpus <= 1 or num_bytes <= 0:
            return 0.0
        factor = {"allreduce": 2.0 * (num_gpus - 1) / num_gpus, "allgather": (num_gpus - 1) / num_gpus,
                  "alltoall": (num_gpus - 1) / num_gpus}[kind]
        return self.values["collective_latency_s"] + factor * num_bytes / self.values["nvlink_bw_bytes_s"]

    def layer_collectives_s(self, tokens_per_gpu: float, num_gpus: int, tp_attention: bool) -> float:
        """Per layer: EP all-to-all dispatch (FP8) + combine (BF16); TP attention adds an all-reduce (BF16)."""
        m = self.model
        if tokens_per_gpu <= 0:
            return 0.0
        a2a = tokens_per_gpu * m.experts_per_token * m.hidden_size * 3.0  # 1 B dispatch + 2 B combine
        t = self.collective_s(a2a, num_gpus, "alltoall")
        if tp_attention:
            t += self.collective_s(tokens_per_gpu * num_gpus * m.hidden_size * 2.0, num_gpus, "allreduce")
        return t

    def layer_collective_bytes(self, tokens_per_gpu: float, num_gpus: int, tp_attention: bool) -> float:
        """NVLink bytes a GPU sends for one layer's collectives (for the byte counters)."""
        m = self.model
        if num_gpus <= 1:
            return 0.0
        out = tokens_per_gpu * m.experts_per_token * m.hidden_size * 3.0 * (num_gpus - 1) / num_gpus
        if tp_attention:
            out += tokens_per_gpu * num_gpus * m.hidden_size * 2.0 * 2.0 * (num_gpus - 1) / num_gpus
        return out

    def step_overhead_s(self) -> float:
        return float(self.values["step_overhead_s"])
