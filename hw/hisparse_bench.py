"""`ulacache hw hisparse`: check the HiSparse swap-in kernel against its numpy reference, then time it per layer at
several batch sizes (one block per request) with a stated selection locality; derive the simulator's HiSparse keys.

Per batch B: B requests of `history` tokens (> the device buffer, so every request takes the LRU path), a device
buffer of `buffer_slots` per request, top-k selections that keep `keep` of themselves per step (docs/architecture.md: ~44%
between consecutive steps in layers 20-60). After warm-up steps fill the buffers, each timed step runs twice from the
same state: with IO skipped (hash + LRU only: SGLang's `skip_io` probe) and in full. effective_gbps = missed-row
bytes / full time; copy efficiency = missed-row bytes / (full - skip_io time) / the pinned H2D copy ceiling.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hw.gpu import command_line, device_facts, utc_now
from hw.hisparse import DeviceSwapIn, TopkStream, init_state, swapin_reference

BATCHES = (1, 4, 16, 64, 256)
SGLANG_BLOCK = 960  # threads per block of SGLang's swap-in launch (its `swap_in_block_size`): the calibrated table


def check_against_reference(*, batch: int = 6, buffer_slots: int = 4096, top_k: int = 2048, history: int = 16384,
                            row_bytes: int = 656, steps: int = 5, block: int = 256, keep: float = 0.44,
                            seed: int = 3) -> dict:
    """Several steps on random data (one request on the fast path): kernel == reference in every array and byte."""
    import cupy as cp

    from ulacache.backends.cupy_copy import HostPool

    rng = np.random.default_rng(seed)
    seq = rng.integers(buffer_slots + 1, history + 1, size=batch)
    seq[0] = buffer_slots // 2  # fast path
    st = init_state(seq, buffer_slots, history, seed=seed)
    host = HostPool(batch * history, row_bytes)
    host.array[:] = rng.integers(0, 256, size=host.array.shape, dtype=np.uint8)
    dev0 = rng.integers(0, 256, size=(batch * (buffer_slots + 1), row_bytes), dtype=np.uint8)
    ref_dev = dev0.copy()
    dev = DeviceSwapIn(st, host, cp.asarray(dev0), row_bytes, top_k, block=block)
    sel = TopkStream(np.maximum(seq, top_k), top_k, keep, seed=seed)
    diffs, misses = [], 0
    for step in range(steps):
        tk = sel.step()
        tk[0] = rng.permutation(int(seq[0]))[:top_k] if seq[0] >= top_k else tk[0] % seq[0]
        dev.set_topk(tk)
        dev.launch()
        cp.cuda.get_current_stream().synchronize()
        out, miss = swapin_reference(st, tk, host.array, ref_dev)
        d = dev.differences(st, out, miss)
        if not np.array_equal(dev.dev.get(), ref_dev):
            d.append("device buffer rows differ")
        diffs += [f"step {step}: {x}" for x in d]
        misses += int(miss.sum())
    return {"batch": batch, "steps": steps, "block": block, "misses": misses, "differences": diffs,
            "ok": not diffs}


def time_batches(batches=BATCHES, *, keep: float = 0.44, buffer_slots: int = 4096, top_k: int = 2048,
                 history: int = 16384, row_bytes: int = 656, warm_steps: int = 6, timed_steps: int = 8,
                 block: int = 256, host_pool=None, seed: int = 0) -> list[dict]:
    import cupy as cp

    from ulacache.backends.cupy_copy import HostPool

    out = []
    bmax = max(batches)
    host = host_pool or HostPool(bmax * history, row_bytes)
    if host_pool is None:
        host.array.fill(0x5A)
    stream = cp.cuda.Stream(non_blocking=True)
    for B in batches:
        seq = np.full(B, history, dtype=np.int64)
        st = init_state(seq, buffer_slots, history, seed=seed + B)
        dev_rows = cp.full((B * (buffer_slots + 1), row_bytes), 0x33, dtype=cp.uint8)
        dev = DeviceSwapIn(st, host, dev_rows, row_bytes, top_k, block=block)
        sel = TopkStream(seq, top_k, keep, seed=seed + B)
        with stream:
            for _ in range(warm_steps):
                dev.set_topk(sel.step())
                dev.launch(stream=stream)
            stream.synchronize()
            full, skip, miss = [], [], []
            for _ in range(timed_steps):
                dev.set_topk(sel.step())
                snap = dev.snapshot()
                for skip_io, acc in ((True, skip), (False, full)):
                    if not skip_io:
                        dev.restore(snap)
                    a = stream.record()
                    dev.launch(skip_io=skip_io, stream=stream)
                    e = stream.record()
                    e.synchronize()
                    acc.append(cp.cuda.get_elapsed_time(a, e) * 1e-3)
                miss.append(int(dev.miss.sum().get()))
        t_full, t_skip = float(np.median(full)), float(np.median(skip))
        m = float(np.mean(miss))
        nbytes = m * row_bytes
        out.append({"batch": B, "keep": keep, "block": block, "buffer_slots": buffer_slots, "top_k": top_k,
                    "history": history, "row_bytes": row_bytes, "misses_per_request": m / B,
                    "hit_rate": 1.0 - m / (B * top_k), "us": t_full * 1e6, "skip_io_us": t_skip * 1e6,
                    "us_p90": float(np.quantile(full, 0.9)) * 1e6, "effective_gbps": nbytes / t_full / 1e9,
                    "copy_gbps": nbytes / max(t_full - t_skip, 1e-9) / 1e9})
        del dev, dev_rows
    return out


def derive_costs(points: list[dict], h2d_bw_bytes_s: float) -> dict:
    """Simulator keys from the timed points at one locality: hisparse_per_ref_s (hash + LRU time per top-k
    reference, least squares through the launch-sized intercept) and the copy efficiency per batch."""
    from hw.fit import fit_nonnegative

    X = [[1.0, p["batch"] * p["top_k"]] for p in points]
    f = fit_nonnegative(X, [p["skip_io_us"] * 1e-6 for p in points], ["const_s", "per_ref_s"])
    table = {int(p["batch"]): round(min(1.0, p["copy_gbps"] * 1e9 / h2d_bw_bytes_s), 4) for p in points}
    return {"hisparse_per_ref_s": f["per_ref_s"], "hisparse_swapin_fixed_s": f["const_s"],
            "hisparse_swapin_efficiency_by_batch": table, "_fit": f}


def summarize(res: dict, block: int) -> None:
    """The calibration's view of the timed points: the locality-0.44 points at `block` threads (SGLang's launch
    size by default; the others stay in `points` for comparison)."""
    main_pts = [p for p in res["points"] if p["keep"] == 0.44 and p["block"] == block]
    if not main_pts:
        raise ValueError(f"no timed points at block={block} in the HiSparse results")
    res["calibrated_block"] = block
    res["hisparse_swapin"] = {"batch": [p["batch"] for p in main_pts], "us": [round(p["us"], 2) for p in main_pts],
                              "effective_gbps": [round(p["effective_gbps"], 2) for p in main_pts],
                              "hit_rate": [round(p["hit_rate"], 4) for p in main_pts]}
    costs = derive_costs(main_pts, res["ceilings"]["h2d_gb_s"] * 1e9)
    res["management_fit"] = costs.pop("_fit")
    res["costs"] = costs


def run(quick: bool = False, batches=BATCHES, block: int = SGLANG_BLOCK) -> dict:
    from hw.gpu import copy_ceilings

    ceil = copy_ceilings(nbytes=(64 if quick else 256) << 20)
    res = {"date": utc_now(), "command": command_line(), "device": device_facts(), "ceilings": ceil}
    res["checks"] = [check_against_reference(block=b, steps=3 if quick else 5) for b in (block, 1024)]
    from ulacache.backends.cupy_copy import HostPool

    hist = 8192 if quick else 16384
    host = HostPool(max(batches) * hist, 656)  # one pinned pool for every run (non-zero bytes)
    host.array.fill(0x5A)
    pts = []
    for keep in (0.44, 0.0):
        pts += time_batches(batches, keep=keep, history=hist, block=block, timed_steps=4 if quick else 8,
                            host_pool=host)
    if not quick:  # block-size sensitivity: fewer (256) and more (1024) threads per request than SGLang's
        for other in sorted({256, 1024} - {block}):
            pts += time_batches(batches, keep=0.44, history=hist, block=other, host_pool=host)
    res["points"] = pts
    summarize(res, block)
    return res


def main(args) -> int:
    batches = tuple(int(x) for x in args.batches.split(",")) if args.batches else BATCHES
    res = run(quick=args.quick, batches=batches, block=args.block)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1, default=float))
    for c in res["checks"]:
        print(f"check block={c['block']}: {'ok' if c['ok'] else c['differences'][:3]} ({c['misses']} misses)")
    print("batch keep block  hit%   us  skip_io_us  eff_GB/s  copy_GB/s")
    for p in res["points"]:
        print(f"{p['batch']:5d} {p['keep']:.2f} {p['block']:5d} {100 * p['hit_rate']:5.1f} {p['us']:8.1f} "
              f"{p['skip_io_us']:8.1f} {p['effective_gbps']:8.2f} {p['copy_gbps']:8.2f}")
    print(f"costs: {res['costs']}")
    print(f"wrote {path}")
    return 0 if all(c["ok"] for c in res["checks"]) else 1
