"""GPU checks of the hw kernels: row movers equal numpy swaps/gathers, and the device pb-lru pipeline equals the
numpy facade (plan and committed state) over many steps, DP and TP segments."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("row_bytes", [656, 1152, 96])
@pytest.mark.parametrize("variant", ["flat", "lines"])
def test_exchange_rows_equals_numpy_swap(row_bytes, variant):
    from hw.copybench import check_exchange_correct

    assert check_exchange_correct(row_bytes, 7000, host_rows=60_000, gpu_rows=20_000, variant=variant, seed=row_bytes)


@pytest.mark.parametrize("row_bytes", [656, 1152])
def test_exchange_split_equals_fused(row_bytes):
    import cupy as cp

    from ulacache.backends.cupy_copy import HostPool, exchange_rows_split

    rng = np.random.default_rng(5)
    host = HostPool(30_000, row_bytes)
    host.array[:] = rng.integers(0, 256, size=host.array.shape, dtype=np.uint8)
    g0 = rng.integers(0, 256, size=(9_000, row_bytes), dtype=np.uint8)
    gpu, h0 = cp.asarray(g0), host.array.copy()
    hs = rng.choice(30_000, size=4000, replace=False)
    gs = rng.choice(9_000, size=4000, replace=False)
    vic = rng.random(4000) < 0.5
    ev, _ = exchange_rows_split(gpu, host, cp.asarray(gs), cp.asarray(hs), cp.asarray(vic), row_bytes,
                                writeback_stream=cp.cuda.Stream(non_blocking=True))
    ev.synchronize()
    g1, h1 = g0.copy(), h0.copy()
    g1[gs] = h0[hs]
    h1[hs[vic]] = g0[gs[vic]]
    assert np.array_equal(cp.asnumpy(gpu), g1) and np.array_equal(host.array, h1)


def test_peer_or_local_gather_equals_numpy():
    import cupy as cp

    from hw.gpu import enable_peer_access
    from ulacache.backends.cupy_copy import gather_rows

    rng = np.random.default_rng(9)
    two = cp.cuda.runtime.getDeviceCount() > 1
    if two:
        enable_peer_access(2)
    src_np = rng.integers(0, 256, size=(20_000, 656), dtype=np.uint8)
    with cp.cuda.Device(1 if two else 0):
        src = cp.asarray(src_np)
    dst = cp.zeros((5_000, 656), dtype=cp.uint8)
    si = rng.choice(20_000, size=3000, replace=False)
    di = rng.choice(5_000, size=3000, replace=False)
    gather_rows(dst, src, cp.asarray(di), cp.asarray(si), 656)
    want = np.zeros((5_000, 656), np.uint8)
    want[di] = src_np[si]
    assert np.array_equal(cp.asnumpy(dst), want)


@pytest.mark.parametrize("mode,ranks,num_recent,keep", [("dp", 1, 32, 0.44), ("tp", 2, 32, 0.44), ("tp", 2, 2, 0.9)])
def test_device_pipeline_equals_facade(mode, ranks, num_recent, keep):
    """The last case keeps 90% of each selection with 3 buckets: some batches open an epoch by volume, some because
    they would need the current bucket, some do not rotate (the device runs the epoch rule on its own clock)."""
    from hw.accessbench import check_steps
    from hw.workload import Selector, build_cache
    from ulacache.backends.cupy_pipeline import DevicePbLru

    n, hist = 24, 6000
    gpu_slots = 12000 if mode == "dp" else 9000
    cache, addrs = build_cache(n, hist, gpu_slots=gpu_slots, cpu_slots=n * hist, num_ranks=ranks, mode=mode,
                               num_recent_buckets=num_recent)
    sel = Selector(n, hist, 256, 4, seed=ranks, keep=keep, token_overlap=0.95 if keep > 0.5 else 0.8)
    dev = DevicePbLru(cache, n * 4 * 256)
    out = check_steps(cache, addrs, sel, dev, steps=12, decode_alloc=True)
    assert out["mismatched_steps"] == 0, out["diffs"]
    assert all(a == b for a, b in out["hits_facade_device"])
    if keep > 0.5:
        assert 0 in out["rotated"] and 1 in out["rotated"]


@pytest.mark.parametrize("row_bytes", [656, 1152])
def test_bulk_gather_equals_numpy(row_bytes):
    import cupy as cp

    from ulacache.backends.cupy_copy import HostPool, gather_rows_bulk

    rng = np.random.default_rng(row_bytes + 1)
    src_np = rng.integers(0, 256, size=(20_000, row_bytes), dtype=np.uint8)
    host = HostPool(20_000, row_bytes)
    host.array[:] = src_np
    for src in (cp.asarray(src_np), host):
        dst = cp.zeros((6_000, row_bytes), dtype=cp.uint8)
        si = rng.choice(20_000, size=4321, replace=False)
        di = rng.choice(6_000, size=4321, replace=False)
        gather_rows_bulk(dst, src, cp.asarray(di), cp.asarray(si), row_bytes)
        want = np.zeros((6_000, row_bytes), np.uint8)
        want[di] = src_np[si]
        assert np.array_equal(cp.asnumpy(dst), want)
