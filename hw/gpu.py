"""GPU measurement helpers: device facts, event timing, copy ceilings. cupy is imported inside functions only."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import statistics
import sys


def cupy():
    import cupy as cp

    return cp


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_line() -> str:
    """The command as a user types it (`ulacache hw ...` or `python3 -m hw ...`)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0.endswith("ulacache"):
        return " ".join(["ulacache", *sys.argv[1:]])
    if argv0.endswith("__main__.py"):
        return " ".join(["python3 -m hw", *sys.argv[1:]])
    return " ".join(sys.argv)


def source_digest() -> str:
    """sha1 of the kernel sources, the device pipeline and hw/: identifies the code that produced a figure without git."""
    import hashlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    backends = root / "ulacache" / "backends"
    files = (sorted((backends / "kernels").glob("*.cu")) + [backends / "cupy_pipeline.py", backends / "cupy_copy.py"]
             + sorted((root / "hw").glob("*.py")) + sorted((root / "hw").glob("*.cu")))
    h = hashlib.sha1()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def device_facts() -> dict:
    """What machine the figures come from (name, count, driver/runtime versions, host)."""
    cp = cupy()
    rt = cp.cuda.runtime
    n = rt.getDeviceCount()
    props = rt.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    facts = {
        "gpu": name,
        "num_gpus": n,
        "sm_count": int(props["multiProcessorCount"]),
        "l2_bytes": int(props["l2CacheSize"]),
        "gpu_memory_bytes": int(props["totalGlobalMem"]),
        "driver_version": rt.driverGetVersion(),
        "runtime_version": rt.runtimeGetVersion(),
        "cupy_version": cp.__version__,
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "source_digest": source_digest(),
    }
    if n > 1:
        facts["peer_access_0_1"] = bool(rt.deviceCanAccessPeer(0, 1))
    try:
        import torch

        facts["torch_version"] = torch.__version__
    except Exception:  # torch is optional on the device host
        pass
    return facts


def summarize(samples_s: list[float]) -> dict:
    s = sorted(samples_s)
    q = lambda p: s[min(len(s) - 1, int(round(p * (len(s) - 1))))]
    return {"median_s": statistics.median(s), "p10_s": q(0.1), "p90_s": q(0.9), "min_s": s[0], "n": len(s)}


def time_gpu(fn, *, warmup: int = 3, repeat: int = 20, stream=None, inner: int = 1) -> dict:
    """Median / p10 / p90 device time of `fn()` measured with CUDA events on `stream` (after warm-up); with
    inner > 1 each sample runs fn `inner` times back to back (keeps the GPU queue full: no host launch gaps)."""
    cp = cupy()
    stream = stream or cp.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    samples = []
    for _ in range(repeat):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        for _ in range(inner):
            fn()
        b.record(stream)
        b.synchronize()
        samples.append(cp.cuda.get_elapsed_time(a, b) * 1e-3 / inner)
    return summarize(samples)


def enable_peer_access(num_gpus: int) -> None:
    cp = cupy()
    for i in range(num_gpus):
        with cp.cuda.Device(i):
            for j in range(num_gpus):
                if i != j and cp.cuda.runtime.deviceCanAccessPeer(i, j):
                    try:
                        cp.cuda.runtime.deviceEnablePeerAccess(j)
                    except cp.cuda.runtime.CUDARuntimeError as exc:  # already enabled
                        if "PeerAccessAlreadyEnabled" not in str(exc):
                            raise


def copy_ceilings(nbytes: int = 256 << 20, repeat: int = 10) -> dict:
    """Large contiguous cudaMemcpyAsync bandwidths (GB/s, 1e9 B/s): H2D, D2H, D2D (read+write) and P2P if 2 GPUs."""
    cp = cupy()
    rt = cp.cuda.runtime
    out = {}
    host = cp.cuda.alloc_pinned_memory(nbytes)
    dev = cp.empty(nbytes, dtype=cp.uint8)
    dev2 = cp.empty(nbytes, dtype=cp.uint8)
    dev.fill(7)
    s = cp.cuda.get_current_stream()
    h2d = lambda: rt.memcpyAsync(dev.data.ptr, host.ptr, nbytes, rt.memcpyHostToDevice, s.ptr)
    d2h = lambda: rt.memcpyAsync(host.ptr, dev.data.ptr, nbytes, rt.memcpyDeviceToHost, s.ptr)
    d2d = lambda: rt.memcpyAsync(dev2.data.ptr, dev.data.ptr, nbytes, rt.memcpyDeviceToDevice, s.ptr)
    out["h2d_gb_s"] = nbytes / time_gpu(h2d, repeat=repeat)["median_s"] / 1e9
    out["d2h_gb_s"] = nbytes / time_gpu(d2h, repeat=repeat)["median_s"] / 1e9
    out["d2d_rw_gb_s"] = 2 * nbytes / time_gpu(d2d, repeat=repeat)["median_s"] / 1e9
    # Small-copy latency: one 4 KiB H2D memcpy, and an empty kernel launch.
    small = lambda: rt.memcpyAsync(dev.data.ptr, host.ptr, 4096, rt.memcpyHostToDevice, s.ptr)
    out["h2d_4k_latency_s"] = time_gpu(small, repeat=50)["median_s"]
    if rt.getDeviceCount() > 1:
        enable_peer_access(2)
        with cp.cuda.Device(1):
            peer = cp.empty(nbytes, dtype=cp.uint8)
            peer.fill(3)
        p2p = lambda: rt.memcpyPeerAsync(dev2.data.ptr, 0, peer.data.ptr, 1, nbytes, s.ptr)
        out["p2p_gb_s"] = nbytes / time_gpu(p2p, repeat=repeat)["median_s"] / 1e9
    out["bytes"] = nbytes
    return out


def launch_overhead_s(repeat: int = 200) -> dict:
    """Host-side cost of launching one empty kernel, and the device-side gap of back-to-back empty kernels."""
    import time

    cp = cupy()
    k = cp.RawKernel('extern "C" __global__ void nop() {}', "nop")
    k((1,), (32,), ())
    cp.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        k((1,), (32,), ())
    host_s = (time.perf_counter() - t0) / repeat
    cp.cuda.get_current_stream().synchronize()

    def many():
        for _ in range(100):
            k((1,), (32,), ())

    dev = time_gpu(many, repeat=10)["median_s"] / 100
    return {"launch_host_s": host_s, "launch_device_gap_s": dev}
