"""`replay(config, out_dir)`: one simulated run of one system on one workload; writes metrics.json + timeline.

(Module named `run` so that `sim.replay` stays the function.)
"""
from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from sim import footprint
from sim.config import SimConfig, build, load_config
from sim.costs import CostModel
from sim.engine import Engine
from sim.events import TraceRecorder
from sim.group_workers import resolve_processes
from sim.hardware import events_scheduled
from sim.policy_backend import resolve as resolve_backend
from sim.sampling_error import is_sampled, sampling_error
from sim.systems import RunBound, budget_for, system_for_workload
from ulacache import threads


def load_workload(cfg: SimConfig):
    """(requests as traces.workload.RequestColumns, SelectionSource) from `workload.trace`, or generated from
    `workload.*` via traces (numpy columns: a generated workload's replay never loads pandas)."""
    import traces
    from traces.workload import RequestColumns, generate_request_columns

    wl, model = cfg.workload, cfg.model
    if wl.trace:
        trace = traces.open_trace(Path(wl.trace))
        source = trace.selections
        if int(source.num_groups) != model.num_index_groups or int(source.top_k) != model.top_k:
            raise ValueError(
                f"trace {wl.trace} has {source.num_groups} indexer groups and top_k {source.top_k}; model "
                f"{model.name} needs {model.num_index_groups} groups and top_k {model.top_k}")
        requests = trace.requests.sort_values(["arrival_s", "request_id"], kind="stable")
        requests = RequestColumns.of(requests.head(wl.num_requests))
    else:
        profile = traces.load_profile(wl.profile)
        requests = generate_request_columns(profile, wl.num_requests, wl.seed)
        spec = {**profile.selections, "num_groups": model.num_index_groups, "top_k": model.top_k}
        source = traces.SyntheticSelections(traces.SelectionSpec.from_dict(spec, f"profile {profile.name}"),
                                            seed=wl.seed)
    return requests, source


def check_requests(requests) -> None:
    need = {"request_id", "arrival_s", "input_tokens", "output_tokens"}
    missing = need - set(requests.columns)
    if missing:
        raise ValueError(f"requests table lacks column {sorted(missing)[0]!r}")
    if len(requests) == 0:
        raise ValueError("the workload has no requests")
    if (np.asarray(requests["input_tokens"]) < 1).any() or (np.asarray(requests["output_tokens"]) < 1).any():
        raise ValueError("requests need input_tokens >= 1 and output_tokens >= 1")
    if np.unique(np.asarray(requests["request_id"])).size != len(requests):
        raise ValueError("request_id values must be unique")


def cache_factory(cfg: SimConfig, system, requests, backend: str = "numpy", bound: RunBound | None = None,
                  dense_map_bytes: int = 0):
    """make_cache(group, k) -> a library cache for 1/k of the requests, sized by the system (`System.cache_config`)
    and by what this run can hold at once (`RunBound`; `bound`: one already computed for these requests), never by
    the budgets alone; on array backend `backend` (sim/policy_backend.py: the same plans on any), with TP address
    maps dense up to `dense_map_bytes` a cache (CacheConfig.dense_map_bytes; 0: the library's rule)."""
    import dataclasses

    from ulacache import UlaCache

    cap = system.capacity
    if bound is None:
        bound = RunBound.of(np.asarray(requests["input_tokens"]), np.asarray(requests["output_tokens"]),
                            cfg.query_tokens, min(len(requests), cfg.workload.max_concurrency),
                            cap.logical_tokens_per_space, cap.num_spaces)

    def config_of(k: int):
        return dataclasses.replace(system.cache_config(k, bound), dense_map_bytes=dense_map_bytes)

    def make(group: int, k: int):
        config = config_of(k)
        return UlaCache(config if backend == "numpy" else dataclasses.replace(config, backend=backend))

    make.bound = bound  # what the runner needs to keep its pilot's state bounded
    make.device = backend != "numpy"  # caches built after the group workers fork (sim/policy.PolicyRunner)
    make.config = config_of  # the cache's configuration, without building it
    # what the runner sizes its pilot by (footprint.entries_held): asked of the factory, so that sim.policy needs
    # nothing of sim.footprint (which reads the runner's phases: no import cycle)
    make.entries_held = lambda k: footprint.entries_held(make.config(k), bound, k)
    return make


def steady_window(timeline: list[dict], first_finish_step: int | None) -> np.ndarray:
    """Steps of the steady state: from the first completion (its slot is refilled: the warm-up, with its cold
    caches and every request at its prompt, is over) while requests still wait for room (the running concurrency is
    held at the cap by refills; after the last admission the drain begins). Empty when nothing ever waited."""
    if not timeline or first_finish_step is None:
        return np.zeros(0, dtype=np.int64)
    saturated = np.fromiter((r["saturated"] for r in timeline), dtype=bool, count=len(timeline))
    steps = np.arange(len(timeline))
    return steps[saturated & (steps > first_finish_step)]


def throughput_and_tpot(engine: Engine) -> dict:
    """Steady-state decode throughput and TPOT (docs/architecture.md), the whole-run average beside them.

    TPOT in the window: a step of `step_s` gives each running request its accepted tokens, so its time per output
    token is step_s x batch / tokens; percentiles over the window's steps, each weighted by its batch. Without a
    steady window (every request admitted at once, nothing refilled) the figures are the whole run's, per request."""
    st = engine.state
    tl = st.timeline
    win = steady_window(tl, st.first_finish_step)
    out = {"run_throughput_tok_s": st.tokens / st.busy_s if st.busy_s else 0.0, "steady_window_steps": int(win.size)}
    if win.size:
        step_s = np.array([tl[i]["step_s"] for i in win])
        batch = np.array([tl[i]["batch"] for i in win], dtype=float)
        tokens = np.array([tl[i]["tokens"] for i in win], dtype=float)
        per_tok = step_s * batch / np.maximum(tokens, 1e-12) * 1e3
        order = np.argsort(per_tok, kind="stable")
        cum = np.cumsum(batch[order]) / batch.sum()
        pick = lambda p: float(per_tok[order][min(np.searchsorted(cum, p), order.size - 1)])  # noqa: E731
        return out | {"decode_throughput_tok_s": float(tokens.sum() / step_s.sum()),
                      "tpot_ms_p50": pick(0.5), "tpot_ms_p90": pick(0.9),
                      "tpot_ms_mean": float((step_s * batch).sum() / tokens.sum() * 1e3),
                      "steady_mean_concurrency": float(batch.mean()), "tpot_source": "steady window"}
    done = np.isfinite(engine.finish_s)
    tpot = (engine.finish_s[done] - engine.admit_s[done]) / np.maximum(engine.out[done], 1) * 1e3
    nan = float("nan")
    return out | {"decode_throughput_tok_s": out["run_throughput_tok_s"],
                  "tpot_ms_p50": float(np.median(tpot)) if tpot.size else nan,
                  "tpot_ms_p90": float(np.percentile(tpot, 90)) if tpot.size else nan,
                  "tpot_ms_mean": float(tpot.mean()) if tpot.size else nan,
                  "steady_mean_concurrency": st.concurrency_sum / max(st.steps, 1), "tpot_source": "whole run"}


def metrics_of(cfg: SimConfig, system, budget, engine: Engine, wall_s: float, costs: CostModel) -> dict:
    """metrics.json of a finished replay, its keys in their documented order: what ran and its traffic, the
    capacity at the peak, what was sampled and the simulator's own speed, prefill, the cost model's provenance."""
    return {**_run_metrics(cfg, system, engine), **_capacity_metrics(cfg, system.capacity, budget, engine.state.peak),
            **_sampling_metrics(engine, wall_s),
            **engine.prefill.metrics(),  # prefill mode, prompt host bytes, TTFT when timed (sim/prefill.py)
            **_sampling_error(cfg),
            "cost_model": costs.provenance}


def _sampling_error(cfg: SimConfig) -> dict:
    """{"sampling_error": what a run sampled like this one was measured to be off by}, or {} for a full run or an
    unmeasured configuration (a key that is None in some runs and not in others moved a sweep table's columns on
    resume, as policy_probe_step_ms did)."""
    err = sampling_error(cfg)
    return {} if err is None else {"sampling_error": err}


def _run_metrics(cfg: SimConfig, system, engine: Engine) -> dict:
    """What ran, what completed, throughput and TPOT, hit rates and bytes per token on each link."""
    st, runner = engine.state, engine.runner
    done = np.isfinite(engine.finish_s)
    tokens = max(st.tokens, 1.0)
    return {
        "system": cfg.system, "attention": cfg.attention, "policy": system.policy_label,
        "cpu_storage": bool(cfg.cpu_storage), **system.facts(),  # what reports select on (no system names)
        "hardware": cfg.hardware.name,
        "num_gpus": cfg.num_gpus, "model": cfg.model.name, "draft_tokens": cfg.spec.draft_tokens,
        "num_requests": int(engine.n_req), "completed_requests": int(done.sum()),
        "rejected_requests": int(st.rejected), "decode_steps": int(st.steps),
        "max_admitted_concurrency": int(st.max_concurrency),
        "mean_concurrency": st.concurrency_sum / max(st.steps, 1),
        "decode_tokens": float(st.tokens), "decode_time_s": st.busy_s, "makespan_s": float(engine.env.now),
        **throughput_and_tpot(engine),
        "step_ms_mean": st.busy_s / max(st.steps, 1) * 1e3,
        "gpu_hit_rate": st.hits / st.unique if st.unique else 1.0,
        "unique_ref_fraction": st.unique / st.refs if st.refs else 1.0,
        "pcie_bytes_per_token": (st.h2d_bytes + st.d2h_bytes) / tokens,
        "pcie_h2d_bytes_per_token": st.h2d_bytes / tokens, "pcie_d2h_bytes_per_token": st.d2h_bytes / tokens,
        "pcie_prompt_load_bytes": (runner.prompt_rows if runner else 0.0) * cfg.model.num_layers
        * cfg.model.kv_bytes_per_token_layer,
        "nvlink_bytes_per_token": (st.peer_bytes + st.allgather_bytes) / tokens,
        "nvlink_kv_bytes_per_token": st.peer_bytes / tokens,
        "nvlink_collective_bytes_per_token": st.collective_bytes / tokens,
    }


def _capacity_metrics(cfg: SimConfig, cap, budget, peak: dict | None) -> dict:
    """The slots and bytes held at the peak (unique, replicas, buffer copies, index keys), the budgets and pools."""
    kv_tok = cfg.model.kv_bytes_per_token
    peak = peak or {"unique_slots": 0.0, "replica_slots": 0.0, "buffer_slots": 0.0, "physical_slots": 0.0,
                    "index_key_bytes": 0.0, "concurrency": 0}
    return {
        "physical_kv_slots": float(peak["physical_slots"]),
        "unique_history_positions": float(peak["unique_slots"]),
        "cap_peak_concurrency": int(peak["concurrency"]),
        "cap_unique_slots": float(peak["unique_slots"]),
        "cap_replica_slots": float(peak["replica_slots"]),
        "cap_buffer_slots": float(peak["buffer_slots"]),
        "cap_unique_bytes": float(peak["unique_slots"]) * kv_tok,
        "cap_replica_bytes": float(peak["replica_slots"]) * kv_tok,
        "cap_buffer_bytes": float(peak["buffer_slots"]) * kv_tok,
        "cap_index_key_bytes": float(peak["index_key_bytes"]),
        "cap_gpu_kv_budget_bytes_per_gpu": budget.gpu_kv_bytes_per_gpu,
        "cap_cpu_kv_budget_bytes_per_gpu": budget.cpu_kv_bytes_per_gpu,
        "cap_weight_bytes_per_gpu": budget.weight_bytes_per_gpu,
        "cap_gpu_pool_slots_per_rank": cap.gpu_pool_slots, "cap_cpu_pool_slots_per_rank": cap.cpu_pool_slots,
        "cap_local_buffer_slots_per_rank": cap.local_buffer_slots,
        "cap_device_buffer_slots_per_request": cap.device_buffer_slots,
        "cap_logical_tokens": cap.logical_tokens_per_space * cap.num_spaces,
        "kv_bytes_per_token": kv_tok, "index_bytes_per_token": cfg.model.index_bytes_per_token,
    }


def _sampling_metrics(engine: Engine, wall_s: float) -> dict:
    """Which groups and requests the policy simulated, and the simulator's events and speed."""
    st, runner = engine.state, engine.runner
    events = events_scheduled(engine.env)
    return {
        "policy_groups_simulated": len(runner.groups) if runner else 0,
        "policy_group_ids": [int(g) for g in runner.groups] if runner else [],
        "request_sample_stride": runner.k if runner else 1,  # nominal k (fidelity.request_fraction)
        # the stride pools are scaled by and requests sampled at (RunBound.stride): a space simulates ~1 in this many
        # of its running requests, at least one, so it exceeds k where a space runs few requests
        "request_sample_stride_effective": float(runner.ks) if runner else 1.0,
        "policy_calls": runner.policy_calls if runner else 0,
        "policy_batch_splits": runner.capacity_splits if runner else 0,
        # events of the per-rank simulation: those of groups the timer computed in closed form are counted as
        # simpy would have scheduled them (sim/hardware.skip_events), so this is a modelled count (README)
        "simpy_events": int(events), "sim_wall_s": wall_s,
        "sim_tokens_per_wall_s": st.tokens / wall_s if wall_s else 0.0,
        "simpy_events_per_wall_s": events / wall_s if wall_s else 0.0,
    }


def _json_safe(obj):
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, (np.floating, np.integer)):
        return _json_safe(obj.item())
    return obj


def _execution_metrics(engine: Engine, est: dict, backend: str) -> dict:
    """How the replay ran (none of it changes a result): its memory estimate, the policy's backend and processes,
    the probe that chose them, and the peak RSS: this process's plus the group workers' private pages
    (sim/group_workers.py: sampled)."""
    runner = engine.runner
    out = {"est_peak_memory_bytes": est["peak_bytes"], "policy_backend": backend,
           "policy_processes": runner.processes_used if runner is not None else 1,
           "policy_threads": threads.threads(),  # (each process of a split: the same)
           "selections_on": getattr(engine.source, "draws_on", "host")}
    probe = runner.probe_step_s if runner is not None else None
    if probe is not None:  # the groups' median step after the pilot in one process (wall time): what chose the processes
        out["policy_probe_step_ms"] = probe * 1e3
    out["peak_rss_bytes"] = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024 + (
        float(runner.worker_rss_bytes) if runner is not None else 0.0)
    if runner is not None and runner.device:  # every process's device allocator at its end, summed
        out["policy_device_pool_bytes"] = float(runner.device_pool_bytes() + runner.worker_device_bytes)
    return out


def _source_on(source, backend: str):
    """The selection source a policy on `backend` reads: on cupy the synthetic generator draws on the device too
    (traces/synthetic/device.py: the same positions); anything else as it is."""
    if backend != "cupy":
        return source
    from traces.synthetic.device import selections_on_device

    return selections_on_device(source)


def replay(config: dict | str | Path, out_dir: Path | None = None,
           progress: bool | Callable[[int, int], None] = False, trace_events: Path | None = None,
           calibration: Path | None = None, overrides: list[str] | None = None, max_memory_gb: float | None = None,
           policy_workers: int | None = 1, policy_backend: str | None = None,
           on_step: Callable[[dict], None] | None = None, ratio_log=None, ratio_player=None,
           dense_map_gb: float | None = None) -> dict:
    """Run one replay; returns the metrics dict and writes metrics.json, config.yaml, timeline.parquet to out_dir.
    `progress`: True for a progress bar, or a callable(requests done, requests) called after each decode step;
    `on_step`: a callable given each decode step's timeline record as it ends (a long run's figures so far: its
    `gpu_hit_rate` weighted by `unique_refs` is the run's hit rate up to that step).

    Before simulating, its peak memory is estimated (sim/footprint.py); above `max_memory_gb` or what the machine
    has, it is refused with `footprint.MemoryLimitError` (a ValueError: one line, exit 2) and nothing is written.
    `policy_workers`: processes the simulated indexer groups may run in (sim/group_workers.py; None:
    $ULACACHE_POLICY_WORKERS, else the usable cores, as `ulacache replay`, `sweep` and `plan` run); every metric but
    the wall time and `policy_processes` is the same for any number. `ratio_log`/`ratio_player`: record the policy's
    ratios, or play recorded ones back instead of running it (sim/ratio_replay.py). `policy_backend`: the array backend of the
    policy caches (sim/policy_backend.py; None: $ULACACHE_POLICY_BACKEND, else numpy): the same metrics on any;
    a device backend splits the groups over processes only without a pilot (full fidelity: the split is made
    before any cache exists, as a CUDA context does not survive a fork), else runs them in one. `dense_map_gb`:
    TP address maps dense up to this size a cache (CacheConfig.dense_map_bytes): speed for memory, same metrics."""
    wall0 = time.perf_counter()
    tree = load_config(config if not isinstance(config, str) else Path(config), overrides)
    cfg = build(tree)
    costs = CostModel.load(cfg.hardware, cfg.model, calibration, overrides=cfg.costs)
    requests, source = load_workload(cfg)
    check_requests(requests)
    budget = budget_for(cfg)
    system = system_for_workload(cfg, budget, requests, source)
    recorder = TraceRecorder() if trace_events else None
    backend = resolve_backend(policy_backend)
    dense = dense_map_bytes(dense_map_gb)
    make_cache = cache_factory(cfg, system, requests, dense_map_bytes=dense) \
        if _runs_policy(cfg, system, ratio_player) else None
    processes = resolve_processes(policy_workers)  # (a device backend's workers fork before its caches exist)
    threads.threads()  # a bad $ULACACHE_THREADS fails here, not minutes into the run
    est = footprint.check(cfg, system, requests, make_cache, max_memory_gb, processes)
    if make_cache is not None and backend != "numpy":  # (the footprint probes the numpy caches it models)
        make_cache = cache_factory(cfg, system, requests, backend, bound=make_cache.bound, dense_map_bytes=dense)
        source = _source_on(source, backend)
    engine = Engine(cfg, costs, system, requests, source, recorder, make_cache, processes, ratio_log, ratio_player)
    try:
        with _progress(progress, engine.n_req) as tick:
            engine.run(tick, on_step)
    except BaseException:
        engine.close(failed=True)
        raise
    engine.close()
    if hasattr(source, "close"):
        source.close()
    wall = time.perf_counter() - wall0
    metrics = metrics_of(cfg, system, budget, engine, wall, costs)
    metrics.update(_execution_metrics(engine, est, backend))
    if out_dir is not None:
        _write_outputs(Path(out_dir), engine, tree, metrics)
    if recorder is not None:
        recorder.write(Path(trace_events), meta={"system": cfg.system, "attention": cfg.attention,
                                                 "steps_recorded": min(engine.state.steps,
                                                                       cfg.output.trace_event_steps)})
    return _json_safe(metrics)


def dense_map_bytes(dense_map_gb: float | None) -> int:
    """--dense-map-gb in bytes (None: 0, the library's rule); a ValueError (one line) unless a number in (0, 1000]."""
    if dense_map_gb is None:
        return 0
    if isinstance(dense_map_gb, bool) or not isinstance(dense_map_gb, (int, float)) or not 0 < dense_map_gb <= 1000:
        raise ValueError(f"--dense-map-gb must be a number > 0 and <= 1000, got {dense_map_gb!r}")
    return int(dense_map_gb * 1e9)


def _runs_policy(cfg: SimConfig, system, ratio_player) -> bool:
    """Whether the replay runs the policy's caches: not where recorded ratios stand in (checked against the config)."""
    if ratio_player is None:
        return system.uses_policy
    if not system.uses_policy:
        raise ValueError(f"ratio replay: system {cfg.system} runs no policy")
    if is_sampled(cfg):
        raise ValueError("ratio replay: recorded ratios play back a full-fidelity run (set fidelity=full)")
    ratio_player.check(cfg.model.num_index_groups)
    return False


def _write_outputs(out_dir: Path, engine: Engine, tree: dict, metrics: dict) -> None:
    """timeline.parquet, the resolved config.yaml and metrics.json in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    import pandas as pd

    pd.DataFrame(engine.state.timeline).to_parquet(out_dir / "timeline.parquet", index=False)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    (out_dir / "metrics.json").write_text(json.dumps(_json_safe(metrics), indent=2) + "\n")


class _progress:
    """A rich progress bar over finished requests that appears only once a run has taken more than ~2 s."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total
        self.bar = None
        self.task = None
        self.t0 = time.perf_counter()

    def __enter__(self):
        if callable(self.enabled):  # the caller's own callback(done, total), called once a decode step
            return self.enabled
        if not self.enabled:
            return None
        return self._tick

    def _tick(self, done: int, total: int):
        if self.bar is None:
            if time.perf_counter() - self.t0 < 2.0:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                transient=False)
            self.bar.start()
            self.task = self.bar.add_task("replay", total=total)
        self.bar.update(self.task, completed=done)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
