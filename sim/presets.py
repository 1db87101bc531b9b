"""Hardware and model presets (docs/architecture.md). Every field can be overridden from a config's `hardware.*` / `model.*`.

Sources are given per field; `docs/cost-model.md` repeats them with the cost-model defaults.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class HardwareSpec:
    """One node: `num_gpus` GPUs, one PCIe link per GPU per direction, one NVLink port per GPU per direction."""

    name: str
    num_gpus: int
    hbm_bytes: float  # per GPU
    hbm_bw_bytes_s: float  # datasheet peak per GPU
    fp8_flops: float  # dense tensor-core peak per GPU
    bf16_flops: float
    nvlink_bw_bytes_s: float  # per GPU, each direction
    nvlink_latency_s: float  # per transfer
    pcie_bw_bytes_s: float  # per GPU, each direction (pinned copy)
    pcie_latency_s: float  # per transfer (cudaMemcpyAsync-class call)
    host_memory_bytes: float  # per node
    kernel_launch_s: float
    # Node topology (sim/hardware.py `Topology`, docs/cost-model.md "Node topology"): datasheet figures, raw per direction
    # unless said; GPUs fill the switches, and the switches the sockets, in rank order.
    num_sockets: int = 2  # CPU sockets; a rank's pinned host KV lives on its own socket's memory by default
    gpus_per_switch: int = 1  # GPUs behind one PCIe switch (its uplink to the socket is shared by them)
    pcie_raw_bytes_s: float = 63.0 * GB  # the GPU's host link, raw (Gen5 x16: 32 GT/s x 16 x 128/130 / 8)
    switch_uplink_raw_bytes_s: float = 63.0 * GB  # a switch's uplink to its socket, raw (Gen5 x16)
    socket_pcie_raw_bytes_s: float = 315.1 * GB  # a socket's PCIe root complex, raw (its Gen5 lanes x 3.94 GB/s)
    socket_mem_bw_bytes_s: float = 307.2 * GB  # a socket's DRAM peak, both directions (channels x MT/s x 8 B)
    inter_socket_bw_bytes_s: float = 128.0 * GB  # socket-to-socket link, each direction (UPI links x GT/s x 2 B)
    host_kv_remote_fraction: float = 0.0  # share of a rank's host KV placed on the other socket(s) (0 = NUMA-local)


@dataclass(frozen=True)
class ModelSpec:
    """What a decode step needs: layer/indexer structure, KV and indexer bytes, weights and active parameters."""

    name: str
    num_layers: int
    num_index_groups: int  # layers that compute top-k (IndexShare: 21 of 78); = num_layers without sharing
    kv_bytes_per_token_layer: int  # MLA latent, FP8 (656 B)
    index_bytes_per_token_layer: int  # indexer key (132 B), stored only for layers that compute top-k
    top_k: int
    hidden_size: int
    num_heads: int
    kv_lora_rank: int
    rope_dim: int
    index_heads: int
    index_head_dim: int
    total_params: float
    active_params: float
    weight_bytes: float  # whole model, FP8 (~1 B per parameter)
    attn_weight_bytes: float  # attention + indexer projections of all layers (replicated per rank under DP)
    num_experts: int
    experts_per_token: int
    routed_weight_fraction: float  # share of weight bytes in routed experts (read only when an expert is hit)
    draft_layers: int = 1  # MTP layers of the speculative draft model (config num_nextn_predict_layers = 1)

    def weight_bytes_per_gpu(self, num_gpus: int, tp_attention: bool, speculative: bool = False) -> float:
        """Weights one GPU holds: TP attention shards everything; DP attention replicates the attention projections
        and shards the experts (EP). With speculative decoding the MTP draft layers are loaded too: each is one
        decoder layer (calc: weight_bytes / num_layers; DeepSeek-V3's published 14B MTP module less its own
        embedding and head, which SGLang shares with the target, is ~12B vs 671B / 61 = 11B), sharded alike."""
        weights, attn = float(self.weight_bytes), float(self.attn_weight_bytes)
        if speculative:
            weights += self.draft_layers * self.weight_bytes / self.num_layers
            attn += self.draft_layers * self.attn_weight_bytes / self.num_layers
        return weights / num_gpus if tp_attention else (weights - attn) / num_gpus + attn

    def kv_bytes_per_token_with_draft(self, speculative: bool) -> int:
        """KV bytes of one token slot: every layer, plus the draft model's MTP layers (their own KV) when on."""
        return self.kv_bytes_per_token_layer * (self.num_layers + (self.draft_layers if speculative else 0))

    def index_bytes_per_token_with_draft(self, speculative: bool) -> int:
        """Index-key bytes of one token slot: indexer layers, plus the MTP layers' own indexers (a DSA layer each)."""
        return self.index_bytes_per_token_layer * (self.num_index_groups + (self.draft_layers if speculative else 0))

    def group_sizes(self) -> list[int]:
        """Layers per indexer group: the first groups take one layer more when layers do not divide evenly."""
        base, extra = divmod(self.num_layers, self.num_index_groups)
        return [base + (1 if g < extra else 0) for g in range(self.num_index_groups)]

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes_per_token_layer * self.num_layers

    @property
    def index_bytes_per_token(self) -> int:
        return self.index_bytes_per_token_layer * self.num_index_groups


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    # H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, FP8 1,979 TFLOPS dense, BF16 989 TFLOPS dense, NVLink 900 GB/s
    # bidirectional (450 GB/s each way). PCIe Gen5 x16: 64 GB/s each way; measured pinned H2D 55.5 GB/s (docs/architecture.md),
    # which is the bandwidth we model. Launch 4.1 us measured; memcpyAsync 5-7 us per call.
    "h200": HardwareSpec(
        name="h200", num_gpus=8, hbm_bytes=141 * GB, hbm_bw_bytes_s=4.8e12, fp8_flops=1.979e15,
        bf16_flops=0.989e15, nvlink_bw_bytes_s=450 * GB, nvlink_latency_s=3e-6, pcie_bw_bytes_s=55.5 * GB,
        pcie_latency_s=6e-6, host_memory_bytes=2e12, kernel_launch_s=4.1e-6,
        # DGX H200 (NVIDIA DGX BasePOD RA; MLPerf Inference v4.1 NVIDIA H200-SXM-141GBx8 system description): 2 x
        # Xeon Platinum 8480C, each GPU a full PCIe Gen5 x16 to the host ("GPU-PCIe 504 GB/s" = 8 x 63 GB/s) through
        # its own ConnectX-7 (integrated PCIe Gen5 switch, 32 lanes: x16 GPU + x16 host; DGX H100/H200 user guide:
        # network module 0 -> CPU 0 -> GPUs 0-3, module 1 -> CPU 1 -> GPUs 4-7). Xeon 8480+ (Intel ARK): 80 PCIe 5.0
        # lanes (315.1 GB/s), 8 channels of DDR5-4800 at 1 DIMM a channel, 4400 at 2 (DGX H200: 32 DIMMs on 16
        # channels, so 8 x 4400 MT/s x 8 B = 281.6 GB/s), 4 UPI links at 16 GT/s (4 x 32 GB/s each way).
        num_sockets=2, gpus_per_switch=1, pcie_raw_bytes_s=63.0 * GB, switch_uplink_raw_bytes_s=63.0 * GB,
        socket_pcie_raw_bytes_s=315.1 * GB, socket_mem_bw_bytes_s=281.6 * GB, inter_socket_bw_bytes_s=128.0 * GB,
    ),
    # B300 (Blackwell Ultra) datasheet-class figures: 288 GB HBM3e, 8 TB/s, FP8 ~4.5 PFLOPS dense, BF16 ~2.25
    # PFLOPS dense, NVLink 5 1.8 TB/s bidirectional (900 GB/s each way), host memory 2-4 TB per node (2 TB taken,
    # the conservative end). Host side (issue 26 item 7): the GPU's PCIe Gen6 x16 ends at a ConnectX-8 SuperNIC
    # (integrated PCIe switch) on the HGX B300 board, one per GPU; its uplink to the x86 host is Gen5 x16: the DGX
    # B300's Xeon 6 6776P has 88 PCIe 5.0 lanes and 8 channels of DDR5-6400 at 1 DIMM a channel (heise, 2025-05),
    # 5200 at 2 (cnews.cz, 2025-03; 32 DIMMs as in the MLPerf DGX B300 entry: 8 x 5200 x 8 B), and NVIDIA's own MLPerf
    # Inference v6.1 "NVIDIA DGX B300" system description lists "PCIe Gen5 x16" host interconnect and "GPU-PCIe
    # 504 GB/s" (8 x 63 GB/s). So a GPU's host path is Gen5 x16, as on H200: the measured Gen5 55.5 GB/s, not 2x.
    # Inter-socket: Xeon 6 6700P, 4 UPI 2.0 links at 24 GT/s (4 x 48 GB/s each way; Intel platform figure, not
    # retrieved from a source in this session).
    "b300": HardwareSpec(
        name="b300", num_gpus=8, hbm_bytes=288 * GB, hbm_bw_bytes_s=8.0e12, fp8_flops=4.5e15,
        bf16_flops=2.25e15, nvlink_bw_bytes_s=900 * GB, nvlink_latency_s=3e-6, pcie_bw_bytes_s=55.5 * GB,
        pcie_latency_s=6e-6, host_memory_bytes=2e12, kernel_launch_s=4.1e-6,
        num_sockets=2, gpus_per_switch=1, pcie_raw_bytes_s=63.0 * GB, switch_uplink_raw_bytes_s=63.0 * GB,
        socket_pcie_raw_bytes_s=346.6 * GB, socket_mem_bw_bytes_s=332.8 * GB, inter_socket_bw_bytes_s=192.0 * GB,
    ),
}

MODEL_PRESETS: dict[str, ModelSpec] = {
    # DeepSeek-V3.2: 61 layers (3 dense + 58 MoE), hidden 7168, 128 heads, kv_lora 512 + rope 64, indexer 64 heads
    # x 128 dim, 256 routed experts top-8 + 1 shared, 671B total / 37B active (model card / config.json).
    # Attention+indexer weights: ~187M params per layer x 61 = ~11.4 GB FP8 (calc from the config's projections).
    "deepseek-v3.2": ModelSpec(
        name="deepseek-v3.2", num_layers=61, num_index_groups=61, kv_bytes_per_token_layer=656,
        index_bytes_per_token_layer=132, top_k=2048, hidden_size=7168, num_heads=128, kv_lora_rank=512,
        rope_dim=64, index_heads=64, index_head_dim=128, total_params=671e9, active_params=37e9,
        weight_bytes=671 * GB, attn_weight_bytes=11.4 * GB, num_experts=256, experts_per_token=8,
        routed_weight_fraction=0.95,
    ),
    # GLM-5 / 5.1: 78 layers (3 dense + 75 MoE), hidden 6144, 64 heads, 256 experts top-8 + 1 shared, 744B / 40B.
    # Attention+indexer weights estimated like DeepSeek's, scaled by hidden size and heads: ~120M x 78 = ~9.4 GB.
    "glm-5": ModelSpec(
        name="glm-5", num_layers=78, num_index_groups=78, kv_bytes_per_token_layer=656,
        index_bytes_per_token_layer=132, top_k=2048, hidden_size=6144, num_heads=64, kv_lora_rank=512,
        rope_dim=64, index_heads=64, index_head_dim=128, total_params=744e9, active_params=40e9,
        weight_bytes=744 * GB, attn_weight_bytes=9.4 * GB, num_experts=256, experts_per_token=8,
        routed_weight_fraction=0.95,
    ),
}
# GLM-5.2: GLM-5 with IndexShare: 21 of 78 layers compute top-k; the others reuse their group's selection.
MODEL_PRESETS["glm-5.2"] = dataclasses.replace(MODEL_PRESETS["glm-5"], name="glm-5.2", num_index_groups=21)


def _build(cls, presets: dict, preset: str, overrides: dict, what: str):
    if preset not in presets:
        raise ValueError(f"unknown {what}.preset {preset!r}; choose from {sorted(presets)}")
    base = presets[preset]
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    clean = {}
    for key, value in overrides.items():
        if key not in fields or key == "name":
            raise ValueError(f"unknown key {what}.{key}; known: {sorted(k for k in fields if k != 'name')}")
        old = getattr(base, key)
        if isinstance(value, str):  # YAML 1.1 reads 2e12 (no dot, no exponent sign) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(old, bool) or not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{what}.{key} must be a number, got {value!r}")
        if isinstance(old, int) and not isinstance(old, bool):
            if float(value) != int(value):
                raise ValueError(f"{what}.{key} must be an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        if value < 0 or (value == 0 and key not in ("nvlink_latency_s", "pcie_latency_s", "kernel_launch_s",
                                                     "attn_weight_bytes", "draft_layers", "host_kv_remote_fraction")):
            raise ValueError(f"{what}.{key} must be positive, got {value!r}")
        clean[key] = value
    return dataclasses.replace(base, **clean)


def build_hardware(preset: str, overrides: dict) -> HardwareSpec:
    spec = _build(HardwareSpec, HARDWARE_PRESETS, preset, overrides, "hardware")
    if spec.host_kv_remote_fraction > 1 or (spec.host_kv_remote_fraction > 0 and spec.num_sockets < 2):
        raise ValueError("hardware.host_kv_remote_fraction must be in [0, 1], and 0 on one socket")
    return spec


def build_model(preset: str, overrides: dict) -> ModelSpec:
    spec = _build(ModelSpec, MODEL_PRESETS, preset, overrides, "model")
    if spec.num_index_groups > spec.num_layers:
        raise ValueError(f"model.num_index_groups ({spec.num_index_groups}) exceeds model.num_layers "
                         f"({spec.num_layers})")
    if not 0 <= spec.routed_weight_fraction <= 1:
        raise ValueError("model.routed_weight_fraction must be in [0, 1]")
    return spec
