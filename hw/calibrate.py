"""`ulacache hw calibrate`: measure the cost-model keys of `sim.costs.CostModel` on this GPU host and write the
calibration YAML (`provenance:` + `costs:`) that `ulacache replay --calibration FILE` reads.

Measured: launch overhead; HBM efficiency (D2D copy); management cost of the device pb-lru pipeline per reference,
per distinct reference and per miss (graph-replayed access + commit on batches of several shapes); PCIe H2D / D2H
and NVLink latency and row efficiency by transfer size and row size, with the row movers the pipeline uses (H2D:
exchange into free slots, reads only; D2H: the fused swap exchange, whose write-back direction is the slower one;
peer: pull gather from the other GPU). With several GPUs, the node model (sim/hardware.py): every exchange kind with
k = 1..N GPUs at once, host-side caps fitted on them (hw/nodefit.py), the peer gather with all ranks fetching
from all peers at once, and the extra fixed time of peer gathers right after an exchange (k = 2..N); the single-GPU
file keeps one GPU's figures alone.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from hw.fit import fit_latency_bandwidth, fit_nonnegative
from hw.gpu import command_line, copy_ceilings, cupy, device_facts, launch_overhead_s, time_gpu, utc_now

ROW_SIZES = (128, 256, 656, 1152, 2048)
LINK_ROWS = (256, 1024, 4096, 16384, 65536, 131072)


def measure_management(shapes, history: int = 32768, gpu_slots: int = 1 << 20, seed: int = 0) -> list[dict]:
    """(refs, unique, misses, graph time of access + commit) for batches of the given (requests, q, top_k)."""
    from hw.workload import Selector, build_cache, to_addresses
    from ulacache.backends.cupy_pipeline import DevicePbLru

    cp = cupy()
    max_req = max(s[0] for s in shapes)
    cache, addrs = build_cache(max_req, history, gpu_slots, max_req * history - gpu_slots + 65536)
    sel = Selector(max_req, history, 2048, 4, seed=seed)
    out = []
    stream = cp.cuda.Stream(non_blocking=True)
    for step, (nreq, q, top_k) in enumerate(shapes):
        pos = sel.step()[:nreq, :q, :top_k]
        refs = to_addresses(addrs[:nreq], pos)
        dev = DevicePbLru(cache, refs.size)
        dev.load(cache)
        plan = cache.access(refs)
        dev.set_refs(refs)
        snap = dev.snapshot()
        with stream:
            stream.begin_capture()
            dev.launch_access()
            dev.launch_commit()
            graph = stream.end_capture()

        def run(graph=graph):
            graph.launch(stream)

        samples = []
        for _ in range(7):
            with stream:
                dev.restore(snap)
            samples.append(time_gpu(run, warmup=0, repeat=1, stream=stream)["median_s"])
        cache.commit(plan)
        out.append({"num_requests": nreq, "q": q, "top_k": top_k, "num_refs": plan.num_refs,
                    "num_unique": plan.num_unique, "num_misses": plan.num_misses,
                    "time_s": float(np.median(samples[1:]))})
    return out


def measure_links(ceil: dict, quick: bool, num_gpus: int = 1) -> dict:
    """One GPU transferring alone. PCIe figures are measured on every GPU in turn and the slowest GPU's time is kept
    (a step waits for its slowest rank); the per-GPU times stay in `by_gpu`. Peer: GPU 0 pulls from GPU 1."""
    from hw import copybench

    cp = cupy()
    rows = LINK_ROWS[:3] if quick else LINK_ROWS
    host_rows, gpu_rows = (200_000, 100_000) if quick else (400_000, 200_000)
    res = {"h2d": [], "d2h": [], "peer": [], "by_gpu": []}
    for rb in ROW_SIZES:
        hr = min(host_rows, (512 << 20) // rb)
        gr = min(gpu_rows, hr // 2)
        sizes = [n for n in rows if n <= gr]
        for kind, variant in (("h2d", "read_only"), ("d2h", "flat")):
            per_gpu = []
            for g in range(num_gpus):
                with cp.cuda.Device(g):
                    pts = copybench.bench_exchange(rb, sizes, host_rows=hr, gpu_rows=gr, variants=(variant,),
                                                   repeat=9)
                per_gpu.append(pts)
                res["by_gpu"] += [{**p, "kind": kind, "gpu": g} for p in pts]
            res[kind] += [max(pts, key=lambda p: p["time_s"]) for pts in zip(*per_gpu)]
        if "p2p_gb_s" in ceil:
            res["peer"] += copybench.bench_gather(rb, sizes, src_rows=hr, dst_rows=gr, mode="pull", unrolls=(4,),
                                                  repeat=9)
    return res


FIT_MIN_ROWS = 4096  # fit transfers of 4096+ rows: per-step exchanges are this size; smaller ones are latency-bound
NODE_ROW_SIZES = (656, 1152)
NODE_OPS = ("read_only", "swap", "split")


def measure_node(num_gpus: int, quick: bool) -> dict:
    """Concurrent links: for k = 1..N GPUs exchanging at once, each GPU's host<->GPU time (read-only, fused swap,
    split; 656 and 1152-B rows); for all N ranks fetching from all peers at once, each rank's NVLink gather (every
    row size, for the node-regime peer efficiency table)."""
    from hw import copybench

    res = {"exchange": [], "peer_all": []}
    big = (16384, 65536) if quick else (32768, 131072)
    for rb in NODE_ROW_SIZES:
        hr = min(200_000 if quick else 800_000, (512 << 20) // rb)
        gr = min(100_000 if quick else 200_000, hr // 2)
        for op in NODE_OPS:
            for k in range(1, num_gpus + 1):
                res["exchange"] += copybench.bench_node(rb, [n for n in big if n <= gr], gpus=list(range(k)), op=op,
                                                        host_rows=hr, gpu_rows=gr)
    rows = [n for n in (LINK_ROWS[:3] if quick else LINK_ROWS) if n >= (1024 if quick else FIT_MIN_ROWS)]
    for rb in ROW_SIZES:
        hr = min(200_000 if quick else 800_000, (512 << 20) // rb)
        gr = min(100_000 if quick else 200_000, hr // 2)
        res["peer_all"] += copybench.bench_node(rb, [n for n in rows if n <= gr], gpus=list(range(num_gpus)),
                                                op="peer_all", host_rows=hr, gpu_rows=gr)
    res["gather_after_exchange"] = measure_gather_after_exchange(num_gpus, quick)
    return res


def measure_gather_after_exchange(num_gpus: int, quick: bool) -> list[dict]:
    """k = 2..N GPUs: peer gathers right after every GPU's swap exchange vs the same gathers warm (TP's order: a rank
    gathers the rows its peers just promoted). On 2 H200s such gathers in `hw validate` took ~100 us more than the
    warm all-to-all microbenchmark predicts (hw/NOTES.md); this measures it for the fit."""
    from hw import copybench

    out = []
    for rb in NODE_ROW_SIZES:
        hr = min(200_000 if quick else 800_000, (512 << 20) // rb)
        gr = min(100_000 if quick else 200_000, hr // 2)
        out += copybench.bench_gather_after_exchange(rb, [1024, 4096] if quick else [4096, 16384, 65536],
                                                     gpus=list(range(num_gpus)),
                                                     exchange_sizes=[8192] if quick else [16384, 65536],
                                                     host_rows=hr, gpu_rows=gr)
    return out


def link_costs(links: dict, ceil: dict, min_rows: int) -> tuple[dict, dict]:
    """Cost keys (bandwidths = measured copy ceilings, efficiency and latency fitted per row size) from link rows."""
    costs, fits = {}, {}
    for kind, key_bw, bw in (("h2d", "pcie_h2d_bw_bytes_s", ceil["h2d_gb_s"] * 1e9),
                             ("d2h", "pcie_d2h_bw_bytes_s", ceil["d2h_gb_s"] * 1e9),
                             ("peer", "nvlink_bw_bytes_s", ceil.get("p2p_gb_s", 0) * 1e9)):
        rows = [r for r in links.get(kind, []) if r["num_rows"] >= min_rows]
        if not rows or bw <= 0:
            continue
        costs[key_bw] = bw
        table = {}
        for rb in ROW_SIZES:
            pts = [r for r in rows if r["row_bytes"] == rb]
            if len(pts) >= 2:
                f = fit_latency_bandwidth([p["num_rows"] for p in pts], [p["time_s"] for p in pts], rb, bw)
                fits[f"{kind}_{rb}"] = f
                table[rb] = round(f["efficiency"], 4)
        costs[f"{kind}_row_efficiency_by_bytes"] = table
        if 656 in table:
            costs[f"{kind}_row_efficiency"] = table[656]
    lat = [fits[k]["latency_s"] for k in fits if k in ("h2d_656", "d2h_656")]
    if lat:
        costs["pcie_latency_s"] = float(np.mean(lat))
    if "peer_656" in fits:
        costs["nvlink_latency_s"] = fits["peer_656"]["latency_s"]
    return costs, fits


def measure(quick: bool = False) -> dict:
    """Every raw measurement `derive` needs (run on the GPU host)."""
    raw = {"date": utc_now(), "command": command_line(), "device": device_facts(), "quick": bool(quick)}
    ceil = copy_ceilings(nbytes=(64 if quick else 256) << 20)
    raw["ceilings"], raw["launch"] = ceil, launch_overhead_s()
    ngpu = raw["device"]["num_gpus"]
    raw["links"] = measure_links(ceil, quick, ngpu)
    if ngpu > 1:
        raw["node"] = measure_node(ngpu, quick)
    shapes = ([(16, 1, 512), (16, 4, 512), (64, 4, 512)] if quick else
              [(16, 1, 2048), (32, 4, 2048), (64, 1, 2048), (64, 4, 2048), (128, 2, 2048), (128, 4, 2048),
               (256, 1, 2048), (256, 4, 2048)])
    raw["management"] = measure_management(shapes, history=8192 if quick else 32768,
                                           gpu_slots=(1 << 17) if quick else 1 << 20)
    return raw


def derive(raw: dict) -> tuple[dict, dict | None]:
    """(calibration for the simulator, single-GPU calibration or None) from raw measurements (no GPU needed; adds
    the fits to `raw`). With several GPUs the first is the node model: per-link PCIe figures of one GPU alone,
    host-side caps fitted on k = 1..N GPUs at once, peer figures of all ranks gathering at once."""
    from sim.presets import HARDWARE_PRESETS

    ceil, ngpu = raw["ceilings"], raw["device"]["num_gpus"]
    base = {"launch_s": raw["launch"]["launch_device_gap_s"]}
    base["hbm_efficiency"] = min(1.0, ceil["d2d_rw_gb_s"] * 1e9 / HARDWARE_PRESETS["h200"].hbm_bw_bytes_s)
    min_rows = 1024 if raw.get("quick") else FIT_MIN_ROWS
    single_links, raw["link_fits"] = link_costs(raw["links"], ceil, min_rows)
    multi_links = None
    if "node" in raw:
        from hw.nodefit import fit_host_caps

        peer, raw["link_fits_peer_all"] = link_costs({"peer": raw["node"]["peer_all"]}, ceil, min_rows)
        multi_links = {**single_links, **peer}
        fit = fit_host_caps({**multi_links, "nvlink_bw_bytes_s": ceil["p2p_gb_s"] * 1e9}, raw["node"]["exchange"])
        raw["node_fit"] = fit
        multi_links.update({k: v for k, v in fit["caps"].items() if v})
        gae = raw["node"].get("gather_after_exchange")
        if gae:  # raw data before 2026-12-01 03:40 UTC did not measure it: the key stays the default (0)
            from hw.nodefit import AFTER_EXCHANGE_KEY, fit_peer_after_exchange

            raw["peer_after_exchange_fit"] = fit_peer_after_exchange(gae)
            multi_links[AFTER_EXCHANGE_KEY] = raw["peer_after_exchange_fit"][AFTER_EXCHANGE_KEY]
    mg = raw["management"]
    X = [[1.0, m["num_refs"], m["num_unique"], m["num_misses"]] for m in mg]
    f = fit_nonnegative(X, [m["time_s"] for m in mg], ["const_s", "per_ref_s", "per_unique_s", "per_miss_s"])
    raw["management_fit"] = f
    base["mgmt_kernels"] = f["const_s"] / base["launch_s"]
    base["mgmt_per_ref_s"], base["mgmt_per_unique_s"] = f["per_ref_s"], f["per_unique_s"]
    base["mgmt_per_miss_s"] = f["per_miss_s"]

    def calib(links: dict, regime: str) -> dict:
        costs = {k: (v if isinstance(v, dict) else float(v)) for k, v in {**base, **links}.items()}
        prov = {"device": f"{raw['device']['gpu']} x{ngpu}", "date": raw["date"], "command": raw["command"],
                "source_digest": raw["device"]["source_digest"], "links": regime,
                "note": "management = device pb-lru pipeline (access + commit, CUDA graph, per GPU); h2d = exchange "
                        "into free slots (reads); d2h = fused swap exchange (its write-back direction is the slower "
                        f"one); peer = pull gather; link latency/efficiency fitted on {min_rows}+ rows"}
        if raw.get("derived"):
            prov["derived"] = raw["derived"]
        return {"provenance": prov, "costs": costs}

    single = calib(single_links, "one GPU transferring alone (slowest of the GPUs)")
    if multi_links is None:
        return single, None
    caps = {k: v for k, v in raw["node_fit"]["caps"].items() if v}
    regime = (f"node model: PCIe per-link figures of one GPU alone, host-side caps {caps or 'none'} (128-B line "
              f"bytes/s) fitted on 1..{ngpu} GPUs exchanging at once (median error "
              f"{raw['node_fit']['median_rel_err']:.3f}); peer = all {ngpu} ranks gathering from all peers at once")
    gf = raw.get("peer_after_exchange_fit")
    regime += (f"; peer gathers after an exchange: +{gf['peer_after_exchange_latency_s'] * 1e6:.1f} us per home rank "
               f"(gathers right after every GPU's swap exchange minus the same gathers warm, k = 2..{ngpu}; fit "
               f"median error {gf['median_rel_err']:.3f})" if gf else
               "; peer_after_exchange_latency_s NOT MEASURED (this raw data predates the gather-after-exchange "
               "measurement): the default 0 applies, so TP gathers that follow an exchange are under-predicted "
               "(hw/NOTES.md: ~80-100 us per gather on 2 H200s, seen in validation diagnostics only)")
    return calib(multi_links, regime), single


def add_hisparse(calib: dict, path: str) -> None:
    """Merge the HiSparse swap-in keys measured by `hw hisparse` (its JSON) into a calibration: every key per swap-in
    call, CUDA-graph replayed behind a busy stream (hw/hisparse_graph.py). Keys the simulator does not know yet end
    under provenance.pending_costs (write_accepted)."""
    res = json.loads(Path(path).read_text())
    if "costs" not in res:  # a run cut short saves what it measured (hisparse_bench.run), but derives no costs
        raise ValueError(f"{path}: an incomplete `hw hisparse` run (complete: {res.get('complete')}): no costs to merge")
    costs = {k: ({int(b): float(e) for b, e in v.items()} if k.endswith("_by_batch") else v)  # JSON keys are strings
             for k, v in res["costs"].items()}
    calib["costs"].update(costs)
    calib["provenance"]["hisparse"] = {"from": str(path), "date": res["date"], "command": res["command"],
                                       "device": res["device"].get("gpu", "?"),
                                       "timing": res.get("timing", "eager launch on an idle GPU (before issue 26)"),
                                       "source_digest": res["device"]["source_digest"]}


def merge_hisparse(cal_path: str, json_path: str) -> list[str]:
    """Update only the HiSparse keys (and provenance.hisparse) of an existing calibration YAML from a `hw hisparse`
    JSON, leaving every other key as it is. Returns the keys moved to provenance.pending_costs."""
    path = Path(cal_path)
    data = yaml.safe_load(path.read_text())
    add_hisparse(data, json_path)
    return write_accepted(path, data)


def write_accepted(path: Path, data: dict) -> list[str]:
    """Write the calibration; keys the simulator's cost model does not know (yet) move to provenance.pending_costs
    so the file still loads. Returns the moved keys."""
    import re

    from sim.costs import CostModel

    moved = []
    while True:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        try:
            CostModel.load("h200", "glm-5", calibration=path)
            return moved
        except ValueError as exc:
            m = re.search(r"unknown cost key '([^']+)'", str(exc))
            if not m or m.group(1) not in data["costs"]:
                raise
            data["provenance"].setdefault("pending_costs", {})[m.group(1)] = data["costs"].pop(m.group(1))
            moved.append(m.group(1))


def main(args) -> int:
    if getattr(args, "from_json", ""):  # re-derive from earlier raw measurements (no GPU)
        raw = json.loads(Path(args.from_json).read_text())
        raw["derived"] = {"from": str(args.from_json), "date": utc_now(), "command": command_line()}
    else:
        raw = measure(quick=args.quick)
    calib, single = derive(raw)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [(out, calib)]
    if single is not None:
        paths.append((out.with_name(out.stem + "_single_gpu" + out.suffix), single))
    for path, data in paths:
        if getattr(args, "hisparse_json", ""):
            add_hisparse(data, args.hisparse_json)
        moved = write_accepted(path, data)
        if moved:
            print(f"{path}: keys not in the cost model yet, kept under provenance.pending_costs: {moved}")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1, default=float))
    for k, v in calib["costs"].items():
        print(f"{k}: {v}")
    print(f"management fit: median rel err {raw['management_fit']['median_rel_err']:.3f}")
    if "peer_after_exchange_fit" in raw:
        g = raw["peer_after_exchange_fit"]
        print(f"peer gather after an exchange: +{g['peer_after_exchange_latency_s'] * 1e6:.1f} us per home rank "
              f"(IQR {g['extra_iqr_s'][0] * 1e6:.1f}-{g['extra_iqr_s'][1] * 1e6:.1f}); by GPUs "
              + ", ".join(f"k={k}: {v * 1e6:.1f}" for k, v in g["by_num_gpus"].items()) + "; by rows "
              + ", ".join(f"{n}: {v * 1e6:.1f}" for n, v in g["by_num_rows"].items()))
    elif "node" in raw:
        print("peer gather after an exchange: not in this raw data (peer_after_exchange_latency_s stays 0)")
    if "node_fit" in raw:
        f = raw["node_fit"]
        print(f"node model: caps {f['caps']}, median rel err {f['median_rel_err']:.3f} (max {f['max_rel_err']:.3f})")
        for p in raw["node"]["exchange"] + raw["node"]["peer_all"]:
            if p["row_bytes"] in NODE_ROW_SIZES and p["num_rows"] >= 32768:
                print(f"  {p['op']:9s} k={p['num_gpus']} {p['row_bytes']}B {p['num_rows']:6d} rows: "
                      + " ".join(f"{x:.1f}" for x in p["gb_s_by_gpu"]) + " GB/s per GPU")
    print("wrote " + ", ".join(str(p) for p, _ in paths))
    return 0
