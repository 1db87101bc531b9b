"""Scattered-row copy benchmarks on the GPU: host<->GPU exchange, peer gather, local gather.

Each point draws fresh random distinct slots and rotates among several index sets so the 60 MB L2 cannot serve
repeats. Bandwidths are 1e9 B/s of payload rows moved in the named direction (an exchange with victims moves the same
bytes back the other way at the same time).
"""
from __future__ import annotations

import numpy as np

from hw.gpu import cupy, enable_peer_access, time_gpu

NUM_SETS = 4


def _index_sets(rng, pool_rows: int, n: int, sets: int = NUM_SETS):
    cp = cupy()
    return [cp.asarray(rng.choice(pool_rows, size=n, replace=False).astype(np.int64)) for _ in range(sets)]


def _rotating(fn_of_set, sets: int = NUM_SETS):
    state = {"i": 0}

    def fn():
        fn_of_set(state["i"] % sets)
        state["i"] += 1

    return fn


def bench_exchange(row_bytes: int, sizes: list[int], *, host_rows: int, gpu_rows: int, variants=("flat",),
                   unrolls=(8,), victims: bool = True, seed: int = 0, repeat: int = 20) -> list[dict]:
    """Swap-in exchange host->GPU of `n` scattered rows for each n in sizes (time, GB/s)."""
    from ulacache.backends.cupy_copy import HostPool, exchange_rows

    cp = cupy()
    rng = np.random.default_rng(seed)
    host = HostPool(host_rows, row_bytes)
    host.array[:] = rng.integers(0, 255, size=host.array.shape, dtype=np.uint8)
    gpu = cp.asarray(rng.integers(0, 255, size=(gpu_rows, row_bytes), dtype=np.uint8))
    out = []
    for n in sizes:
        hs, gs = _index_sets(rng, host_rows, n), _index_sets(rng, gpu_rows, n)
        vic = cp.full(n, 1 if victims else 0, dtype=cp.uint8)
        for variant in variants:
            for u in unrolls:
                fn = _rotating(lambda i: exchange_rows(gpu, host, gs[i], hs[i], vic, row_bytes, variant=variant,
                                                       unroll=u))
                t = time_gpu(fn, repeat=repeat)
                out.append({"row_bytes": row_bytes, "num_rows": n, "variant": variant, "unroll": u,
                            "victims": victims, "time_s": t["median_s"], "time_p90_s": t["p90_s"],
                            "h2d_gb_s": n * row_bytes / t["median_s"] / 1e9})
    return out


def bench_gather(row_bytes: int, sizes: list[int], *, src_rows: int, dst_rows: int, mode: str = "pull",
                 unrolls=(8,), seed: int = 0, repeat: int = 20) -> list[dict]:
    """Scattered row gather into a local buffer on GPU 0.

    mode "local": source pool on GPU 0; "pull": source on GPU 1, kernel on GPU 0 reads over NVLink; "push": kernel
    on GPU 1 reads its pool and writes into GPU 0's buffer; "h2d": source in pinned host memory."""
    from ulacache.backends.cupy_copy import HostPool, gather_rows

    cp = cupy()
    rng = np.random.default_rng(seed)
    if mode in ("pull", "push"):
        enable_peer_access(2)
    src_dev = 1 if mode in ("pull", "push") else 0
    if mode == "h2d":
        src = HostPool(src_rows, row_bytes)
        src.array[:] = rng.integers(0, 255, size=src.array.shape, dtype=np.uint8)
    else:
        with cp.cuda.Device(src_dev):
            src = cp.asarray(rng.integers(0, 255, size=(src_rows, row_bytes), dtype=np.uint8))
    with cp.cuda.Device(0):
        dst = cp.zeros((dst_rows, row_bytes), dtype=cp.uint8)
    kdev = 1 if mode == "push" else 0
    out = []
    for n in sizes:
        with cp.cuda.Device(kdev):
            ss, ds = _index_sets(rng, src_rows, n), _index_sets(rng, dst_rows, n)
            for u in unrolls:
                fn = _rotating(lambda i: gather_rows(dst, src, ds[i], ss[i], row_bytes, unroll=u))
                t = time_gpu(fn, repeat=repeat)
                out.append({"row_bytes": row_bytes, "num_rows": n, "mode": mode, "unroll": u,
                            "time_s": t["median_s"], "time_p90_s": t["p90_s"],
                            "gb_s": n * row_bytes / t["median_s"] / 1e9})
    return out


def check_exchange_correct(row_bytes: int, n: int, *, host_rows: int, gpu_rows: int, variant: str,
                           seed: int = 1) -> bool:
    """One exchange on fresh random data, compared with the numpy swap it must equal."""
    from ulacache.backends.cupy_copy import HostPool, exchange_rows

    cp = cupy()
    rng = np.random.default_rng(seed)
    host = HostPool(host_rows, row_bytes)
    host.array[:] = rng.integers(0, 255, size=host.array.shape, dtype=np.uint8)
    g0 = rng.integers(0, 255, size=(gpu_rows, row_bytes), dtype=np.uint8)
    gpu = cp.asarray(g0)
    h0 = host.array.copy()
    hs = rng.choice(host_rows, size=n, replace=False)
    gs = rng.choice(gpu_rows, size=n, replace=False)
    vic = rng.random(n) < 0.7
    exchange_rows(gpu, host, cp.asarray(gs), cp.asarray(hs), cp.asarray(vic), row_bytes, variant=variant)
    cp.cuda.get_current_stream().synchronize()
    g1, h1 = g0.copy(), h0.copy()
    g1[gs] = h0[hs]
    h1[hs[vic]] = g0[gs[vic]]
    return bool(np.array_equal(cp.asnumpy(gpu), g1) and np.array_equal(host.array, h1))
