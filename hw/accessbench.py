"""Access-batch benchmark and bit-exactness check of the device pb-lru pipeline against the numpy facade.

One batch = 256 requests x 4 query tokens x top-2048 (2,097,152 references) on a 1M-slot GPU pool with 64K-token
histories (16.8M logical addresses, the rest in the CPU tier). The facade (numpy) and the device pipeline run the
same batches from the same state; results and committed state must be identical. Timed: the access kernels (dedup ..
victims) and access + commit + rotate, eagerly launched and replayed as a CUDA graph.
"""
from __future__ import annotations

import numpy as np

from hw.gpu import cupy, time_gpu
from hw.workload import Selector, build_cache, to_addresses
from ulacache.backends.cupy_pipeline import DevicePbLru, compare_state, compare_with_plan, spin


def check_steps(cache, addrs, selector, dev, steps: int, decode_alloc: bool = True) -> dict:
    """Run `steps` batches through the facade and the device pipeline; count batches whose plan or state differ."""
    bad, diffs, hits, rotated = 0, [], [], []
    for _ in range(steps):
        refs = to_addresses(addrs, selector.step())
        dev.load(cache)
        epoch = cache.device_state().epoch
        plan = cache.access(refs)
        dev.set_refs(refs)
        dev.launch_access()
        res = dev.result()
        d = compare_with_plan(res, plan)
        cache.commit(plan)
        dev.launch_commit()
        d += compare_state(dev.state(), cache)
        hits.append((plan.num_hits, res["num_hits"]))
        rotated.append(cache.device_state().epoch - epoch)  # the epoch rule's outcome (0 or 1) for this batch
        if d:
            bad += 1
            diffs.append(d[:4])
        if decode_alloc:  # one new token per request, as a decode step would add
            ids = list(range(len(addrs)))
            cache.alloc_many(ids, [1] * len(ids), [0] * len(ids) if cache.config.mode == "dp" else None)
    return {"steps": steps, "mismatched_steps": bad, "diffs": diffs[:3], "hits_facade_device": hits,
            "rotated": rotated}


def bench_access(num_requests: int = 256, q: int = 4, top_k: int = 2048, history: int = 65536,
                 gpu_slots: int = 1 << 20, warm_steps: int = 3, repeat: int = 20, seed: int = 0) -> dict:
    """One access batch on the device pipeline after warm-up batches (checked against the facade): eager and
    CUDA-graph times of access and access + commit from the same snapshot, the stages, references per second."""
    cpu_slots = num_requests * history - gpu_slots + 65536
    cache, addrs = build_cache(num_requests, history, gpu_slots, cpu_slots)
    sel = Selector(num_requests, history, top_k, q, seed=seed)
    for _ in range(warm_steps):  # age the buckets so hits come from several of them
        p = cache.access(to_addresses(addrs, sel.step()))
        cache.commit(p)
    dev = DevicePbLru(cache, num_requests * q * top_k)
    check = check_steps(cache, addrs, sel, dev, steps=2, decode_alloc=False)
    refs = to_addresses(addrs, sel.step())
    dev.load(cache)
    plan = cache.access(refs)
    dev.set_refs(refs)
    snap = dev.snapshot()
    out = {"num_refs": int(refs.size), "num_unique": plan.num_unique, "num_hits": plan.num_hits,
           "num_misses": plan.num_misses, "gpu_slots": gpu_slots, "logical_addresses": int(dev.marker.size) - 1,
           "check": check}
    out.update(_time_eager(dev, snap, plan, repeat))
    try:
        _time_graphs(dev, snap, plan, repeat, out)
    except Exception as exc:  # graph capture is an optimisation; report why it was not measured
        out["graph_error"] = f"{type(exc).__name__}: {exc}"
    out["stages_s"] = stage_times(dev, snap)
    best = out.get("graph_access_s", out["eager_access_s"])
    out["refs_per_s"] = out["num_refs"] / best
    return out


def _time_eager(dev, snap, plan, repeat: int) -> dict:
    """Access and access + commit launched eagerly from the snapshot. Restores are inside the timed function: timed
    alone and subtracted (they are plain D2D copies)."""
    def run_access():
        dev.restore(snap)
        dev.launch_access()

    def run_all():
        dev.restore(snap)
        dev.launch_access()
        dev.launch_commit()

    t_restore = time_gpu(lambda: dev.restore(snap), repeat=repeat)["median_s"]
    ta = time_gpu(run_access, repeat=repeat)
    tc = time_gpu(run_all, repeat=repeat)
    return {"eager_access_s": ta["median_s"] - t_restore, "eager_access_commit_s": tc["median_s"] - t_restore,
            "restore_s": t_restore, "device_matches_plan_in_timed_run": not compare_with_plan(dev.result(), plan)}


def _time_graphs(dev, snap, plan, repeat: int, out: dict) -> None:
    """Access and access + commit captured as CUDA graphs and replayed from the snapshot (median of `repeat`), and
    whether a graph replay's result matches the plan, into `out` (as each is measured)."""
    cp = cupy()
    stream = cp.cuda.Stream(non_blocking=True)
    graphs = {}
    for name, fn in (("access", lambda: dev.launch_access()),
                     ("access_commit", lambda: (dev.launch_access(), dev.launch_commit()))):
        with stream:
            dev.restore(snap)
            stream.synchronize()
            stream.begin_capture()
            fn()
            graphs[name] = stream.end_capture()
    for name, g in graphs.items():
        samples = []
        for _ in range(repeat):
            with stream:
                dev.restore(snap)
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            g.launch(stream)
            b.record(stream)
            b.synchronize()
            samples.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
        out[f"graph_{name}_s"] = float(np.median(samples))
    with stream:
        dev.restore(snap)
        graphs["access"].launch(stream)
    stream.synchronize()
    out["device_matches_plan_in_graph_run"] = not compare_with_plan(dev.result(), plan)


def stage_times(dev, snap, repeat: int = 5) -> dict:
    """GPU time of each pipeline stage: a spin kernel holds the GPU while the host enqueues the whole batch with
    events between stages, so event gaps are kernel time (plus the device-side launch gaps), not host time."""
    cp = cupy()
    acc: dict = {}
    for _ in range(repeat + 1):
        dev.restore(snap)
        cp.cuda.get_current_stream().synchronize()
        events = []

        def mark(stage):
            e = cp.cuda.Event()
            e.record()
            events.append((stage, e))

        spin(3_000_000)
        mark("start")
        dev.launch_access(mark=mark)
        events[-1][1].synchronize()
        for (_, a), (stage, b) in zip(events, events[1:]):
            acc.setdefault(stage, []).append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
    out = {k: float(np.median(v[1:])) for k, v in acc.items()}
    out["total"] = sum(out.values())
    return out
