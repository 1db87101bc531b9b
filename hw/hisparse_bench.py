"""`ulacache hw hisparse`: check HiSparse's swap-in kernels (SGLang-shaped: the plain per-layer kernel, its IndexShare
planned-copy replay, the MTP verify launch pair) against their numpy references, then time them per call at several
batch sizes captured in CUDA graphs and replayed behind a busy stream (hw/hisparse_graph.py), with the eager timings
beside them; derive the simulator's HiSparse keys from the graph timings.

Per batch B: B requests of `history` tokens (> the device buffer: every request takes the slow path), `layers`
consecutive layer calls per graph (each layer its own slot tables, the same selections, one shared device row pool),
selections that keep `keep` of themselves per decode step (docs/architecture.md: ~44% between consecutive steps in layers 20-60)
and, for MTP, `spec_share` of step 0's set in each later verify step (the simulator's trace profile: 0.6). After
warm-up calls fill the buffers, each timed step runs from the same state with IO skipped (plan only: SGLang's
`skip_io` probe) and in full. copy efficiency = missed-row bytes / (full - skip_io time) / the pinned H2D ceiling.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hw.gpu import command_line, device_facts, utc_now
from hw.hisparse import DeviceSwapIn, TopkStream, init_state, planned_copy_reference, swapin_reference
from hw.hisparse_mtp import DeviceMtpSwapIn, VerifyTopkStream, init_mtp_state, mtp_swapin_reference

BATCHES = (1, 4, 16, 64, 256)
SGLANG_BLOCK = 960  # threads per block of SGLang's swap-in launch (the coordinator's `swap_in_block_size` default)
KEEP = 0.44
SPEC_SHARE = 0.6
LAYERS = 8


def check_against_reference(*, batch: int = 6, buffer_slots: int = 4096, top_k: int = 2048, history: int = 16384,
                            row_bytes: int = 656, steps: int = 5, block: int = 256, keep: float = KEEP,
                            seed: int = 3) -> dict:
    """Several steps on random data (one request on the fast path): kernel == reference in every array and byte,
    the recorded miss plan too, and its planned-copy replay into a second buffer equals the reference replay."""
    import cupy as cp

    from ulacache.backends.cupy_copy import HostPool

    rng = np.random.default_rng(seed)
    seq = rng.integers(buffer_slots + 1, history + 1, size=batch)
    seq[0] = buffer_slots // 2  # fast path
    st = init_state(seq, buffer_slots, history, seed=seed)
    host = HostPool(batch * history, row_bytes)
    host.array[:] = rng.integers(0, 256, size=host.array.shape, dtype=np.uint8)
    dev0 = rng.integers(0, 256, size=(batch * (buffer_slots + 1), row_bytes), dtype=np.uint8)
    ref_dev, ref_skip = dev0.copy(), dev0.copy()
    dev = DeviceSwapIn(st, host, cp.asarray(dev0), row_bytes, top_k, block=block)
    skip_dev = cp.asarray(dev0)
    sel = TopkStream(np.maximum(seq, top_k), top_k, keep, seed=seed)
    plan = (np.zeros((batch, top_k), np.int64), np.zeros((batch, top_k), np.int32))
    diffs, misses = [], 0
    for step in range(steps):
        tk = sel.step()
        tk[0] = rng.permutation(int(seq[0]))[:top_k] if seq[0] >= top_k else tk[0] % seq[0]
        dev.set_topk(tk)
        dev.launch(record_plan=True)
        dev.launch_planned_copy(skip_dev)
        cp.cuda.get_current_stream().synchronize()
        out, miss = swapin_reference(st, tk, host.array, ref_dev, plan=plan)
        planned_copy_reference(plan[0], plan[1], miss, host.array, ref_skip)
        d = dev.differences(st, out, miss)
        if not np.array_equal(dev.dev.get(), ref_dev):
            d.append("device buffer rows differ")
        got_src, got_dst = dev.plan_src.get(), dev.plan_dst.get()
        if any(not np.array_equal(got_src[b, :m], plan[0][b, :m]) or not np.array_equal(got_dst[b, :m], plan[1][b, :m])
               for b, m in enumerate(miss.tolist())):
            d.append("miss plan differs")
        if not np.array_equal(skip_dev.get(), ref_skip):
            d.append("planned-copy replay rows differ")
        diffs += [f"step {step}: {x}" for x in d]
        misses += int(miss.sum())
    return {"batch": batch, "steps": steps, "block": block, "misses": misses, "differences": diffs,
            "ok": not diffs}


def check_mtp_against_reference(*, batch: int = 4, hot: int = 4096, top_k: int = 2048, steps: int = 4,
                                page: int = 64, history: int = 20000, row_bytes: int = 64, calls: int = 5,
                                keep: float = KEEP, spec_share: float = SPEC_SHARE, seed: int = 5) -> dict:
    """Several MTP calls on random data: the gather + commit kernels agree with the reference (hw/hisparse_mtp.py
    `DeviceMtpSwapIn.differences`: slots, epochs, cursor, counts, every row's bytes, rows conserved)."""
    import cupy as cp

    from ulacache.backends.cupy_copy import HostPool

    rng = np.random.default_rng(seed)
    seq = rng.integers(top_k + page + 8, history - steps + 1, size=batch)
    st = init_mtp_state(seq, hot, page, steps, top_k, history, seed=seed)
    host = HostPool(batch * history, row_bytes)
    host.array[:] = rng.integers(0, 256, size=host.array.shape, dtype=np.uint8)
    ref_dev = rng.integers(0, 256, size=(batch * (hot + page + steps * top_k), row_bytes), dtype=np.uint8)
    for b in range(batch):  # the page's tokens were written by decode
        ref_dev[st.dev_locs[b, hot:]] = host.array[st.host_locs[b, st.buf_tok[b, hot:]]]
    dev = DeviceMtpSwapIn(st, host, cp.asarray(ref_dev), row_bytes, top_k)
    sel = VerifyTopkStream(seq, top_k, steps, keep, spec_share, seed=seed)
    diffs, misses, kinds = [], 0, {"union_calls": 0, "overflow_calls": 0}
    for call in range(calls):
        tk = sel.step()
        dev.set_topk(tk)
        dev.launch()
        cp.cuda.get_current_stream().synchronize()
        out, miss, union = mtp_swapin_reference(st, tk, host.array, ref_dev)
        diffs += [f"call {call}: {x}" for x in dev.differences(st, out, miss, union, ref_dev)]
        misses += int(miss.sum())
        over = int(((miss + union) > hot).sum())
        kinds["overflow_calls"] += over
        kinds["union_calls"] += batch - over
    return {"batch": batch, "hot": hot, "calls": calls, "misses": misses, "differences": diffs, "ok": not diffs,
            **kinds}


def _point(B, t: dict, miss_rows: float, refs: int, row_bytes: int) -> dict:
    nbytes = miss_rows * row_bytes
    us = {k: v * 1e6 for k, v in t.items()}
    return {"batch": B, "misses_per_request": miss_rows / B, "hit_rate": 1.0 - miss_rows / refs,
            "us": us["graph"], "skip_io_us": us["graph_skip_io"], "eager_queued_us": us["eager_queued"],
            "eager_idle_us": us["eager_idle"], "eager_idle_skip_io_us": us["eager_idle_skip_io"],
            "effective_gbps": nbytes / t["graph"] / 1e9,
            "copy_gbps": nbytes / max(t["graph"] - t["graph_skip_io"], 1e-9) / 1e9}


def time_plain(timer, B: int, host, *, block: int, keep: float = KEEP, buffer_slots: int = 4096, top_k: int = 2048,
               history: int = 16384, row_bytes: int = 656, layers: int = LAYERS, warm: int = 4, steps: int = 5,
               seed: int = 0) -> tuple[dict, dict]:
    """The plain swap-in at batch B (graph / eager per call), then the IndexShare planned copy of its last plan."""
    import cupy as cp

    from hw.hisparse_graph import time_layers

    seq = np.full(B, history, dtype=np.int64)
    rows = cp.full((B * (buffer_slots + 1), row_bytes), 0x33, dtype=cp.uint8)
    lays = [DeviceSwapIn(init_state(seq, buffer_slots, history, seed=seed + B), host, rows, row_bytes, top_k,
                         block=block) for _ in range(layers)]
    shared = lays[0].topk
    for lay in lays[1:]:
        lay.topk = shared
    sel = TopkStream(seq, top_k, keep, seed=seed + B)
    for _ in range(warm):
        lays[0].set_topk(sel.step())
        for lay in lays:
            lay.launch()
    cp.cuda.Device().synchronize()
    t = time_layers(timer, lays, lambda: lays[0].set_topk(sel.step()), steps=steps, record_plan=True)
    pt = _point(B, t, float(lays[0].miss.sum().get()), B * top_k, row_bytes)
    pt.update({"path": "plain", "keep": keep, "block": block, "buffer_slots": buffer_slots, "top_k": top_k,
               "history": history, "row_bytes": row_bytes, "layers": layers})
    planned = time_planned(timer, lays[0], rows, layers, row_bytes)
    return pt, planned


def time_planned(timer, lay, rows, layers: int, row_bytes: int) -> dict:
    """SGLang's skip-layer IO (4 blocks x 1024 threads replaying the recorded plan), graph per call, alone on the GPU;
    its fixed part from the same graph with every miss count zeroed."""
    graph = timer.capture(lambda s: [lay.launch_planned_copy(rows, stream=s) for _ in range(layers)])
    full = float(np.median([timer.graph_s(graph) for _ in range(5)])) / layers
    eager = float(np.median([timer.eager_idle_s(lambda s: lay.launch_planned_copy(rows, stream=s))
                             for _ in range(5)]))
    counts = lay.miss.copy()
    lay.miss.fill(0)
    empty = float(np.median([timer.graph_s(graph) for _ in range(5)])) / layers
    lay.miss[...] = counts
    nbytes = float(counts.sum().get()) * row_bytes
    return {"path": "planned_copy", "batch": lay.B, "misses_per_request": float(counts.sum().get()) / lay.B,
            "us": full * 1e6, "empty_us": empty * 1e6, "eager_idle_us": eager * 1e6,
            "effective_gbps": nbytes / full / 1e9, "copy_gbps": nbytes / max(full - empty, 1e-9) / 1e9}


def time_mtp(timer, B: int, host, *, keep: float = KEEP, spec_share: float = SPEC_SHARE, hot: int = 4096,
             top_k: int = 2048, steps: int = 4, page: int = 64, history: int = 16384, row_bytes: int = 656,
             layers: int = LAYERS, warm: int = 4, timed: int = 5, seed: int = 0) -> dict:
    """The MTP launch pair at batch B (graph / eager per call = per layer)."""
    import cupy as cp

    from hw.hisparse_graph import time_layers

    seq = np.full(B, history - steps, dtype=np.int64)
    rows = cp.full((B * (hot + page + steps * top_k), row_bytes), 0x33, dtype=cp.uint8)
    lays = [DeviceMtpSwapIn(init_mtp_state(seq, hot, page, steps, top_k, history, seed=seed + B), host, rows,
                            row_bytes, top_k) for _ in range(layers)]
    shared = lays[0].topk
    for lay in lays[1:]:
        lay.topk = shared
    sel = VerifyTopkStream(seq, top_k, steps, keep, spec_share, seed=seed + B)
    for _ in range(warm):
        lays[0].set_topk(sel.step())
        for lay in lays:
            lay.launch()
    cp.cuda.Device().synchronize()
    t = time_layers(timer, lays, lambda: lays[0].set_topk(sel.step()), steps=timed)
    miss, union = float(lays[0].miss.sum().get()), float(lays[0].union.sum().get())
    pt = _point(B, t, miss, B * steps * top_k, row_bytes)
    pt.update({"path": "mtp", "keep": keep, "spec_share": spec_share, "hot": hot, "top_k": top_k, "steps": steps,
               "page": page, "history": history, "row_bytes": row_bytes, "layers": layers,
               "union_hits_per_request": union / B, "overflow": bool(miss + union > B * hot)})
    return pt


def _fit(points: list[dict], refs_key: str) -> dict:
    from hw.fit import fit_nonnegative

    X = [[1.0, p[refs_key]] for p in points]
    return fit_nonnegative(X, [p["skip_io_us"] * 1e-6 for p in points], ["const_s", "per_ref_s"])


def _eff_table(points: list[dict], h2d_bw_bytes_s: float) -> dict:
    return {int(p["batch"]): round(min(1.0, p["copy_gbps"] * 1e9 / h2d_bw_bytes_s), 4) for p in points}


def derive_costs(plain: list[dict], mtp: list[dict], planned: list[dict], h2d_bw_bytes_s: float) -> tuple[dict, dict]:
    """The simulator's keys, every one per call, graph-replayed behind a busy stream (hw/hisparse_graph.py):
    plain: hisparse_swapin_fixed_s + hisparse_per_ref_s x (batch x top_k) is the plan (skip-IO) time of one call,
    hisparse_swapin_efficiency_by_batch the copy share of the H2D ceiling; MTP (one launch pair per layer for all
    verify steps): hisparse_mtp_swapin_fixed_s + hisparse_mtp_per_ref_s x (batch x steps x top_k),
    hisparse_mtp_swapin_efficiency_by_batch; IndexShare skip layer: hisparse_planned_copy_fixed_s per replay call and
    hisparse_planned_copy_efficiency_by_batch. Returns (costs, fits)."""
    for p in plain:
        p["refs"] = p["batch"] * p["top_k"]
    for p in mtp:
        p["refs"] = p["batch"] * p["steps"] * p["top_k"]
    fp, fm = _fit(plain, "refs"), _fit(mtp, "refs")
    eager = [dict(p, skip_io_us=p["eager_idle_skip_io_us"]) for p in plain]
    costs = {"hisparse_swapin_fixed_s": fp["const_s"], "hisparse_per_ref_s": fp["per_ref_s"],
             "hisparse_swapin_efficiency_by_batch": _eff_table(plain, h2d_bw_bytes_s),
             "hisparse_mtp_swapin_fixed_s": fm["const_s"], "hisparse_mtp_per_ref_s": fm["per_ref_s"],
             "hisparse_mtp_swapin_efficiency_by_batch": _eff_table(mtp, h2d_bw_bytes_s),
             "hisparse_planned_copy_fixed_s": float(np.median([p["empty_us"] for p in planned])) * 1e-6,
             "hisparse_planned_copy_efficiency_by_batch": _eff_table(planned, h2d_bw_bytes_s)}
    return costs, {"plain_graph": fp, "mtp_graph": fm, "plain_eager_idle": _fit(eager, "refs")}


def run(quick: bool = False, batches=BATCHES, block: int = SGLANG_BLOCK, save=None) -> dict:
    """Checks, then every batch's timings; `save(res)` (if given) after the checks and after each batch, so a run cut
    short by a device's time limit still leaves what it measured (`complete` False until the costs are derived)."""
    from hw.gpu import copy_ceilings
    from hw.hisparse_graph import GraphTimer
    from ulacache.backends.cupy_copy import HostPool

    ceil = copy_ceilings(nbytes=(64 if quick else 256) << 20)
    res = {"date": utc_now(), "command": command_line(), "device": device_facts(), "ceilings": ceil,
           "timing": "per call; graph = CUDA-graph replay behind a busy stream (launch latency hidden, GPU otherwise "
                     "idle); eager_idle = one launch timed by events on an idle GPU (the old method); see "
                     "hw/hisparse_graph.py"}
    res["checks"] = [check_against_reference(block=b, steps=3 if quick else 5) for b in (block, 1024)]
    res["mtp_checks"] = [check_mtp_against_reference(calls=3 if quick else 5),
                         check_mtp_against_reference(hot=2048, top_k=1024, batch=3, calls=3 if quick else 5, seed=9)]
    res["complete"] = False
    save = save or (lambda r: None)
    save(res)
    hist = 8192 if quick else 16384
    host = HostPool(max(batches) * hist, 656)  # one pinned pool for every run (non-zero bytes)
    host.array.fill(0x5A)
    timer = GraphTimer()
    plain, planned, mtp = [], [], []
    for B in batches:
        pt, pl = time_plain(timer, B, host, block=block, history=hist, steps=3 if quick else 5)
        plain.append(pt)
        planned.append(pl)
        mtp.append(time_mtp(timer, B, host, history=hist, timed=3 if quick else 5))
        save(res | {"plain": plain, "planned_copy": planned, "mtp": mtp})
    res.update({"plain": plain, "planned_copy": planned, "mtp": mtp, "calibrated_block": block})
    res["costs"], res["fits"] = derive_costs(plain, mtp, planned, ceil["h2d_gb_s"] * 1e9)
    res["complete"] = True
    return res


def _print(res: dict) -> None:
    for c in res["checks"] + res["mtp_checks"]:
        print(f"check {c.get('block', 'mtp')}: {'ok' if c['ok'] else c['differences'][:3]} ({c['misses']} misses)")
    print("path      batch  hit%  graph_us  skip_us  eager_q_us  eager_idle_us  copy_GB/s")
    for p in res["plain"] + res["mtp"]:
        print(f"{p['path']:9s} {p['batch']:5d} {100 * p['hit_rate']:5.1f} {p['us']:8.1f} {p['skip_io_us']:8.1f} "
              f"{p['eager_queued_us']:10.1f} {p['eager_idle_us']:12.1f} {p['copy_gbps']:9.2f}")
    for p in res["planned_copy"]:
        print(f"planned   {p['batch']:5d} graph {p['us']:.1f} us (empty {p['empty_us']:.1f}), eager idle "
              f"{p['eager_idle_us']:.1f} us, copy {p['copy_gbps']:.2f} GB/s")
    print(f"costs: {res['costs']}")


def main(args) -> int:
    batches = tuple(int(x) for x in args.batches.split(",")) if args.batches else BATCHES
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    res = run(quick=args.quick, batches=batches, block=args.block,
              save=lambda r: path.write_text(json.dumps(r, indent=1, default=float)))
    path.write_text(json.dumps(res, indent=1, default=float))
    _print(res)
    print(f"wrote {path}")
    return 0 if all(c["ok"] for c in res["checks"] + res["mtp_checks"]) else 1
