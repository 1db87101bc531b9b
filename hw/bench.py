"""`ulacache hw bench`: the GPU figures of issue 5 in one JSON (device, date, command, figures).

- access: references/s of one 2M-reference pb-lru access batch on a 1M-slot pool (device pipeline, CUDA graph);
- exchange: scattered 656-B / 1152-B row exchange host->GPU against the measured copy ceiling (kernel variants);
- peer: scattered row gather from the peer GPU into a local buffer (x2 machines) against the P2P copy ceiling;
- management per decode step: the access batch time x access batches per step (61 indexer layers of
  DeepSeek-V3.2, 21 indexer groups of GLM-5.2).
"""
from __future__ import annotations

import json
from pathlib import Path

from hw.gpu import command_line, copy_ceilings, cupy, device_facts, launch_overhead_s, utc_now

TARGETS = {"access_batch_s": 200e-6, "exchange_656_gb_s": 45.0, "peer_gather_gb_s": 350.0}
BATCHES_PER_STEP = {"deepseek-v3.2": 61, "glm-5.2": 21}


def _best(rows, key, **match):
    sel = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return max(sel, key=lambda r: r[key]) if sel else None


def run(quick: bool = False, sections=("ceilings", "access", "exchange", "peer", "bulk")) -> dict:
    """The sections asked for, in order, into one result dict (`quick`: smaller sizes, for a smoke run)."""
    cp = cupy()
    res = {"date": utc_now(), "command": command_line(), "device": device_facts(), "targets": TARGETS}
    if "ceilings" in sections:
        res["ceilings"] = copy_ceilings(nbytes=(64 if quick else 256) << 20)
        res["launch"] = launch_overhead_s()
    if "access" in sections:
        _bench_access(res, quick)
    sizes = [2048, 16384] if quick else [2048, 16384, 131072]
    pools = (200_000, 100_000) if quick else (1_000_000, 500_000)  # host rows, GPU rows
    if "exchange" in sections:
        _bench_exchange(res, sizes, *pools)
    if "peer" in sections and cp.cuda.runtime.getDeviceCount() > 1:
        _bench_peer(res, sizes, *pools)
    if "bulk" in sections:  # v3 kernels last: a fault here cannot spoil the figures above
        _bench_bulk(res, sizes, *pools)
    return res


def _bench_access(res: dict, quick: bool) -> None:
    """The access batch (eager and graph) and what it costs per decode step of each model."""
    from hw import accessbench

    kw = dict(num_requests=16, history=8192, gpu_slots=1 << 16, top_k=512) if quick else {}
    acc = accessbench.bench_access(**kw)
    res["access"] = acc
    best = acc.get("graph_access_s", acc["eager_access_s"])
    res["management_per_decode_step_s"] = {m: best * n for m, n in BATCHES_PER_STEP.items()}


def _bench_exchange(res: dict, sizes: list[int], host_rows: int, gpu_rows: int) -> None:
    """The row exchange's variants, and the best of each at the largest size (and its share of the H2D ceiling)."""
    from hw import copybench

    variants = ("flat", "lines", "split", "split_read", "read_only")
    ex = []
    for rb in (656, 1152):
        ex += copybench.bench_exchange(rb, sizes, host_rows=host_rows, gpu_rows=gpu_rows, variants=variants,
                                       unrolls=(4,))
    res["exchange"] = ex
    ceil = res.get("ceilings", {}).get("h2d_gb_s")
    summ = {}
    for rb in (656, 1152):
        for v in variants:
            r = _best(ex, "h2d_gb_s", row_bytes=rb, variant=v, num_rows=sizes[-1])
            if r:
                summ[f"{rb}_{v}_gb_s"] = r["h2d_gb_s"]
                if ceil:
                    summ[f"{rb}_{v}_of_ceiling"] = r["h2d_gb_s"] / ceil
    res["exchange_summary"] = summ


def _bench_peer(res: dict, sizes: list[int], host_rows: int, gpu_rows: int) -> None:
    """The peer gather, pull and push, and the best at the largest size (and its share of the P2P ceiling)."""
    from hw import copybench

    ga = []
    for rb in (656, 1152):
        for mode in ("pull", "push"):
            ga += copybench.bench_gather(rb, sizes, src_rows=host_rows, dst_rows=gpu_rows, mode=mode, unrolls=(4,))
    res["peer"] = ga
    ceil = res.get("ceilings", {}).get("p2p_gb_s")
    summ = {}
    for rb in (656, 1152):
        r = _best(ga, "gb_s", row_bytes=rb, num_rows=sizes[-1])
        if r:
            summ[f"{rb}_gb_s"], summ[f"{rb}_mode"] = r["gb_s"], r["mode"]
            if ceil:
                summ[f"{rb}_of_ceiling"] = r["gb_s"] / ceil
    res["peer_summary"] = summ


def _bench_bulk(res: dict, sizes: list[int], host_rows: int, gpu_rows: int) -> None:
    """The v3 kernels (bulk copy engine) on the host link and between GPUs, added to the exchange and peer rows;
    a fault becomes a line of `errors`."""
    from hw import copybench

    cp = cupy()
    ex, ga = res.setdefault("exchange", []), res.setdefault("peer", [])
    try:  # v3 on the host link: bulk copy engine reading pinned host rows (reads only, like read_only)
        for rb in (656, 1152):
            for r in copybench.bench_gather(rb, sizes, src_rows=host_rows, dst_rows=gpu_rows, mode="h2d", bulk=True):
                ex.append({"row_bytes": rb, "num_rows": r["num_rows"], "variant": "read_only_bulk", "unroll": 0,
                           "time_s": r["time_s"], "time_p90_s": r["time_p90_s"], "h2d_gb_s": r["gb_s"]})
    except Exception as exc:
        res.setdefault("errors", []).append(f"bulk h2d: {type(exc).__name__}: {exc}")
    if cp.cuda.runtime.getDeviceCount() > 1:
        for rb in (656, 1152):
            try:  # v3: bulk copy engine (pull)
                ga += copybench.bench_gather(rb, sizes, src_rows=host_rows, dst_rows=gpu_rows, mode="pull",
                                             bulk=True)
            except Exception as exc:
                res.setdefault("errors", []).append(f"bulk gather {rb}: {type(exc).__name__}: {exc}")
    for rb in (656, 1152):
        for kind, rows, key in (("exchange", ex, "h2d_gb_s"), ("peer", ga, "gb_s")):
            r = _best([x for x in rows if "bulk" in str(x.get("variant", x.get("mode")))], key, row_bytes=rb,
                      num_rows=sizes[-1])
            if r:
                res.setdefault(f"{kind}_summary", {})[f"{rb}_bulk_gb_s"] = r[key]


def summary_lines(res: dict) -> list[str]:
    out = [f"device: {res['device'].get('gpu')} x{res['device'].get('num_gpus')}  date: {res['date']}"]
    if "ceilings" in res:
        c = res["ceilings"]
        out.append("ceilings GB/s: " + ", ".join(f"{k}={v:.1f}" for k, v in c.items() if k.endswith("gb_s")))
    if "access" in res:
        a = res["access"]
        best = a.get("graph_access_s", a["eager_access_s"])
        out.append(f"access batch: {a['num_refs']} refs, {a['num_unique']} unique, {a['num_misses']} misses: "
                   f"{best * 1e6:.1f} us ({a['refs_per_s'] / 1e9:.2f} B refs/s; target <= 200 us); "
                   f"matches facade: {a.get('device_matches_plan_in_graph_run', a['device_matches_plan_in_timed_run'])}")
    for k, v in res.get("exchange_summary", {}).items():
        if k.endswith("gb_s"):
            out.append(f"exchange {k}: {v:.1f}")
    for k, v in res.get("peer_summary", {}).items():
        if k.endswith("gb_s"):
            out.append(f"peer gather {k}: {v:.1f} ({res['peer_summary'].get(k.replace('gb_s', 'mode'))})")
    return out


def main(args) -> int:
    sections = tuple(args.sections.split(",")) if args.sections else ("ceilings", "access", "exchange", "peer", "bulk")
    res = run(quick=args.quick, sections=sections)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=float))
    for line in summary_lines(res):
        print(line)
    print(f"wrote {out}")
    return 0
