"""`ulacache sensitivity`: how far the headline figures move when each ASSUMED constant is off by +-50%.

Every constant the fidelity ledger (docs/cost-model.md) marks *assumed* -- no measurement, calibration or datasheet
behind it -- is listed in `ASSUMED` with the config key that sets it. Each is replayed at 0.5x and 1.5x its resolved
value (clipped to the key's valid range; the value used is reported) with everything else fixed, and the change of
peak decode throughput, TPOT and admitted concurrency against the unperturbed replay is tabulated. Constants that
cannot act on the config (HiSparse keys for another system, acceptance without speculative decoding) are skipped.

Kept fast by a small default workload (`SMALL_WORKLOAD`: 16 requests at concurrency 16, 32 decode steps, the policy
on one indexer group, no pilot) applied over the config and under the user's `--set`; `full=True` keeps the config's.
Throughput and TPOT come from that replay. Admitted concurrency is a property of the sizing, not of a small run: it
comes from an admission probe (`ADMISSION_PROBE`: 1,024 requests offered at once, one decode step), run for the base
and for the constants that change capacity (`capacity=True`); the others cannot move admission (the engine admits on
capacity alone) and carry the base figure.

Beside them, `TOPOLOGY`: each node-topology value (docs/cost-model.md "Node topology") replayed at the low and the high
end of its plausible range from its sources (`TOPOLOGY_BOUNDS`, per hardware preset), same metrics, as
`topology_rows`. They act only on systems that move KV over PCIe (UlaCache, HiSparse).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

SMALL_WORKLOAD = ("workload.num_requests=16", "workload.max_concurrency=16", "workload.max_steps=32",
                  "fidelity.pilot_steps=0", "fidelity.policy_groups=1")
ADMISSION_PROBE = ("workload.num_requests=1024", "workload.max_concurrency=1024", "workload.max_steps=1",
                   "fidelity.pilot_steps=0", "fidelity.policy_groups=1", "fidelity.request_fraction=0.03125")
FACTORS = (0.5, 1.5)
METRICS = ("throughput_tok_s", "tpot_ms", "admitted")


@dataclass(frozen=True)
class Constant:
    """An assumed constant: the dotted config key that sets it, where its default comes from, its valid range."""

    key: str
    source: str
    lo: float = 0.0
    hi: float = math.inf
    integer: bool = False
    applies: Callable = lambda cfg, costs: True  # (config, cost model) -> can this constant act here?
    capacity: bool = False  # acts on the budgets / sizing (admission), not only on step times


def _system(cfg):
    from sim.systems import SYSTEMS

    return SYSTEMS[cfg.system]


def _hisparse_fallback(cfg, costs) -> bool:
    """HiSparse's copy-efficiency fallback acts only while the calibration has no per-batch table."""
    return ("hisparse_swapin_efficiency" in _system(cfg).cost_keys
            and not costs["hisparse_swapin_efficiency_by_batch"])


def _hisparse_uncalibrated(key: str) -> Callable:
    def applies(cfg, costs) -> bool:  # assumed only while no calibration measured it
        return key in _system(cfg).cost_keys and key not in costs.calibrated_keys
    return applies


def _policy(cfg, costs) -> bool:
    """Host memory for KV matters only to systems whose policy places KV on the host."""
    return _system(cfg).uses_policy


def _spec(cfg, costs) -> bool:
    return cfg.query_tokens > 1


ASSUMED: tuple[Constant, ...] = (
    Constant("costs.flops_efficiency", "share of dense FP8/BF16 peak reached by decode GEMMs/attention", 1e-3, 1.0),
    Constant("costs.step_overhead_s", "scheduler + sampling per decode step (200 us)"),
    Constant("costs.draft_layer_equiv", "an MTP draft pass = one model layer per draft token", applies=_spec),
    Constant("costs.collective_latency_s", "per NCCL collective on NVLink (10 us class)"),
    Constant("costs.attn_kernels_per_layer", "kernels of sparse MLA attention per layer (2)", 1, integer=True),
    Constant("costs.moe_kernels_per_layer", "kernels of MoE/FFN per layer (8)", 1, integer=True),
    Constant("costs.indexer_kernels", "kernels of the indexer per layer (3)", 1, integer=True),
    Constant("costs.indexer_score_bytes", "bytes per (key, query) score written and read by top-k (8)"),
    Constant("costs.hisparse_per_ref_s", "HiSparse hash + LRU per top-k reference (HKV lookup rate)",
             applies=_hisparse_uncalibrated("hisparse_per_ref_s")),
    Constant("costs.hisparse_swapin_efficiency", "HiSparse copy efficiency fallback (naive gather 0.36)", 1e-3, 1.0,
             applies=_hisparse_fallback),
    Constant("memory.gpu_reserve_bytes", "GPU reserve for activations, CUDA graphs, workspace (8 GB)",
             capacity=True),
    Constant("memory.host_kv_fraction", "share of host memory given to KV (0.75)", 1e-3, 1.0, applies=_policy,
             capacity=True),
    Constant("model.attn_weight_bytes", "attention + indexer weights (estimate from the projections)",
             capacity=True),
    Constant("model.routed_weight_fraction", "share of weights in routed experts (0.95)", 0.0, 1.0),
    Constant("spec.accept_mean", "mean accepted tokens per verify step (3.0 of docs/architecture.md's 2.2-3.5)", 1.0,
             applies=_spec),
)


@dataclass(frozen=True)
class TopologyRange:
    """A node-topology value: its config key, where its range comes from, and (cfg, costs) -> (low, high), or None
    where it cannot act (no host traffic, no bounds for this preset)."""

    key: str
    source: str
    bounds: Callable


# preset -> key -> (low, high): the ends of each value's plausible range in its sources (sim/presets.py, docs/cost-model.md)
TOPOLOGY_BOUNDS = {
    "h200": {
        # DGX H200: one ConnectX-7 switch per GPU (DGX H100/H200 user guide); HGX boards with one PCIe switch per
        # 2 GPUs, as DGX A100's PEX88096 switches (DGX A100 user guide), are the other end
        "hardware.gpus_per_switch": (1, 2),
        # Xeon 8480+ (Intel ARK): 8 channels, DDR5-4400 at 2 DIMMs a channel (DGX H200: 32 DIMMs) .. DDR5-4800 at 1
        "hardware.socket_mem_bw_bytes_s": (8 * 4400e6 * 8, 8 * 4800e6 * 8),
        "hardware.host_kv_remote_fraction": (0.0, 0.5),  # NUMA-local .. interleaved over the 2 sockets
    },
    "b300": {
        "hardware.gpus_per_switch": (1, 2),  # one ConnectX-8 per GPU (HGX B300) .. 2 GPUs a switch
        # Xeon 6 6776P (heise): 8 channels, DDR5-5200 at 2 DIMMs a channel .. MRDIMM 8000 at 1
        "hardware.socket_mem_bw_bytes_s": (8 * 5200e6 * 8, 8 * 8000e6 * 8),
        "hardware.host_kv_remote_fraction": (0.0, 0.5),
        # the host path: Gen5 x16 (the CPU's lanes; MLPerf DGX B300) .. Gen6 x16 end to end (the old preset, 2x)
        "hardware.pcie_bw_bytes_s": (55.5e9, 111e9),
    },
}


def _host_traffic(cfg) -> bool:
    return _system(cfg).uses_policy and cfg.cpu_storage


def _preset_bounds(key: str) -> Callable:
    def bounds(cfg, costs):
        got = TOPOLOGY_BOUNDS.get(cfg.hardware.name, {}).get(key)
        return got if got is not None and _host_traffic(cfg) else None
    return bounds


def _host_cap_bounds(cfg, costs):
    """The calibrated host cap per socket: low, one cap for the whole node (the model before the topology: each
    socket gets its share); high, the socket's DRAM peak (the 2-GPU VM's cap an artefact of that host)."""
    cap, sockets = costs["pcie_host_cap_bytes_s"], cfg.hardware.num_sockets
    if not cap or sockets < 2 or not _host_traffic(cfg):
        return None
    return cap / sockets, max(cap, cfg.hardware.socket_mem_bw_bytes_s)


TOPOLOGY: tuple[TopologyRange, ...] = (
    TopologyRange("costs.pcie_host_cap_bytes_s", "calibrated host cap per socket (2-GPU VM fit): node-wide .. "
                  "socket DRAM peak", _host_cap_bounds),
    TopologyRange("hardware.gpus_per_switch", "GPUs per PCIe switch uplink: DGX (1 ConnectX per GPU) .. 2",
                  _preset_bounds("hardware.gpus_per_switch")),
    TopologyRange("hardware.socket_mem_bw_bytes_s", "socket DRAM peak: 2 DIMMs a channel .. 1 (datasheet)",
                  _preset_bounds("hardware.socket_mem_bw_bytes_s")),
    TopologyRange("hardware.host_kv_remote_fraction", "host KV on the other socket: NUMA-local .. interleaved",
                  _preset_bounds("hardware.host_kv_remote_fraction")),
    TopologyRange("hardware.pcie_bw_bytes_s", "B300 host path: Gen5 x16 (CPU lanes) .. Gen6 x16 end to end",
                  _preset_bounds("hardware.pcie_bw_bytes_s")),
)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**31 else f"{value:.12e}"


def topology_rows(tree: dict, cfg, costs, calibration, base: dict) -> tuple[list[dict], list[str]]:
    """Each applicable topology value at the low and the high end of its range (rows), and the keys skipped."""
    import sim

    rows, skipped = [], []
    for t in TOPOLOGY:
        ends = t.bounds(cfg, costs)
        if ends is None:
            skipped.append(t.key)
            continue
        for end, value in zip(("low", "high"), ends):
            setting = [f"{t.key}={_number(value)}"]
            got = headline(sim.replay(tree, None, calibration=calibration, overrides=setting, policy_workers=None))
            got["admitted"] = base["admitted"]  # a link's rate never moves admission (the engine admits on capacity)
            row = {"constant": t.key, "source": t.source, "end": end, "base_value": base_value(cfg, costs, t.key),
                   "value": float(value)}
            row.update(got)
            row.update({f"d_{k}_pct": _pct(got[k], base[k]) for k in METRICS})
            rows.append(row)
    return rows, skipped


def base_value(cfg, costs, key: str) -> float:
    """The resolved value of `key` in this config (cost model after calibration, presets, defaults)."""
    section, name = key.split(".", 1)
    if section == "costs":
        return float(costs[name])
    if section == "model":
        return float(getattr(cfg.model, name))
    if section == "hardware":
        return float(getattr(cfg.hardware, name))
    if section == "spec" and name == "accept_mean":
        q = cfg.query_tokens
        return float(cfg.spec.accept_mean if cfg.spec.accept_mean is not None else 1 + 2 * (q - 1) / 3)
    return float(getattr(getattr(cfg, section), name))


def perturbed(c: Constant, value: float, factor: float, cfg) -> float:
    hi = min(c.hi, float(cfg.query_tokens)) if c.key == "spec.accept_mean" else c.hi
    out = min(max(value * factor, c.lo), hi)
    return float(round(out)) if c.integer else out


def headline(m: dict) -> dict:
    """Peak decode throughput and TPOT (mean time per output token of a running request, from the timed steps: the
    small workload stops before requests finish) of one replay's metrics."""
    steps, tokens = m["decode_steps"], m["decode_tokens"]
    per_req_step = tokens / max(steps, 1) / max(m["mean_concurrency"], 1e-9)
    return {"throughput_tok_s": m["decode_throughput_tok_s"],
            "tpot_ms": m["step_ms_mean"] / per_req_step if per_req_step else float("nan")}


def admitted(tree: dict, calibration, extra: list[str]) -> float:
    """Requests admitted at once when far more are offered than fit (the admission probe)."""
    import sim

    return float(sim.replay(tree, None, calibration=calibration, policy_workers=None,
                            overrides=list(ADMISSION_PROBE) + extra)["max_admitted_concurrency"])


def _text(value: float, c: Constant) -> str:
    """A --set value YAML reads back as this number (YAML 1.1 takes '1e-05' for a string)."""
    return str(int(value)) if c.integer else f"{value:.12e}"


def _pct(new: float, old: float) -> float:
    return (new / old - 1.0) * 100.0 if old else float("nan")


def run(config, overrides: list[str] | None = None, calibration=None, full: bool = False,
        progress: Callable | None = None) -> dict:
    """Base replay + two per applicable assumed constant. Returns {"base", "rows", "skipped", ...}."""
    import sim
    from sim.config import build, load_config
    from sim.costs import CostModel

    sets = ([] if full else list(SMALL_WORKLOAD)) + list(overrides or [])
    tree = load_config(config, sets)
    cfg = build(tree)
    costs = CostModel.load(cfg.hardware, cfg.model, calibration, overrides=cfg.costs)
    t0 = time.perf_counter()
    base = headline(sim.replay(tree, None, calibration=calibration, policy_workers=None))
    base["admitted"] = admitted(tree, calibration, [])
    todo = [c for c in ASSUMED if c.applies(cfg, costs)]
    skipped = [c.key for c in ASSUMED if not c.applies(cfg, costs)]
    rows = []
    for i, c in enumerate(todo):
        value = base_value(cfg, costs, c.key)
        for factor in FACTORS:
            v = perturbed(c, value, factor, cfg)
            setting = [f"{c.key}={_text(v, c)}"]
            got = headline(sim.replay(tree, None, calibration=calibration, overrides=setting, policy_workers=None))
            got["admitted"] = admitted(tree, calibration, setting) if c.capacity else base["admitted"]
            row = {"constant": c.key, "source": c.source, "factor": factor, "base_value": value, "value": v,
                   "admission_probed": c.capacity}
            row.update(got)
            row.update({f"d_{k}_pct": _pct(got[k], base[k]) for k in METRICS})
            rows.append(row)
        if progress is not None:
            progress(i + 1, len(todo))
    topo, topo_skipped = topology_rows(tree, cfg, costs, calibration, base)
    spread = {c: max(abs(r["d_throughput_tok_s_pct"]) for r in rows if r["constant"] == c) for c in
              {r["constant"] for r in rows}}
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "config": tree,
            "small_workload": None if full else list(SMALL_WORKLOAD), "factors": list(FACTORS), "base": base,
            "admission_probe": list(ADMISSION_PROBE), "rows": rows, "skipped": skipped, "ranking": sorted(spread, key=spread.get, reverse=True),
            "topology_rows": topo, "topology_skipped": topo_skipped,
            "cost_model": costs.provenance, "replays": 1 + len(rows) + len(topo), "wall_s": time.perf_counter() - t0,
            "load": list(os.getloadavg())}
