"""The compared systems at matched budgets: how each sizes its pools, admits requests and counts its bytes.

Units: a *token slot* holds one token's KV for every layer (`kv_bytes_per_token` = 656 B x layers); index keys
cost `index_bytes_per_token` (132 B x indexer layers) on the GPU. Every system gets the same GPU KV budget and CPU KV
budget per GPU (`Budget`). A *space* is what admission fills: one per rank under DP attention, one for the whole TP
group under TP attention. Systems are small classes in `SYSTEMS`, chosen by `system:` in the config.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sim.hisparse_costs import HiSparseCosts
from sim.sections import Section, key, register_section
from traces.errors import TraceError

if TYPE_CHECKING:  # annotations only: sim.config imports this module (the system choices and sections)
    from sim.config import SimConfig

INF = float("inf")


@dataclass(frozen=True)
class Budget:
    gpu_kv_bytes_per_gpu: float
    cpu_kv_bytes_per_gpu: float
    weight_bytes_per_gpu: float


def budget_for(cfg: SimConfig) -> Budget:
    """GPU KV budget = HBM - weights - reserve (unless given); CPU = host x fraction / GPUs (unless given)."""
    hw, m, n = cfg.hardware, cfg.model, cfg.num_gpus
    # TP shards all weights; DP replicates attention and shards experts (EP); + the MTP draft layer when speculating
    weights = m.weight_bytes_per_gpu(n, cfg.attention == "tp", speculative=cfg.query_tokens > 1)
    mem = cfg.memory
    gpu = mem.gpu_kv_bytes_per_gpu
    if gpu is None:
        gpu = hw.hbm_bytes - weights - mem.gpu_reserve_bytes
    elif weights + gpu + mem.gpu_reserve_bytes > hw.hbm_bytes:
        raise ValueError(f"memory.gpu_kv_bytes_per_gpu={gpu:.3g} plus weights {weights:.3g} B and reserve "
                         f"{mem.gpu_reserve_bytes:.3g} B exceed hardware.hbm_bytes={hw.hbm_bytes:.3g}")
    if gpu <= 0:
        raise ValueError(f"budget cannot hold the weights: {m.name} needs {weights / 1e9:.1f} GB per GPU on "
                         f"{n} GPUs under {cfg.attention} attention, hardware.hbm_bytes={hw.hbm_bytes / 1e9:.1f} GB, "
                         f"reserve {mem.gpu_reserve_bytes / 1e9:.1f} GB")
    cpu = mem.cpu_kv_bytes_per_gpu
    if cpu is None:
        cpu = hw.host_memory_bytes * mem.host_kv_fraction / n
    return Budget(float(gpu), float(cpu), float(weights))


@dataclass
class Capacity:
    """Static sizing of a system (slots are token slots; per rank unless said otherwise)."""

    num_spaces: int
    ranks_per_space: int
    logical_tokens_per_space: float
    reserve_slots_per_request: int = 0
    reserve_capacity_per_space: float = INF
    buffer_reserve_capacity_per_space: float = INF  # TP local buffer: per rank, must hold the batch's selections
    max_requests_per_space: float = INF
    history_copies: int = 1  # replicas of each history entry (TP replication)
    gpu_pool_slots: int = 0  # per rank
    cpu_pool_slots: int = 0  # per rank
    local_buffer_slots: int = 0  # per rank (ulacache TP)
    device_buffer_slots: int = 0  # per request (hisparse)
    static_index_slots_per_rank: float | None = None  # hisparse: index buffer sized to the logical pool
    notes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RunBound:
    """What a run can hold at once in one admission space, from its workload (not from the budgets).

    `totals` are the requests' final history lengths (input + output + verify tokens), largest first; at most
    `max_running` of them run at once in a space, and admission never lets them exceed `logical_slots`."""

    totals: np.ndarray  # int64, descending
    max_running: int
    logical_slots: float
    num_spaces: int = 1

    @classmethod
    def of(cls, inp: np.ndarray, out: np.ndarray, q: int, max_running: float, logical_slots: float,
           num_spaces: int = 1) -> RunBound:
        totals = np.sort(np.asarray(inp, np.int64) + np.asarray(out, np.int64) + q)[::-1]
        return cls(totals, int(min(len(totals), max_running)), float(logical_slots), int(num_spaces))

    def running_per_space(self) -> float:
        """Requests one space runs in the steady state: the cap shared by the spaces (DP admission balances the
        ranks), at most what its logical slots hold at the mean request, at least one."""
        share = self.max_running / self.num_spaces
        mean = float(self.totals[:self.max_running].mean())
        return max(1.0, min(share, self.logical_slots / max(mean, 1.0)))

    def stride(self, k: int = 1) -> float:
        """Effective request stride at nominal stride k: each space simulates round(running / k) of its requests but
        at least one, so the share it simulates is 1 / stride, not 1 / k, once k nears the requests it runs. Pools
        of a sampled cache are scaled by this stride (`System.cache_config`) and the runner samples by it, so a
        simulated request sees the full system's pool slots per request."""
        if k <= 1:
            return 1.0
        n = self.running_per_space()
        return n / max(1, math.floor(n / k + 0.5))

    def cache_entries(self, k: int = 1) -> int:
        """History entries one cache (all spaces: every rank under DP) holds at most at stride k."""
        return int(min(self.totals[:self.cache_requests(k)].sum(), self.num_spaces * self.slots(k)))

    def cache_requests(self, k: int = 1) -> int:
        """Simulated requests one cache holds at stride k: each space samples max(1, round(n / stride)) of its n
        running, n near `running_per_space` (admission balances the spaces' tokens), + one for the imbalance."""
        per_space = max(1, math.floor(self.running_per_space() / self.stride(k) + 0.5))
        return int(min(self.max_running, self.num_spaces * self.requests(k), self.num_spaces * per_space + 1))

    def slots(self, k: int = 1) -> int:
        """History slots one space's requests simulated at stride k can hold at once: the `requests(k)` largest."""
        return int(min(self.totals[:self.requests(k)].sum(), math.ceil(self.logical_slots)))

    def balanced_slots(self, k: int = 1) -> int:
        """History slots one space's simulated requests hold in practice: admission puts each request in the space
        with the most free slots, so a space holds at most the spaces' mean share + one request, of which it
        simulates 1/stride + one request (at most `slots(k)`). For memory estimates, never for cutting pools."""
        share = self.totals[:self.max_running].sum() / self.num_spaces + self.totals[0]
        return int(min(self.slots(k), math.ceil(share / self.stride(k)) + self.totals[0]))

    def requests(self, k: int = 1) -> int:
        """Simulated requests one space holds at most at stride k (all `max_running` in it: round(n / stride), >= 1)."""
        return max(1, math.floor(self.max_running / self.stride(k) + 0.5))

    @property
    def max_request_slots(self) -> int:
        return int(self.totals[0])


class System:
    """Protocol + shared behaviour. Subclasses set `name`, `uses_policy` and implement `size()`."""

    name = ""
    title = ""  # how the system is written in prose and titles (its config section's class name)
    uses_policy = False
    configurable_policy = False  # runs the replacement policy the `policy:` key names (else its own, `name`)
    speedup_baseline = False  # the system throughput speedups are quoted against (the offloading baseline)
    local_buffer_key: str | None = None  # config key of its TP local buffer's share of the GPU KV budget (plan search)
    config_section: type[Section] | None = None  # its own `name:` config section (registered under its name)
    cost_keys: frozenset[str] = frozenset()  # cost-model keys only this system's mechanisms read
    prefetch = False  # one plan per indexer group, the group's other layers' data moved ahead on a copy stream
    partitioned_homes = False  # under TP each entry is stored once (on its home rank), not replicated per rank
    sized_by_union = False  # sizing reads the workload's verify-token union (`measure_union_slots`)
    h2d_pays_latency = True  # its H2D rows move in a copy call paying `pcie_latency_s` (sim/timing.py GroupWork)

    @property
    def d2h_blocking(self) -> bool:
        """Its D2H rows gate the layer that waits for its transfers (UlaCache's fused swap writes victims back in
        the exchange kernel); False where they run on a side stream."""
        return self.prefetch

    def __init__(self, cfg: SimConfig, budget: Budget, mean_request_tokens: float,
                 union_slots_per_request: float | None = None, max_request_tokens: float | None = None):
        """The workload as sizing sees it: the mean and largest final history (input + output tokens; None = the
        mean) and `union_slots_per_request`, the distinct entries one request's verify tokens select in one access
        batch as measured on its selections (`measure_union_slots`; None = q x top_k, the bound: no two verify
        tokens share a selection)."""
        self.cfg, self.budget = cfg, budget
        self.kv_tok = cfg.model.kv_bytes_per_token_with_draft(cfg.query_tokens > 1)  # + the MTP layer's own KV
        self.ix_tok = cfg.model.index_bytes_per_token_with_draft(cfg.query_tokens > 1)
        self.n = cfg.num_gpus
        self.tp = cfg.attention == "tp"
        self.q = cfg.query_tokens
        self.mean_tokens = float(mean_request_tokens)
        self.max_tokens = self.mean_tokens if max_request_tokens is None else float(max_request_tokens)
        bound = float(self.q * cfg.model.top_k)
        self.union_slots = bound if union_slots_per_request is None else min(float(union_slots_per_request), bound)
        self.capacity = self.size()

    # ---- sizing
    def size(self) -> Capacity:  # pragma: no cover - abstract
        raise NotImplementedError

    def spaces(self) -> tuple[int, int]:
        return (1, self.n) if self.tp else (self.n, 1)

    # ---- per-step traffic shape
    @property
    def symmetric_ranks(self) -> bool:
        """All ranks do identical work (TP replication): the engine may time one rank for all."""
        return self.tp and not self.partitioned_homes

    @property
    def policy_label(self) -> str:
        """The replacement policy the metrics name (the system's own unless it runs a configurable one)."""
        return self.cfg.policy if self.configurable_policy else self.name

    @classmethod
    def facts(cls) -> dict:
        """What result readers (reports/, which import none of sim) select on instead of system names."""
        return {"system_title": cls.title, "configurable_policy": cls.configurable_policy,
                "speedup_baseline": cls.speedup_baseline}

    def query_chunk(self) -> int:
        """Verify tokens per access batch (all of a step's by default)."""
        return self.q

    def buffer_copy_slots(self, hist, buffer_peak_rows: float) -> float:
        """Slots of GPU copies of history entries (buffers that never count as capacity), all ranks."""
        return 0.0

    # ---- admission
    def need_slots(self, num_input: int, num_output: int) -> float:
        """Logical slots a request holds at its end (admission reserves them up front)."""
        return float(num_input + num_output + self.q)

    def reserve_slots(self, need: float) -> float:
        """Device-buffer slots a request reserves while it runs (HiSparse's per-request quota; none elsewhere)."""
        return float(self.capacity.reserve_slots_per_request)

    def indexer_keys(self, hist_rank: list[float], hist_total: float) -> list[float]:
        """Index keys each rank scores for one indexer layer."""
        if self.tp:
            return [hist_total] * self.n
        return list(hist_rank)

    def indexer_allgather_bytes(self, num_queries: float) -> float:
        return 0.0

    # ---- prompts (sim/prefill.py)
    def prompt_host_tokens(self, space: int, num_input: int, placed_cpu_tokens: float) -> np.ndarray:
        """Prompt tokens of a request admitted in `space` that this system writes to each rank's host memory (one
        entry per rank); `placed_cpu_tokens`: what its policy library placed in the CPU tier. GPU-resident: none."""
        return np.zeros(self.n)

    def _on_ranks(self, space: int, tokens: float) -> np.ndarray:
        """`tokens` of one request on the ranks holding it: DP its space's rank; TP every rank (replicas), or 1/N
        each where homes are partitioned."""
        out = np.zeros(self.n)
        if not self.tp:
            out[space] = tokens
        else:
            out[:] = tokens / self.n if self.partitioned_homes else tokens
        return out

    # ---- cost hooks: which cost formula (sim/costs.py) this system's mechanisms use
    def management_s(self, costs, num_refs: float, num_unique: float, num_misses: float, batch: float) -> float:
        """Cache management of one access batch (one indexer group on one rank): the pb-lru/lru pipeline."""
        return costs.management_s(num_refs, num_unique, num_misses)

    def h2d_link_bytes(self, costs, num_rows: float, row_bytes: float, batch: float) -> float:
        """PCIe occupancy of `num_rows` host->GPU rows moved for `batch` requests: the calibrated exchange kernel."""
        return costs.h2d_link_bytes(num_rows, row_bytes)

    def h2d_replay_link_bytes(self, costs, num_rows: float, row_bytes: float, batch: float) -> float | None:
        """PCIe occupancy of the rows of each of a group's layers 2..L when moved by another kernel than layer 1's
        (sim/timing.py `GroupWork.h2d_replay_bytes`); None: the same kernel (UlaCache's exchange prefetch)."""
        return None

    # ---- accounting of where the bytes are (token slots, all ranks)
    def footprint(self, unique_tokens: float, num_requests: int, hist: list[float], buffer_slots: float) -> dict:
        """Slots holding history KV now: unique, replicas, buffer copies; plus index-key bytes."""
        copies = self.capacity.history_copies
        return {
            "unique_slots": unique_tokens,
            "replica_slots": unique_tokens * (copies - 1),
            "buffer_slots": buffer_slots,
            "physical_slots": unique_tokens * copies + buffer_slots,
            "index_key_bytes": self.index_key_bytes(unique_tokens),
        }

    def index_key_bytes(self, unique_tokens: float) -> float:
        return unique_tokens * self.ix_tok * self.capacity.history_copies

    # ---- the library cache that runs this system's policy (one per simulated indexer group)
    def cache_config(self, k: int, bound: RunBound):
        """CacheConfig of one simulated group's cache for 1/k of the requests, or None (no policy to run).

        Sampled pools get slack when k > 1: two whole requests in the logical (CPU) tier, so an uneven sample never
        fails an allocation the full system would have made; GPU pools are scaled exactly (slack there would inflate
        hit rates). Every pool is then cut to what the run can hold at once (`RunBound`): beyond it a slot is never
        used, so the cut changes no outcome, only the memory and time of the library's bookkeeping."""
        return None

    @staticmethod
    def _scaled(slots: float, stride: float, slack: float) -> int:
        """Pool slots for 1/stride of the requests (`RunBound.stride`), + slack when sampled."""
        return int(np.ceil(slots / stride + (slack if stride > 1 else 0)))


class SGLang(System):
    """Stock SGLang: every history entry and its index key on the GPU; TP attention replicates them on all ranks."""

    name = "sglang"
    title = "SGLang"

    def size(self) -> Capacity:
        spaces, ranks = self.spaces()
        logical = self.budget.gpu_kv_bytes_per_gpu / (self.kv_tok + self.ix_tok)
        return Capacity(spaces, ranks, logical, history_copies=ranks, gpu_pool_slots=int(logical),
                        notes={"gpu_tokens_per_rank": logical})


@dataclass(frozen=True)
class HiSparseConfig(Section):
    """The `hisparse:` section: SGLang HiSparse's buffers and pool ratio (docs/cost-model.md "HiSparse sizing")."""

    device_buffer_slots: int = key(4096, "device buffer of selected entries per running request (>= model.top_k)",
                                   "token slots")
    page_slots: int = key(64, "page size: each running request also holds one page for its newest tokens (and, "
                              "speculating, the MTP staging ring in pages)", "token slots")
    host_to_device_ratio: int | None = key(None, "SGLang's integer host pool / device pool ratio; none = chosen per "
                                                 "concurrency cap (the smallest whose pools hold what the cap can use)",
                                           "ratio")
    max_running_requests: int = key(0, "running requests per admission space (0 = no cap beyond "
                                       "workload.max_concurrency)", "count")

    def check(self, model) -> None:
        """Buffers of at least one selection, a ratio of at least 1, no negative cap (one-line errors)."""
        if self.device_buffer_slots < 1:
            raise ValueError(f"config key hisparse.device_buffer_slots must be >= 1, got {self.device_buffer_slots}")
        if self.device_buffer_slots < model.top_k:
            raise ValueError("config key hisparse.device_buffer_slots must be >= model.top_k")
        if self.host_to_device_ratio is not None and self.host_to_device_ratio < 1:
            raise ValueError("config key hisparse.host_to_device_ratio must be >= 1")
        if self.max_running_requests < 0:
            raise ValueError(f"config key hisparse.max_running_requests must be >= 0, got {self.max_running_requests}")
        if self.page_slots < 1:
            raise ValueError(f"config key hisparse.page_slots must be >= 1, got {self.page_slots}")


def _hisparse_costs(system, costs) -> HiSparseCosts:
    """HiSparse's cost formulas on `costs`, one wrapper kept on the system and rebuilt only for another CostModel:
    the engine asks on every layer of every step."""
    hcosts = getattr(system, "_hcosts", None)
    if hcosts is None or hcosts.costs is not costs:
        hcosts = system._hcosts = HiSparseCosts(costs)
    return hcosts


class HiSparse(System):
    """SGLang HiSparse: full history in pinned host memory, a device buffer per running request, the index keys of
    the whole logical pool on the GPU; replicated per rank under TP attention.

    Sizing as SGLang sizes it (docs/cost-model.md "HiSparse sizing"): a device pool of S slots and an integer
    `host_to_device_ratio` r give a logical (= host) pool of r S slots whose index keys stay on the GPU:
    S KV + r S index <= GPU budget, r S KV <= CPU budget (below the GPU's S, the device pool is made smaller, as a
    lower `--mem-fraction-static` would). Admission needs a logical slot per token and a device buffer per request.
    Unless `hisparse.host_to_device_ratio` is given, r is chosen per concurrency cap as UlaCache's pools are: the
    smallest r whose logical pool holds what the cap's requests can use (each at the workload's longest history)
    with the cap's device buffers in S, else the r that admits the most requests."""

    name = "hisparse"
    title = "HiSparse"
    config_section = HiSparseConfig
    uses_policy = True
    speedup_baseline = True
    h2d_pays_latency = False  # the swap-in kernel reads pinned host memory itself: its fixed time is its management
    d2h_blocking = False  # decode backups run on SGLang's decode_backup_stream
    cost_keys = frozenset({"hisparse_per_ref_s", "hisparse_swapin_efficiency", "hisparse_swapin_efficiency_by_batch",
                           "hisparse_swapin_fixed_s", "hisparse_mtp_swapin_fixed_s", "hisparse_mtp_per_ref_s",
                           "hisparse_mtp_swapin_efficiency_by_batch"})

    @property
    def mtp(self) -> bool:
        """SGLang's MTP swap-in serves the step (hisparse_mtp.py): 2-4 verify tokens, 1024 <= top_k <= the device
        buffer, verify tokens x top_k <= 8192. Then one gather + commit launch pair per layer resolves every verify
        token and copies the unique misses once."""
        k, buf = self.cfg.model.top_k, self.cfg.hisparse.device_buffer_slots
        return 2 <= self.q <= 4 and 1024 <= k <= buf and self.q * k <= 8192

    @property
    def prefetch(self) -> bool:
        """IndexShare without speculative decoding: the group's anchor layer plans its misses (one swap-in kernel) and
        each skip layer replays the copies on SGLang's prefetch stream while earlier layers compute (the engine's
        prefetch timing). Under speculative decoding that replay is off (SGLang main line): every layer runs its own
        swap-in on the compute stream, in series."""
        return self.q == 1

    def device_slots_per_request(self) -> int:
        """Device slots a running request holds: its hot buffer + one page for the newest tokens, + under speculative
        decoding the staging ring SGLang's MTP coordinator carves at admission (`hisparse_spec_ring_capacity`:
        ((4 x reserve + page - 1) // page + 1) pages; the reserve per decode taken as the verify tokens)."""
        h = self.cfg.hisparse
        per = h.device_buffer_slots + h.page_slots
        if self.q > 1:
            per += ((4 * self.q + h.page_slots - 1) // h.page_slots + 1) * h.page_slots
        return per

    def pools_at(self, ratio: int) -> tuple[float, float]:
        """(device slots S, logical slots r S) per rank at host_to_device_ratio r: S fills the GPU budget with its
        index buffer, unless the CPU budget cannot hold r S (then S = CPU slots / r)."""
        kv, ix = self.kv_tok, self.ix_tok
        device = min(self.budget.gpu_kv_bytes_per_gpu / (kv + ratio * ix), self.budget.cpu_kv_bytes_per_gpu / kv / ratio)
        return device, ratio * device

    def ratio_for_cap(self, running: int, per_request: int) -> int:
        """The per-cap ratio (class docstring): admitted requests per space at ratio r are min(logical / mean history,
        S / device slots per request, the cap); the smallest r reaching the most wins, unless a smaller r already
        holds what the cap can use."""
        want = running * (self.max_tokens + self.q)  # what the cap's requests can hold (UlaCache's `want`)
        best, best_n = 1, -1.0
        for r in range(1, 1025):
            device, logical = self.pools_at(r)
            if logical >= want and device >= running * per_request:
                return r
            n = min(logical / max(self.mean_tokens, 1.0), device / per_request, float(running))
            if n > best_n * (1 + 1e-12):
                best, best_n = r, n
            if device < per_request:
                break
        return best

    def size(self) -> Capacity:
        h = self.cfg.hisparse
        spaces, ranks = self.spaces()
        per_request = self.device_slots_per_request()
        running = h.max_running_requests or math.ceil(self.cfg.workload.max_concurrency / spaces)
        ratio = int(h.host_to_device_ratio) if h.host_to_device_ratio else self.ratio_for_cap(running, per_request)
        device, logical = self.pools_at(ratio)
        if device < per_request:
            raise ValueError(f"hisparse device pool ({device:.0f} slots per GPU at host_to_device_ratio {ratio}) cannot "
                             f"hold one request's device buffer ({per_request} slots)")
        max_running = h.max_running_requests or INF
        return Capacity(spaces, ranks, logical, reserve_slots_per_request=per_request,
                        reserve_capacity_per_space=device, max_requests_per_space=max_running,
                        history_copies=ranks, gpu_pool_slots=int(device), cpu_pool_slots=int(logical),
                        device_buffer_slots=h.device_buffer_slots, static_index_slots_per_rank=logical,
                        notes={"device_tokens_per_rank": device, "logical_tokens_per_rank": logical,
                               "host_to_device_ratio": ratio, "max_running_requests_per_space": running})

    def index_key_bytes(self, unique_tokens: float) -> float:
        return self.capacity.static_index_slots_per_rank * self.ix_tok * self.n

    def prompt_host_tokens(self, space: int, num_input: int, placed_cpu_tokens: float) -> np.ndarray:
        """The whole prompt is backed up to host memory (SGLang HiSparse writes prefill KV whole to its host pool);
        under TP every rank's replica has its own."""
        return self._on_ranks(space, float(num_input))

    def query_chunk(self) -> int:
        """Verify tokens per access of the library's per-request LRU, which holds device_buffer_slots distinct entries
        a request: under speculative decoding their union can exceed it, so the library takes them in chunks that fit.
        The chunks' misses add up to the unique misses of the union (a later chunk hits what an earlier one loaded),
        which SGLang's MTP kernel copies once; its replacement (a sampled CLOCK that protects the whole union) is not
        the library's LRU (docs/cost-model.md "Cost ledger")."""
        return min(self.q, max(1, self.capacity.device_buffer_slots // self.cfg.model.top_k))

    def buffer_copy_slots(self, hist, buffer_peak_rows: float) -> float:
        """Each running request's device buffer (+ the newest token's slot), on every replica."""
        per_req = np.minimum(hist, self.capacity.device_buffer_slots) + 1
        return float(per_req.sum()) * self.capacity.history_copies

    def management_s(self, costs, num_refs: float, num_unique: float, num_misses: float, batch: float) -> float:
        """SGLang's swap-in on one layer (the anchor layer of a group without speculative decoding, where the skip
        layers replay its copies on a side stream): its fixed time per call + per reference, plus the time its copies
        (one row per miss) take beyond their link occupancy when its blocks cannot fill PCIe (`h2d_link_bytes`).
        MTP: one launch pair for all verify tokens. Outside the MTP kernel's limits (more than 4 verify tokens: SGLang
        refuses) one non-MTP call per chunk of verify tokens the buffer holds."""
        row = self.cfg.model.kv_bytes_per_token_layer
        hcosts = _hisparse_costs(self, costs)
        if self.mtp:
            return (hcosts.management_s(num_refs, 1, mtp=True)
                    + hcosts.swapin_excess_s(num_misses, row, batch, mtp=True))
        calls = math.ceil(self.q / self.query_chunk())
        return hcosts.management_s(num_refs, calls) + hcosts.swapin_excess_s(num_misses, row, batch)

    def h2d_link_bytes(self, costs, num_rows: float, row_bytes: float, batch: float) -> float:
        """Missed rows copied by the swap-in kernel straight from pinned host memory: what the link carries (at
        the larger of the kernel's efficiency at its batch and the calibrated exchange's; `HiSparseCosts.swapin_*`)."""
        return _hisparse_costs(self, costs).swapin_link_bytes(num_rows, row_bytes, batch, self.mtp)

    def h2d_replay_link_bytes(self, costs, num_rows: float, row_bytes: float, batch: float) -> float | None:
        """Without drafts the skip layers replay the anchor's copies on the side stream (SGLang's copy_cache_planned:
        `HiSparseCosts.replay_link_bytes`); under drafts there is no replay (every layer runs its own swap-in)."""
        return _hisparse_costs(self, costs).replay_link_bytes(num_rows, row_bytes, batch) if self.prefetch else None

    def cache_config(self, k: int, bound: RunBound):
        from ulacache import CacheConfig

        cap, cfg = self.capacity, self.cfg
        buf = cap.device_buffer_slots
        ranks = 1 if self.tp else self.n  # TP replicates: every rank holds the same state
        big, ks = bound.max_request_slots, bound.stride(k)
        gpu = max(self._scaled(cap.gpu_pool_slots, ks, buf + 1), buf + 1)
        cpu = max(self._scaled(cap.cpu_pool_slots, ks, 2 * big), 1)
        gpu = min(gpu, max(bound.requests(k), 1) * (buf + 1))  # one device buffer per running request at most
        cpu = min(cpu, bound.slots(k) + 64)
        return CacheConfig(mode="dp", num_ranks=ranks, gpu_slots=gpu, cpu_slots=cpu, policy="hisparse",
                           device_buffer_slots=buf, row_bytes=cfg.model.kv_bytes_per_token_layer,
                           seed=cfg.workload.seed)


@dataclass(frozen=True)
class UlaCacheConfig(Section):
    """The `ulacache:` section: PB-LRU's recency buckets and how each GPU's KV budget splits between the TP local
    buffer, the GPU pool and the CPU pool's index keys (docs/cost-model.md "UlaCache sizing").

    All split keys none = the default rule: the buffer holds one step's remote working set at the largest concurrency
    served without splitting an access batch (capped by workload.max_concurrency); the GPU pool takes the GPU first,
    the CPU pool what the cap needs beyond it. Admission is bounded by unique GPU + CPU slots only; an overflowing
    working set is served in sub-batches (extra passes)."""

    num_recent_buckets: int = key(32, "PB-LRU's recency buckets (the library default; volume-aged: 0.02 points from "
                                      "lru on the paired replay, bench/results/pblru_gap.json)", "count")
    local_buffer_fraction: float | None = key(None, "TP: share of the GPU KV budget for the local buffer",
                                              "fraction")
    local_buffer_slots: int | None = key(None, "TP local buffer per rank; overrides local_buffer_fraction",
                                         "token slots")
    gpu_pool_slots: int | None = key(None, "GPU pool per rank; the CPU pool gets the index-key room left (<= the CPU "
                                           "budget)", "token slots")

    def check(self, model) -> None:
        """No negative pool; the buffer's share leaves room for the GPU pool (one-line errors)."""
        for name in ("gpu_pool_slots", "local_buffer_slots"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"config key ulacache.{name} must be >= 0, got {value}")
        frac = self.local_buffer_fraction
        if frac is not None and not 0 <= frac < 1:
            raise ValueError(f"config key ulacache.local_buffer_fraction must be in [0, 1) (a share of the GPU KV "
                             f"budget; the rest holds the GPU pool and index keys), got {frac}")


class UlaCacheSystem(System):
    """UlaCache: one logical space per rank (DP) or per TP group; GPU pool shared by all requests over an
    exclusive CPU pool; TP keeps history once (on its home rank) plus per-rank local buffers of selected copies;
    index keys partitioned by home rank.

    Sizing (per rank; docs/cost-model.md "UlaCache sizing"): the GPU KV budget holds the local buffer (TP, `b` slots of
    KV), the GPU pool (`g` slots of KV + their index keys) and the index keys of the CPU pool (`c` slots, whose KV is
    in host memory): (g + b) kv + (g + c) ix <= GPU budget, c kv <= CPU budget. Admission is bounded by the unique
    slots m (g + c) alone; nothing is reserved per request. An access batch whose distinct entries do not fit the GPU
    pool (or, TP, whose remote entries do not fit a rank's buffer) is served in sub-batches (extra passes, costed by
    the engine). The split is explicit (`ulacache.local_buffer_slots | local_buffer_fraction | gpu_pool_slots`);
    the default rule serves the largest concurrency it can without splitting (`no_split_concurrency`, capped by
    `workload.max_concurrency`): the buffer holds that concurrency's remote working set; the GPU pool takes the GPU
    first (at least the home working set, at most what the cap's requests can use); the CPU pool extends the logical
    pool to what the cap can use, bounded by the CPU budget and by the GPU room for its index keys. TP: GPU bytes the
    cap's requests can never fill in the pool go to the buffer (more copies kept for reuse across steps)."""

    name = "ulacache"
    title = "UlaCache"
    config_section = UlaCacheConfig
    uses_policy = True
    configurable_policy = True
    local_buffer_key = "ulacache.local_buffer_fraction"
    prefetch = True
    partitioned_homes = True
    sized_by_union = True

    @property
    def remote_share(self) -> float:
        """Share of an access batch's entries homed on other ranks (what each rank's local buffer holds copies of)."""
        m = self.spaces()[1]
        return (m - 1) / m

    def buffer_copy_slots(self, hist, buffer_peak_rows: float) -> float:
        """TP: each rank's local buffer holds copies of the selected entries it does not home, at most its size."""
        if not self.tp:
            return 0.0
        cap = self.capacity
        ws = cap.notes["union_slots_per_request"]
        per_rank = min(cap.local_buffer_slots, float(np.minimum(hist, ws).sum()))
        if buffer_peak_rows:
            per_rank = min(per_rank, buffer_peak_rows / self.n)
        return per_rank * self.n

    @staticmethod
    def with_spread(slots: float) -> float:
        """A working set of `slots` entries as the fullest rank sees it: TP spreads a batch's homes over the ranks
        (water-filled per token) and requests' unions vary, so a rank's share is a sum of many small chances:
        mean + 4 standard deviations of a binomial count (~sqrt(mean)) leaves a split on some rank rare (< 1e-4 per
        rank per step), where sizing at the mean split most steps (the fullest of m ranks exceeds its mean)."""
        return slots + 4.0 * math.sqrt(max(slots, 0.0))

    def gpu_bytes_at(self, n: float, buffer_slots: float | None = None) -> float:
        """GPU bytes per rank that serve n average requests per space without splitting an access batch: index keys
        of their n h / m logical slots, a GPU pool of at least their home working set n u / m (and of what the CPU
        budget cannot hold), and a local buffer of their remote working set (or `buffer_slots` if given)."""
        m = self.spaces()[1]
        ws, h = self.union_slots, self.mean_tokens
        logical = n * h / m
        g = max(self.with_spread(n * min(ws, h) / m), logical - self.host_slots)
        b = (self.with_spread(n * min(ws, h) * self.remote_share) if self.tp else 0.0) if buffer_slots is None \
            else buffer_slots
        return (g + b) * self.kv_tok + max(g, logical) * self.ix_tok

    def no_split_concurrency(self, buffer_slots: float | None = None) -> float:
        """Largest n (requests per space) with `gpu_bytes_at(n)` within the GPU KV budget (bisection)."""
        bg = self.budget.gpu_kv_bytes_per_gpu
        lo, hi = 0.0, 1.0
        while self.gpu_bytes_at(hi, buffer_slots) <= bg and hi < 1e9:
            hi *= 2
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.gpu_bytes_at(mid, buffer_slots) <= bg else (lo, mid)
        return lo

    def size(self) -> Capacity:
        cfg, kv, ix = self.cfg, self.kv_tok, self.ix_tok
        spaces, m = self.spaces()
        u = cfg.ulacache
        bg = self.budget.gpu_kv_bytes_per_gpu
        self.host_slots = self.budget.cpu_kv_bytes_per_gpu / kv if cfg.cpu_storage else 0.0
        ws = min(self.union_slots, self.mean_tokens)
        if not self.tp:
            b = 0.0
        elif u.local_buffer_slots is not None:
            b = float(u.local_buffer_slots)
        elif u.local_buffer_fraction is not None:
            b = u.local_buffer_fraction * bg / kv
        else:
            b = None  # the default rule: sized with the concurrency below
        n_fit = self.no_split_concurrency(b)
        n_t = max(1.0, min(n_fit, math.ceil(cfg.workload.max_concurrency / spaces)))
        default_buffer = b is None and self.tp
        if b is None:
            b = self.with_spread(n_t * ws * self.remote_share)
        rest = bg - b * kv  # GPU pool (KV + keys) and the CPU pool's keys
        # logical slots the cap can use: its requests, each at most the workload's longest final history
        # (+ q: a request's history ends with its last verify tokens, as need_slots counts; + 1 per rank: TP homes
        # water-fill the ranks, so a rank holds at most ceil(S / m) + 1 of S entries)
        want = math.ceil(math.ceil(cfg.workload.max_concurrency / spaces) * (self.max_tokens + self.q) / m) + 1
        if u.gpu_pool_slots is not None:
            g = float(u.gpu_pool_slots)
            c = min(self.host_slots, max(0.0, (rest - g * (kv + ix)) / ix), max(0.0, want - g))
        else:
            floor = self.with_spread(n_t * ws / m)  # one step's home working set before CPU slots get keys
            g = max(floor, min(rest / (kv + ix), (rest - want * ix) / kv))  # GPU first, up to what the cap uses
            c = min(self.host_slots, max(0.0, (rest - g * (kv + ix)) / ix), max(0.0, want - g))
            g = (rest - c * ix) / (kv + ix)  # the GPU bytes the CPU pool's keys leave go to the GPU pool
            if default_buffer and g > want:  # pool slots the cap can never fill: more buffer copies (reuse) instead
                b += (g - want) * (kv + ix) / kv
                g = want
        if (g + b) * kv + (g + c) * ix > bg * (1 + 1e-9) or g <= 0:
            raise ValueError(f"ulacache pools do not fit the GPU KV budget ({bg / 1e9:.1f} GB per GPU): gpu pool "
                             f"{g:.0f} slots, local buffer {b:.0f} slots, cpu pool {c:.0f} slots")
        return Capacity(
            spaces, m, m * (g + c), history_copies=1, gpu_pool_slots=int(g), cpu_pool_slots=int(c),
            local_buffer_slots=int(b),
            notes={"union_slots_per_request": self.union_slots, "target_requests_per_space": n_t,
                   "no_split_requests_per_space": n_fit},
        )

    def indexer_keys(self, hist_rank: list[float], hist_total: float) -> list[float]:
        if self.tp:  # distributed indexer: each rank scores the keys it stores (its homes)
            return [hist_total / self.n] * self.n
        return list(hist_rank)

    def indexer_allgather_bytes(self, num_queries: float) -> float:
        """TP: all-gather of each rank's local top-k candidates (fp32 score + int32 index) per query token."""
        if not self.tp:
            return 0.0
        return num_queries * self.cfg.model.top_k * 8.0

    def index_key_bytes(self, unique_tokens: float) -> float:
        return unique_tokens * self.ix_tok

    def prompt_host_tokens(self, space: int, num_input: int, placed_cpu_tokens: float) -> np.ndarray:
        """Prompts are placed GPU pool first, the rest in the CPU pool (the library's placement; none without CPU
        storage); under TP the homes spread evenly over the ranks."""
        return self._on_ranks(space, placed_cpu_tokens)

    def cache_config(self, k: int, bound: RunBound):
        """Per rank: GPU and CPU pools (TP: + the local buffer), cut to the run's state S. DP: a rank may hold all
        of S (admission may put every request on one rank). TP: homes are water-filled over the ranks' free GPU
        slots, then (only once every GPU pool is full) over their free CPU slots; equal pools make the fullest rank
        grow only when all are level, so no rank's GPU (CPU) tier ever holds more than ceil(S / m) + 1 entries
        (ceil((S - m x gpu) / m) + 1). The CPU tier receives entries only when the GPU tier is full, in both modes."""
        from ulacache import CacheConfig

        cap, cfg = self.capacity, self.cfg
        m = cap.ranks_per_space
        big = bound.max_request_slots
        ws = cap.notes["union_slots_per_request"]
        gpu_slack = 0 if cfg.cpu_storage else 2 * big / m  # GPU slack would raise hit rates
        # at least a rank's share of one request's largest working set (what a batch split down to one request
        # needs; only binds for coarse samples): TP spreads a request's homes over the m ranks of its space, so a
        # rank holds 1/m of it (the whole of it per rank held 6.5x the GPU slots per simulated request at 8 ranks
        # and stride 16, and the sampled TP hit rate 0.738 against the full run's 0.345: bench/fidelity_error.py)
        ks = bound.stride(k)  # the share of each space's requests simulated (>= 1 per space), not 1/k
        floor = math.ceil(min(cfg.query_tokens * cfg.model.top_k, bound.max_request_slots) / m)
        gpu = max(self._scaled(cap.gpu_pool_slots, ks, gpu_slack), floor, 64)
        cpu = self._scaled(cap.cpu_pool_slots, ks, 2 * big / m) if cfg.cpu_storage else 0
        local = (self._scaled(cap.local_buffer_slots, ks, ws) or gpu) if self.tp else 0  # 0 = the library's default
        state = bound.slots(k)
        per_rank = state if not self.tp else math.ceil(state / m)
        if gpu > per_rank + 64:
            gpu = per_rank + 64
        cpu = min(cpu, max(per_rank - gpu, 0) + 64) if cfg.cpu_storage else 0
        if self.tp:
            local = min(local, state + 64)  # copies of other ranks' entries: never more than the whole state
        return CacheConfig(mode="tp" if self.tp else "dp", num_ranks=self.n, gpu_slots=gpu, cpu_slots=cpu,
                           policy=cfg.policy, num_recent_buckets=cfg.ulacache.num_recent_buckets,
                           local_buffer_slots=local, row_bytes=cfg.model.kv_bytes_per_token_layer,
                           seed=cfg.workload.seed)


SYSTEMS: dict[str, type[System]] = {"sglang": SGLang, "hisparse": HiSparse, "ulacache": UlaCacheSystem}
for _system in SYSTEMS.values():  # each system's own config section, under its name
    if _system.config_section is not None:
        register_section(_system.name, _system.config_section)


def system_for_workload(cfg: SimConfig, budget: Budget, requests, source) -> System:
    """The configured system sized for this workload: its mean request and (where the system sizes by it) the
    verify-token union its selections give."""
    total = np.asarray(requests["input_tokens"]) + np.asarray(requests["output_tokens"]) + cfg.query_tokens
    cls = SYSTEMS[cfg.system]
    union = measure_union_slots(source, requests, cfg) if cls.sized_by_union else None
    return cls(cfg, budget, float(total.mean()), union, float(total.max()))


def make_system(cfg: SimConfig, budget: Budget, mean_request_tokens: float,
                union_slots_per_request: float | None = None, max_request_tokens: float | None = None) -> System:
    return SYSTEMS[cfg.system](cfg, budget, mean_request_tokens, union_slots_per_request, max_request_tokens)


def measure_union_slots(source, requests, cfg: SimConfig, num_requests: int = 8,
                        num_groups: int = 8) -> float | None:
    """Distinct entries one request's q verify tokens select in one access batch, measured on the workload's own
    selections (the first `num_requests` requests at their prompt, on `num_groups` indexer groups spread over the
    model): the mean over requests of the group where it is largest (every group's cache holds its own working set).
    Without speculative decoding it is min(history, top_k). None when the source has no selections for them (a
    captured trace that starts later)."""
    m, q = cfg.model, cfg.query_tokens
    inp = np.asarray(requests["input_tokens"], dtype=np.int64)[:num_requests]
    if q == 1:
        return float(np.minimum(inp, m.top_k).mean())
    rids = np.asarray(requests["request_id"], dtype=np.int64)[:num_requests]
    groups = np.unique(np.linspace(0, m.num_index_groups - 1, min(num_groups, m.num_index_groups)).round())
    union = []
    for g in groups.astype(int).tolist():
        try:
            sel = np.asarray(source.select(rids, inp, np.zeros(rids.size, np.int64), g, q))
        except TraceError:  # a captured trace without these selections: size by the bound
            return None
        union.append(np.mean([np.unique(s[s >= 0]).size for s in sel.reshape(rids.size, -1)]))
    return float(max(union))
