"""First-call probe (row-mover variants, ceilings, cupy primitive costs); produced hw/results/probe_v1.json.

Run on the device: `python3 -m hw.probe OUT.json`. Prints a short table and writes all figures as JSON; the
figures feed hw/NOTES.md (which kernel variant to keep, and what the access pipeline can afford).
"""
from __future__ import annotations

import json
import sys

import numpy as np

from hw import copybench
from hw.gpu import copy_ceilings, cupy, device_facts, launch_overhead_s, time_gpu, utc_now


def primitive_costs() -> dict:
    """Costs of candidate building blocks for a 2M-reference access batch over a 16M logical space."""
    cp = cupy()
    rng = np.random.default_rng(0)
    n, space = 256 * 4 * 2048, 16 << 20
    refs = cp.asarray(rng.integers(0, space, size=n, dtype=np.int64))
    flags = cp.zeros(space, dtype=cp.uint8)
    out = {}
    out["sort_2m_int64_s"] = time_gpu(lambda: cp.sort(refs))["median_s"]
    refs32 = refs.astype(cp.int32)
    out["sort_2m_int32_s"] = time_gpu(lambda: cp.sort(refs32))["median_s"]

    def mark():
        flags[refs] = 1

    out["scatter_flags_2m_s"] = time_gpu(mark)["median_s"]
    out["flatnonzero_16m_s"] = time_gpu(lambda: cp.flatnonzero(flags))["median_s"]
    out["cumsum_2m_int32_s"] = time_gpu(lambda: cp.cumsum(refs32))["median_s"]
    table = cp.asarray(rng.integers(0, 1 << 20, size=space, dtype=np.int64))
    out["take_2m_from_16m_s"] = time_gpu(lambda: table[refs])["median_s"]
    return out


def main(path: str) -> int:
    res = {"date": utc_now(), "command": " ".join(sys.argv), "device": device_facts()}
    res["ceilings"] = copy_ceilings()
    res["launch"] = launch_overhead_s()
    print("ceilings", res["ceilings"], res["launch"], flush=True)
    res["correct"] = {f"{rb}_{v}": copybench.check_exchange_correct(rb, 5000, host_rows=100_000, gpu_rows=50_000,
                                                                    variant=v)
                      for rb in (656, 1152, 96) for v in ("flat", "lines")}
    print("correct", res["correct"], flush=True)
    sizes = [256, 2048, 16384, 131072]
    ex = []
    for rb in (656, 1152):
        ex += copybench.bench_exchange(rb, sizes, host_rows=1_000_000, gpu_rows=500_000, variants=("flat", "lines"),
                                       unrolls=(4, 8))
        ex += copybench.bench_exchange(rb, [131072], host_rows=1_000_000, gpu_rows=500_000,
                                       variants=("read_only",), unrolls=(8,))
    res["exchange"] = ex
    ga = []
    for rb in (656, 1152):
        ga += copybench.bench_gather(rb, sizes, src_rows=1_000_000, dst_rows=500_000, mode="local", unrolls=(8,))
        if cupy().cuda.runtime.getDeviceCount() > 1:
            for mode in ("pull", "push"):
                ga += copybench.bench_gather(rb, sizes, src_rows=1_000_000, dst_rows=500_000, mode=mode,
                                             unrolls=(4, 8))
    res["gather"] = ga
    res["primitives"] = primitive_costs()
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    for r in ex:
        print(f"exch {r['row_bytes']:5d} n={r['num_rows']:7d} {r['variant']:9s} u={r['unroll']} "
              f"{r['time_s'] * 1e6:9.1f} us {r['h2d_gb_s']:6.1f} GB/s")
    for r in ga:
        print(f"gath {r['row_bytes']:5d} n={r['num_rows']:7d} {r['mode']:5s} u={r['unroll']} "
              f"{r['time_s'] * 1e6:9.1f} us {r['gb_s']:6.1f} GB/s")
    print("primitives", {k: round(v * 1e6, 1) for k, v in res["primitives"].items()}, "(us)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "probe.json"))
