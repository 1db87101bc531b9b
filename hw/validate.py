"""`ulacache hw validate TRACE --ranks N`: replay one trace's decode steps on the GPU(s) and in the simulator's cost
model; report the per-step error of management + transfer time and both hit counts.

Per step: the numpy facade (what the simulator's policy runner executes) plans the access batch; on the GPU the
device pb-lru pipeline plans the same batch from the same state (its misses, slots and victims must be identical),
moves the real bytes (pools in HBM and pinned host memory: exchange with swap, writes of new tokens' KV allocated
to the CPU tier, and in TP the peer gathers into each rank's local buffer over NVLink) and commits. The GPU time of
that region is compared with `management_s + max over ranks (exchange_s + peer_s)` of `sim.costs.CostModel` with
the calibration. Every entry's bytes encode its logical address; integrity is checked over all entries at the end.
`--backend numpy` runs the same index logic on CPU arrays (no timings): the CI check of any rank count.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hw.executors import make_executor
from hw.gpu import command_line, utc_now
from hw.workload import Selector, to_addresses
from sim.hardware import HOST_CAP_KEYS, concurrent_exchange_s
from ulacache import CacheConfig, UlaCache


def payload_rows(addrs: np.ndarray, row_bytes: int) -> np.ndarray:
    """The bytes an entry carries: 8-byte words `addr ^ (word_index << 40)` (row_bytes a multiple of 8)."""
    words = np.asarray(addrs, dtype=np.int64)[:, None] ^ (np.arange(row_bytes // 8, dtype=np.int64) << 40)
    return words.view(np.uint8).reshape(len(addrs), row_bytes)


class TraceSelections:
    """Selections of a trace directory (traces.open_trace) for the first `n` requests, as Selector.step() does."""

    def __init__(self, path: str, n: int, history: int, q: int):
        import traces

        tr = traces.open_trace(path)
        req = tr.requests.iloc[:n]
        if len(req) < n:
            raise ValueError(f"{path}: trace has {len(req)} requests, --requests asks for {n}")
        self.src, self.q = tr.selections, q
        self.ids = req["request_id"].to_numpy(np.int64)
        self.hist = np.minimum(req["input_tokens"].to_numpy(np.int64), history)
        self.top_k = int(tr.selections.top_k)
        self.meta = {k: tr.meta.get(k) for k in ("profile", "seed", "num_requests", "model", "num_groups")}
        self.step_no = 0

    def step(self) -> np.ndarray:
        steps = np.full(self.ids.size, self.step_no, dtype=np.int64)
        self.step_no += 1
        return np.asarray(self.src.select(self.ids, self.hist, steps, 0, self.q), dtype=np.int64)


def _positions_to_refs(addrs: list, pos: np.ndarray) -> np.ndarray:
    refs = to_addresses(addrs, np.maximum(pos, 0))
    return np.where(pos < 0, -1, refs)


class NodeCosts:
    """A CostModel's link functions with extra values (node-model keys a calibration holds under
    provenance.pending_costs until the simulator's cost model knows them)."""

    def __init__(self, costs, extra: dict):
        self.costs, self.values = costs, {**costs.values, **extra}

    def h2d_link_bytes(self, rows, row_bytes):
        return self.costs.h2d_link_bytes(rows, row_bytes)

    def d2h_link_bytes(self, rows, row_bytes):
        return self.costs.d2h_link_bytes(rows, row_bytes)

    def peer_s(self, rows, row_bytes):
        return self.costs.peer_s(rows, row_bytes)


NODE_KEYS = HOST_CAP_KEYS + ("peer_after_exchange_latency_s",)  # the node model's keys beyond the per-link ones


def load_costs(path: Path | None, overrides: dict | None = None):
    """(CostModel, node view of it) for a calibration file (None: the simulator's defaults); `overrides`: cost keys
    set on top (a sensitivity; unknown keys refused)."""
    from sim.costs import CostModel
    from traces.strict_yaml import read_yaml_file

    costs = CostModel.load("h200", "glm-5", calibration=path, overrides=overrides or None)
    pending = {}
    if path is not None:
        prov = (read_yaml_file(path) or {}).get("provenance") or {}
        pending = {k: v for k, v in (prov.get("pending_costs") or {}).items() if k in NODE_KEYS}
    return costs, NodeCosts(costs, pending)


def predict_parts(costs, plan, row_bytes: int, num_ranks: int, node=None) -> dict:
    """The cost model's management and transfer times of a plan: every rank's exchange at once on the node model
    (shared host-side caps where calibrated), then every rank's peer gathers (they read what was promoted: after an
    exchange they pay `peer_after_exchange_latency_s` per home rank). The live run and `--from-json` both use it."""
    mgmt = costs.management_s(plan.num_refs, plan.num_unique, plan.num_misses)
    R = range(num_ranks)
    exchange, peer = concurrent_exchange_s(node or costs, row_bytes, [int(plan.h2d_rows_per_rank[r]) for r in R],
                                           [int(plan.d2h_rows_per_rank[r]) for r in R],
                                           [int(plan.peer_rows_per_rank[r]) for r in R])
    return {"management_s": mgmt, "exchange_s": exchange, "peer_s": peer}


def predict_s(costs, plan, row_bytes: int, num_ranks: int, node=None) -> float:
    """management + exchange + peer time of a plan (`predict_parts` summed)."""
    return sum(predict_parts(costs, plan, row_bytes, num_ranks, node).values())


def working_set_slots(make_selector, addrs: list, steps: int) -> int:
    """The most distinct entries one step selects (what a TP rank's local buffer must be able to hold)."""
    sel, most = make_selector(), 0
    for _ in range(steps):
        refs = _positions_to_refs(addrs, sel.step())
        most = max(most, int(np.unique(refs[refs >= 0]).size))
    return most


def run(args) -> dict:
    """Replay the selections on the executor and the library side by side, step by step: the facade's plan, the
    device's hits, the state check and, where timed, the measured against the predicted step time."""
    R, q, rb = args.ranks, 1 + max(0, args.draft_tokens), args.row_bytes
    if rb % 16:
        raise ValueError(f"--row-bytes {rb}: must be a multiple of 16")
    mode = args.mode or ("tp" if R > 1 else "dp")
    calib = Path(args.calibration) if args.calibration else None
    if calib is not None and not calib.is_file():
        raise OSError(f"calibration file not found: {calib}")
    costs, node = load_costs(calib)
    n = args.requests
    make_sel, sel, hist_per_req = _selections(args, q)
    cache, local = _validation_cache(args, mode, make_sel, hist_per_req)
    ids = list(range(n))
    addrs = [cache.request_addresses(i) for i in ids]
    ex = _validation_executor(args, cache)
    all_addrs = np.concatenate(addrs)
    ex.write(all_addrs, cache.places(all_addrs), payload_rows(all_addrs, rb))
    allocated = [all_addrs]
    steps, pending = [], []
    for step in range(args.steps):
        refs = _positions_to_refs(addrs, sel.step())
        ex.prepare(refs)
        plan = cache.access(refs)
        meas = ex.run_step(plan, refs, pending)
        pending = []
        cache.commit(plan)
        diffs = ex.check_state()
        steps.append(_step_record(step, plan, meas, diffs, predict_s(costs, plan, rb, R, node), args.warmup_steps))
        new = cache.alloc_many(ids, [1] * n, [i % R for i in ids] if mode == "dp" else None)
        allocated.append(new)
        ex.write_new(new, cache.places(new), payload_rows(new, rb), pending)
    ex.flush(pending)
    checked = ex.verify(cache, np.concatenate(allocated), payload_rows)
    out = {
        "date": utc_now(), "command": command_line(), "device": ex.facts(), "trace": args.trace, "ranks": R,
        "trace_meta": getattr(sel, "meta", {"generator": "hw.workload.Selector", "seed": 0}),
        "mode": mode, "launch_order": list(getattr(ex, "order", [])),
        "exchange_kernel": getattr(ex, "exchange_kernel", None), "steps": len(steps), "requests": n, "query_tokens": q, "row_bytes": rb,
        "gpu_slots_per_rank": args.gpu_slots, "local_buffer_slots_per_rank": int(local) if mode == "tp" else 0,
        "calibration": str(calib) if calib else None,
        "node_model": {k: node.values.get(k) for k in NODE_KEYS},
        "hits_facade": int(sum(s["num_hits"] for s in steps)),
        "hits_device": (int(sum(s["device_hits"] for s in steps)) if all(s["device_hits"] is not None for s in steps)
                        else None),
        "mismatched_steps": int(sum(bool(s["mismatches"]) for s in steps)),
        "exchanges": int(sum(s["num_exchanges"] for s in steps)),
        "peer_fetches": int(sum(s["num_peer_fetches"] for s in steps)),
        "integrity": checked,
        "per_step": steps,
    }
    out.update(_error_summary(steps, args.warmup_steps))
    return out


def _selections(args, q: int):
    """(a maker of fresh selection streams, the stream this run reads, each request's history length): the
    synthetic selector, or a trace's selections."""
    n, hist = args.requests, args.history
    if args.trace == "synthetic":
        make_sel = lambda: Selector(n, hist, 2048, q, seed=0)
        hist_per_req = np.full(n, hist, dtype=np.int64)
    else:
        make_sel = lambda: TraceSelections(args.trace, n, hist, q)
    sel = make_sel()
    if args.trace != "synthetic":
        hist_per_req = sel.hist
    return make_sel, sel, hist_per_req


def _validation_cache(args, mode: str, make_sel, hist_per_req: np.ndarray):
    """The facade cache with every request's history allocated (DP: request i on rank i % R), and its local buffer
    slots (TP: sized from the selections' working set when not given)."""
    R, n = args.ranks, args.requests
    total = int(hist_per_req.sum())
    cpu_slots = -(-(total + n * args.steps + 65536) // R)
    ids = list(range(n))
    local = args.local_buffer_slots
    if mode == "tp" and local <= 0:  # size the local buffer from the selections' working set (addresses are dense)
        starts = np.concatenate([[0], np.cumsum(hist_per_req)[:-1]])
        dense = [np.arange(s, s + h, dtype=np.int64) for s, h in zip(starts.tolist(), hist_per_req.tolist())]
        local = -(-working_set_slots(make_sel, dense, args.steps) // 4096) * 4096
    cache = UlaCache(CacheConfig(mode=mode, num_ranks=R, gpu_slots=args.gpu_slots, cpu_slots=cpu_slots,
                                 policy="pb-lru", backend="numpy", local_buffer_slots=max(local, 0)))
    cache.alloc_many(ids, hist_per_req.tolist(), [i % R for i in ids] if mode == "dp" else None)
    return cache, local


def _validation_executor(args, cache):
    """The executor of `--backend`, with the diagnostic launch order and exchange kernel the arguments ask for."""
    ex = make_executor(args.backend, cache, args.row_bytes)
    if getattr(args, "reverse_launch", False):  # diagnostic: enqueue the ranks' transfers last rank first
        ex.order = ex.order[::-1]
    if hasattr(ex, "exchange_kernel"):  # the twin keeps every rank's lists on GPU 0: several ranks use local lists
        ex.exchange_kernel = getattr(args, "exchange_kernel", None) or ("grid" if args.ranks > 1 else "device")
    return ex


def _step_record(step: int, plan, meas: dict, diffs: list, pred: float, warmup_steps: int) -> dict:
    """One step's line of `per_step`: the plan's counts and rows per rank, the prediction, what the device saw."""
    rec = {"step": step, **plan.counts(), "predicted_s": pred, "device_hits": meas.get("num_hits"),
           "rows_per_rank": {k: [int(x) for x in getattr(plan, f"{k}_rows_per_rank")] for k in ("h2d", "d2h",
                                                                                                 "peer")},
           "mismatches": meas.get("diffs", []) + diffs}
    if "measured_s" in meas:
        rec["measured_s"] = meas["measured_s"]
        rec["rel_err"] = (pred - meas["measured_s"]) / meas["measured_s"]
        rec["parts_s"] = meas.get("parts_s", {})
    rec["warmup"] = step < warmup_steps
    return rec


def _error_summary(steps: list[dict], warmup_steps: int) -> dict:
    """The prediction error over the timed steps after warm-up, and the medians of measured, predicted and parts;
    empty when no step was timed."""
    timed = [s for s in steps if "rel_err" in s and not s["warmup"]]
    errs = np.array([abs(s["rel_err"]) for s in timed])
    if not errs.size:
        return {}
    signed = np.array([s["rel_err"] for s in timed])
    return {"error": {"median_abs": float(np.median(errs)), "p90_abs": float(np.quantile(errs, 0.9)),
                      "median_signed": float(np.median(signed)), "max_abs": float(errs.max()),
                      "steps": int(errs.size), "warmup_steps_excluded": int(warmup_steps)},
            "measured_s_median": float(np.median([s["measured_s"] for s in timed])),
            "predicted_s_median": float(np.median([s["predicted_s"] for s in timed])),
            "parts_s_median": {k: float(np.median([s["parts_s"][k] for s in timed])) for k in timed[0]["parts_s"]}}


def main(args) -> int:
    from ulacache import CapacityError

    try:
        out = run(args)
    except CapacityError as exc:
        raise ValueError(f"the trace's working set does not fit (raise --gpu-slots or lower --requests): {exc}") from None
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=float))
    print(f"{out['mode']} ranks={out['ranks']} steps={out['steps']} hits facade={out['hits_facade']} "
          f"device={out['hits_device']} mismatched_steps={out['mismatched_steps']} exchanges={out['exchanges']} "
          f"peer_fetches={out['peer_fetches']}")
    if "error" in out:
        e = out["error"]
        print(f"per-step error of management + transfer time: median {e['median_abs']:.3f}, p90 {e['p90_abs']:.3f} "
              f"(signed median {e['median_signed']:+.3f}); measured median {out['measured_s_median'] * 1e6:.0f} us, "
              f"predicted {out['predicted_s_median'] * 1e6:.0f} us")
    if "parts_s_median" in out:
        print("measured parts (median us): " + ", ".join(f"{k} {v * 1e6:.0f}" for k, v in out["parts_s_median"].items()))
    print(f"integrity: {out['integrity']}")
    print(f"wrote {path}")
    return 0 if out["mismatched_steps"] == 0 and out["integrity"]["bad"] == 0 else 1
