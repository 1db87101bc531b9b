"""The simulator's cost model: pure per-piece cost functions shared with `hw validate`.

`CostModel.load(hardware, model, calibration, overrides)` merges (lowest to highest precedence) the preset roofline
figures, `sim/costs.yaml`, a calibration (by default the preset's committed one, `sim/calibration.py`; an explicit
file; or `"none"`) and a config's `costs:` section. Unknown keys are rejected. Link functions come in two forms: `*_link_bytes` is the occupancy a transfer puts on a link of raw
bandwidth (the simpy link shares that bandwidth fairly among concurrent transfers), `*_s` is the time of the
transfer alone on its link (latency + occupancy / bandwidth) -- the same formula, for predictions.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from sim import calibration as _calibration
from sim.presets import HARDWARE_PRESETS, MODEL_PRESETS, HardwareSpec, ModelSpec
from traces.strict_yaml import read_yaml_file

DEFAULTS_PATH = Path(__file__).with_name("costs.yaml")
_TABLE_KEYS = ("h2d_row_efficiency_by_bytes", "d2h_row_efficiency_by_bytes", "peer_row_efficiency_by_bytes",
               "hisparse_swapin_efficiency_by_batch", "hisparse_mtp_swapin_efficiency_by_batch",
               "hisparse_planned_copy_efficiency_by_batch")
_FRACTION_KEYS = ("hbm_efficiency", "flops_efficiency", "h2d_row_efficiency", "d2h_row_efficiency",
                  "peer_row_efficiency", "hisparse_swapin_efficiency")
OPTIONAL_KEYS = ("pcie_host_h2d_cap_bytes_s", "pcie_host_d2h_cap_bytes_s", "pcie_host_cap_bytes_s",  # null = no cap
                 "hisparse_mtp_swapin_fixed_s", "hisparse_mtp_per_ref_s",  # null = the non-MTP kernel's value
                 "hisparse_planned_copy_fixed_s")  # null = not measured (no fixed time)
NO_CALIBRATION = "none"  # `calibration="none"` (or `--calibration none`): the uncalibrated sim/costs.yaml defaults


def _defaults() -> dict:
    data = read_yaml_file(DEFAULTS_PATH)  # strict: a duplicated key in the defaults is an error, not last-wins
    if not isinstance(data, dict):
        raise ValueError(f"{DEFAULTS_PATH}: the cost defaults must be a YAML mapping")
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
    """The `costs:` of a calibration file (top-level keys: provenance, costs; anything else is an error).

    The file is first read by the strict reader (duplicate keys, alias bombs and bad UTF-8 refused in one line
    naming the file); `sim.calibration.read` then checks its structure."""
    path = Path(path)
    if path.is_file():
        read_yaml_file(path)
    return _calibration.read(path)[0]


@dataclasses.dataclass(frozen=True)
class CostModel:
    hardware: HardwareSpec
    model: ModelSpec
    values: dict  # resolved cost keys (no nulls left except empty tables)
    provenance: dict

    def __post_init__(self):
        # efficiencies read from tables, per (kind, argument): the engine asks for them on every plan of every step
        object.__setattr__(self, "_lookups", {})

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, hardware: HardwareSpec | str, model: ModelSpec | str, calibration: Path | None = None,
             overrides: dict | None = None) -> "CostModel":
        hw = HARDWARE_PRESETS[hardware] if isinstance(hardware, str) else hardware
        md = MODEL_PRESETS[model] if isinstance(model, str) else model
        values = _defaults()
        provenance: dict = {"defaults": str(DEFAULTS_PATH.name)}
        if calibration is None:  # the preset's committed calibration (derived for other hardware)
            found = _calibration.default_for(hw)
            if found is not None:
                values = _merge_costs(values, found[0], found[1]["calibration"])
                provenance.update(found[1])
                provenance["calibrated_keys"] = sorted(found[0])
            else:
                provenance["calibration"] = None
        elif str(calibration).lower() == NO_CALIBRATION:
            provenance["calibration"] = None
        else:
            explicit = read_calibration(Path(calibration))
            values = _merge_costs(values, explicit, str(calibration))
            provenance["calibration"] = str(calibration)
            provenance["calibrated_keys"] = sorted(explicit)
        values = _merge_costs(values, overrides or {}, "config costs")
        if overrides:
            provenance["config_costs"] = sorted(overrides)
        fill = {
            "launch_s": hw.kernel_launch_s, "pcie_h2d_bw_bytes_s": hw.pcie_bw_bytes_s,
            "pcie_d2h_bw_bytes_s": hw.pcie_bw_bytes_s, "pcie_latency_s": hw.pcie_latency_s,
            "nvlink_bw_bytes_s": hw.nvlink_bw_bytes_s, "nvlink_latency_s": hw.nvlink_latency_s,
        }
        for key, value in fill.items():
            if values.get(key) is None:
                values[key] = value
        for key, value in values.items():
            if value is None and key not in OPTIONAL_KEYS:
                raise ValueError(f"cost key {key} has no value")
        for key in _FRACTION_KEYS:
            if not 0 < values[key] <= 1:
                raise ValueError(f"cost key {key} must be in (0, 1], got {values[key]}")
        if values["cuda_graphs"] not in (0, 1):
            raise ValueError(f"cost key cuda_graphs must be 0 or 1, got {values['cuda_graphs']}")
        for key in ("pcie_h2d_bw_bytes_s", "pcie_d2h_bw_bytes_s", "nvlink_bw_bytes_s"):
            if values[key] <= 0:
                raise ValueError(f"cost key {key} must be positive")
        return cls(hw, md, values, provenance)

    def __getitem__(self, key: str):
        return self.values[key]

    @property
    def calibrated_keys(self) -> frozenset:
        """Cost keys set by the calibration in use (default or explicit), not by defaults or config costs."""
        return frozenset(self.provenance.get("calibrated_keys", ()))

    # ------------------------------------------------------------------ primitives
    def launch_s(self, num_kernels: float = 1) -> float:
        """Eager launches (each kernel launched from the host)."""
        return self.values["launch_s"] * num_kernels

    def kernel_overhead_s(self, num_kernels: float = 1) -> float:
        """Fixed cost of `num_kernels` decode-step kernels: inside a CUDA-graph replay (`cuda_graphs: 1`, what SGLang
        and the compared systems run) each kernel costs `graph_kernel_s`; eager, `launch_s` each."""
        per = self.values["graph_kernel_s"] if self.values["cuda_graphs"] else self.values["launch_s"]
        return per * num_kernels

    def graphs_per_step(self, speculative: bool) -> int:
        """Graph launches per decode step: the target forward; with EAGLE/MTP also SGLang's draft and draft-extend
        graphs (3 in all)."""
        return 3 if speculative else 1

    def roofline_s(self, flops: float, hbm_bytes: float, fp8: bool = True) -> float:
        """Time of a kernel bounded by compute or HBM bandwidth, at the model's efficiencies."""
        peak = self.hardware.fp8_flops if fp8 else self.hardware.bf16_flops
        return max(flops / (peak * self.values["flops_efficiency"]),
                   hbm_bytes / (self.hardware.hbm_bw_bytes_s * self.values["hbm_efficiency"]))

    def row_efficiency(self, kind: str, row_bytes: float) -> float:
        """Share of a link's raw bandwidth (`kind`: h2d, d2h or peer) scattered rows of `row_bytes` reach: the
        calibration's per-size table interpolated, else the scalar `<kind>_row_efficiency`."""
        key = (kind, row_bytes)
        eff = self._lookups.get(key)
        if eff is None:
            table = self.values.get(f"{kind}_row_efficiency_by_bytes") or {}
            if table:
                xs = np.array(sorted(float(k) for k in table))
                ys = np.array([float(table[k]) for k in sorted(table, key=float)])
                eff = float(np.interp(row_bytes, xs, ys))
            else:
                eff = float(self.values[f"{kind}_row_efficiency"])
            self._lookups[key] = eff
        return eff

    # ------------------------------------------------------------------ links
    def h2d_link_bytes(self, num_rows: float, row_bytes: float) -> float:
        return num_rows * row_bytes / self.row_efficiency("h2d", row_bytes)

    def d2h_link_bytes(self, num_rows: float, row_bytes: float) -> float:
        return num_rows * row_bytes / self.row_efficiency("d2h", row_bytes)

    def peer_link_bytes(self, num_rows: float, row_bytes: float) -> float:
        return num_rows * row_bytes / self.row_efficiency("peer", row_bytes)

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

    # ------------------------------------------------------------------ model compute (one GPU, one layer)
    def indexer_s(self, num_keys: float, num_query_keys: float) -> float:
        """Score `num_keys` stored index keys (read once) for `num_query_keys` (key, query) pairs, then top-k."""
        m = self.model
        flops = 2.0 * num_query_keys * m.index_heads * m.index_head_dim
        hbm = num_keys * m.index_bytes_per_token_layer + num_query_keys * self.values["indexer_score_bytes"]
        return self.kernel_overhead_s(self.values["indexer_kernels"]) + self.roofline_s(flops, hbm, fp8=True)

    def attention_s(self, num_query_tokens: float, num_kv_reads: float, heads: float) -> float:
        """Sparse MLA decode attention: each query token reads its top-k latent rows for `heads` heads."""
        m = self.model
        per_pair = 2.0 * (m.kv_lora_rank + m.rope_dim + m.kv_lora_rank)
        flops = num_query_tokens * m.top_k * heads * per_pair
        hbm = num_kv_reads * m.kv_bytes_per_token_layer
        return self.kernel_overhead_s(self.values["attn_kernels_per_layer"]) + self.roofline_s(flops, hbm, fp8=False)

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
        return self.kernel_overhead_s(self.values["moe_kernels_per_layer"]) + self.roofline_s(flops, hbm, fp8=True)

    def collective_link_bytes(self, num_bytes: float, num_gpus: int, kind: str = "allreduce") -> float:
        """Bytes one GPU sends (= receives) on NVLink in a ring collective. `num_bytes`: all-reduce / all-to-all,
        the GPU's whole buffer; all-gather, the GPU's *own contribution* (it receives every other GPU's)."""
        if num_gpus <= 1 or num_bytes <= 0:
            return 0.0
        factor = {"allreduce": 2.0 * (num_gpus - 1) / num_gpus, "allgather": float(num_gpus - 1),
                  "alltoall": (num_gpus - 1) / num_gpus}[kind]
        return factor * num_bytes

    def collective_s(self, num_bytes: float, num_gpus: int, kind: str = "allreduce") -> float:
        """Ring all-reduce / all-gather / all-to-all on NVLink (see `collective_link_bytes` for `num_bytes`)."""
        if num_gpus <= 1 or num_bytes <= 0:
            return 0.0
        return (self.values["collective_latency_s"]
                + self.collective_link_bytes(num_bytes, num_gpus, kind) / self.values["nvlink_bw_bytes_s"])

    def topk_merge_s(self, num_queries: float, num_candidates: float) -> float:
        """Top-k of `num_candidates` gathered (fp32 score, int32 index) candidates per query token: one kernel
        reading every candidate once and writing top_k indices (HBM roofline)."""
        if num_queries <= 0 or num_candidates <= 0:
            return 0.0
        hbm = num_queries * (num_candidates * 8.0 + self.model.top_k * 4.0)
        return self.kernel_overhead_s(self.values["topk_merge_kernels"]) + self.roofline_s(0.0, hbm)

    def distributed_topk_s(self, bytes_per_rank: float, num_queries: float, num_gpus: int) -> float:
        """TP distributed indexer, per indexer layer: all-gather of every rank's local top-k candidates
        (`bytes_per_rank` each; a rank receives (n - 1) x that) and the merge of the n x top_k candidates."""
        if num_gpus <= 1 or bytes_per_rank <= 0:
            return 0.0
        return (self.collective_s(bytes_per_rank, num_gpus, "allgather")
                + self.topk_merge_s(num_queries, num_gpus * self.model.top_k))

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

    def prefill_attention_s(self, num_tokens: float, context_tokens: float, heads: float) -> float:
        """One layer of sparse MLA for `num_tokens` new prompt tokens of one request after `context_tokens` already
        in its KV: each token reads min(keys so far, top_k) latent rows for `heads` heads."""
        if num_tokens <= 0:
            return 0.0
        m = self.model
        sel = min(context_tokens + num_tokens, m.top_k)
        per_pair = 2.0 * (m.kv_lora_rank + m.rope_dim + m.kv_lora_rank)
        return (self.kernel_overhead_s(self.values["attn_kernels_per_layer"])
                + self.roofline_s(num_tokens * sel * heads * per_pair, num_tokens * sel * m.kv_bytes_per_token_layer,
                                  fp8=False))

    def prefill_indexer_s(self, num_tokens: float, context_tokens: float, key_share: float = 1.0) -> float:
        """One indexer layer for the same piece: every new token scores every key so far (causal: token i sees
        context + i keys), then top-k; `key_share` is the share of the keys this GPU stores and scores (a distributed
        indexer: 1 / ranks)."""
        if num_tokens <= 0:
            return 0.0
        keys = context_tokens + num_tokens
        pairs = num_tokens * (context_tokens + (num_tokens + 1) / 2.0)
        return self.indexer_s(keys * key_share, pairs * key_share)

    def mixed_prefill_s(self, rank_pieces: list, decode_tokens: float, num_gpus: int, tp_attention: bool,
                        key_share: float = 1.0, allgather_bytes: float = 0.0, extra_layers: float = 0.0) -> float:
        """What prompt pieces add to a decode step of `decode_tokens` tokens (all GPUs) when they ride in the same
        forward (SGLang's mixed chunked prefill). `rank_pieces`: per attention rank (DP: one list per GPU; TP: one
        list every GPU computes with 1/N of the heads) the (new tokens, context tokens) of each request's piece.
        Per layer a rank adds its pieces' attention and what the extra tokens add to the batch's projections + MoE
        (EP over all GPUs: the weights are read once for the mixed batch; `ffn_s(decode + prompt) - ffn_s(decode)`)
        and collectives (DP: a rank dispatches its own prompt tokens); per indexer layer its pieces' scoring (+ the
        TP candidates' all-gather and merge where the system gathers, `allgather_bytes` per rank). The step waits for
        its slowest rank. `extra_layers`: draft-model layers that also run over the prompt (EAGLE/MTP draft extend)."""
        m = self.model
        pieces = [[(float(t), float(c)) for t, c in rank if t > 0] for rank in rank_pieces]
        prompt = sum(t for rank in pieces for t, _ in rank)
        if prompt <= 0:
            return 0.0
        heads = m.num_heads / num_gpus if tp_attention else m.num_heads
        dec_gpu = decode_tokens / num_gpus
        ffn = (self.ffn_s(decode_tokens + prompt, num_gpus, attn_replicated=not tp_attention)
               - self.ffn_s(decode_tokens, num_gpus, attn_replicated=not tp_attention))
        base_coll = self.layer_collectives_s(dec_gpu, num_gpus, tp_attention)
        gather = self.distributed_topk_s(allgather_bytes, prompt, num_gpus) if allgather_bytes > 0 else 0.0
        worst = 0.0
        for rank in pieces:
            own = sum(t for t, _ in rank)
            coll_tokens = (decode_tokens + prompt) / num_gpus if tp_attention else dec_gpu + own
            coll = self.layer_collectives_s(coll_tokens, num_gpus, tp_attention) - base_coll
            attn = sum(self.prefill_attention_s(t, c, heads) for t, c in rank)
            index = sum(self.prefill_indexer_s(t, c, key_share) for t, c in rank) + (gather if rank else 0.0)
            worst = max(worst, (m.num_layers + extra_layers) * (attn + ffn + coll) + m.num_index_groups * index)
        return worst

    def prefill_chunk_s(self, num_tokens: float, context_tokens: float, num_gpus: int, tp_attention: bool) -> float:
        """One chunk of chunked prefill alone (no decode batch beside it, issue 11 item 6): `num_tokens` new prompt
        tokens of one request after `context_tokens` already in its KV, through every layer on the GPU(s) running it:
        per indexer layer every key so far scored for each new token, top-k; per layer sparse MLA over
        min(keys, top_k) rows per token (TP: the rank's heads), projections + MoE (EP over all GPUs) and the layer
        collectives (DP: the chunk's rank dispatches every token; TP: 1/N each). Writing the chunk's KV to the host,
        where a system does, is `d2h_link_bytes(num_tokens x num_layers, row)` on PCIe (sim/prefill.py)."""
        if num_tokens <= 0:
            return 0.0
        return self.mixed_prefill_s([[(num_tokens, context_tokens)]], 0.0, num_gpus, tp_attention)

    def step_overhead_s(self, speculative: bool = False) -> float:
        """Per decode step: scheduler/sampling (`step_overhead_s`) + the step's CUDA-graph launches."""
        graphs = self.graphs_per_step(speculative) if self.values["cuda_graphs"] else 0
        return float(self.values["step_overhead_s"]) + graphs * self.values["graph_launch_s"]
