"""Kernel launch overheads eager vs inside a CUDA graph (the decode step's fixed costs, sim/COSTS.md).

Measures on the local GPU with cupy: (a) an empty kernel launched eagerly back to back, (b) the same kernels captured
in one CUDA graph and replayed (per-kernel cost inside a graph), (c) a one-kernel graph (graph launch cost), and
(d) a small real kernel (one 4 KB copy, 1 block) eager vs in a graph. Prints and writes JSON with date, command,
machine and load. Usage: python bench/graph_launch.py --out graph_launch.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--kernels", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    import cupy as cp

    empty = cp.RawKernel(r'extern "C" __global__ void empty(int* p) { if (p[0] == 12345) p[0] = 0; }', "empty")
    copy = cp.RawKernel(r'''extern "C" __global__ void copy(const float4* a, float4* b, int n) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) b[i] = a[i]; }''', "copy")
    flag = cp.zeros(1, dtype=cp.int32)
    src = cp.ones(256 * 4, dtype=cp.float32)
    dst = cp.zeros_like(src)
    stream = cp.cuda.Stream(non_blocking=True)
    n = args.kernels

    def launch_all(kind: str, count: int):
        for _ in range(count):
            if kind == "empty":
                empty((1,), (32,), (flag,))
            else:
                copy((1,), (128,), (src, dst, cp.int32(256)))

    def timed(fn) -> float:
        best = []
        for _ in range(args.repeats):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            best.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
        best.sort()
        return best[len(best) // 2]

    out = {}
    with stream:
        for kind in ("empty", "copy"):
            launch_all(kind, 50)
            stream.synchronize()
            eager = timed(lambda: launch_all(kind, n))
            stream.begin_capture()
            launch_all(kind, n)
            graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
            replay = timed(lambda: graph.launch(stream))
            stream.begin_capture()
            launch_all(kind, 1)
            one = stream.end_capture()
            one.launch(stream)
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                one.launch(stream)
            stream.synchronize()
            one_wall = (time.perf_counter() - t0) / 200
            one_gpu = timed(lambda: one.launch(stream))
            out[kind] = {"eager_per_kernel_s": eager / n, "graph_per_kernel_s": replay / n,
                         "one_kernel_graph_gpu_s": one_gpu, "one_kernel_graph_wall_s": one_wall}
    dev = cp.cuda.runtime.getDeviceProperties(0)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join([sys.executable] + sys.argv),
        "machine": {"host": platform.node(), "gpu": dev["name"].decode(), "cupy": cp.__version__,
                    "cuda_runtime": cp.cuda.runtime.runtimeGetVersion()},
        "load": os.getloadavg(), "kernels_per_graph": n, "repeats": args.repeats, "median_of_repeats": True,
        "results": out,
    }
    print(json.dumps(result, indent=2))
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
