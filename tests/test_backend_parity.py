"""Backends equal the numpy oracle bit for bit on fresh random inputs (torch-CPU in CI; cupy and torch-CUDA on GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from ulacache.backends.numpy_backend import NumpyBackend

torch = pytest.importorskip("torch")

REF = NumpyBackend()


def _backend(name):
    if name == "torch-cpu":
        from ulacache.backends.torch_backend import TorchBackend

        return TorchBackend("cpu")
    if name == "torch-cuda":
        from ulacache.backends.torch_backend import TorchBackend

        return TorchBackend("cuda")
    from ulacache.backends.cupy_backend import CupyBackend

    return CupyBackend()


BACKENDS = [
    "torch-cpu",
    pytest.param("cupy", marks=pytest.mark.gpu),
    pytest.param("torch-cuda", marks=pytest.mark.gpu),
]


def _same(b, got, want):
    got = b.to_numpy(got)
    assert got.dtype == np.asarray(want).dtype, (got.dtype, np.asarray(want).dtype)
    np.testing.assert_array_equal(got, want)


def _bitmap(rng, nslots, density):
    bits = rng.random(nslots) < density
    return np.packbits(bits, bitorder="little"), bits


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_dedup(name, seed):
    b, rng = _backend(name), np.random.default_rng(seed)
    space = int(rng.integers(1, 200_000))
    addrs = rng.integers(-1, space, size=int(rng.integers(0, 50_000)), dtype=np.int64)
    marker = np.zeros(space + 1, dtype=bool)
    want, m = REF.dedup(addrs.copy(), marker.copy())
    got, gm = b.dedup(b.asarray(addrs), b.asarray(marker))
    _same(b, got, want)
    assert not b.to_numpy(gm).any()


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("seed", range(3))
def test_gather_scatter_hit_bucket(name, seed):
    b, rng = _backend(name), np.random.default_rng(seed)
    table = rng.integers(-1, 10_000, size=50_000, dtype=np.int64 if seed % 2 else np.int32)
    idx = rng.integers(0, table.size, size=20_000, dtype=np.int64)
    _same(b, b.gather(b.asarray(table), b.asarray(idx)), REF.gather(table, idx))
    didx = rng.choice(table.size, size=5_000, replace=False).astype(np.int64)
    vals = rng.integers(-1, 99, size=didx.size, dtype=table.dtype)
    _same(b, b.scatter(b.asarray(table.copy()), b.asarray(didx), b.asarray(vals)),
          REF.scatter(table.copy(), didx, vals))
    _same(b, b.hit_mask(b.asarray(table), 5_000), REF.hit_mask(table, 5_000))
    stamps = rng.integers(-1, 40, size=4096, dtype=np.int64)
    slots = rng.integers(0, 4096, size=3000, dtype=np.int64)
    _same(b, b.bucket_of(b.asarray(stamps), b.asarray(slots), 37, 3), REF.bucket_of(stamps, slots, 37, 3))
    # many buckets: ages past 127 (an int8 result wrapped negative and crashed pb-lru with 512 buckets)
    stamps = rng.integers(-1, 1200, size=4096, dtype=np.int64)
    got = REF.bucket_of(stamps, slots, 1100, 512)
    assert got.min() >= 0 and got.max() == 513 and ((got > 127) & (got < 513)).any()
    _same(b, b.bucket_of(b.asarray(stamps), b.asarray(slots), 1100, 512), got)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("seed", range(3))
def test_bitmaps_and_select_first(name, seed):
    b, rng = _backend(name), np.random.default_rng(seed)
    nseg = int(rng.integers(1, 5))
    seg = 64 * int(rng.integers(1, 300))
    bm, bits = _bitmap(rng, nseg * seg, float(rng.choice([0.001, 0.05, 0.5])))
    clear = rng.choice(np.flatnonzero(~bits), size=min(500, int((~bits).sum())), replace=False).astype(np.int64)
    setb = rng.choice(np.flatnonzero(bits), size=min(500, int(bits.sum())), replace=False).astype(np.int64)
    _same(b, b.bitmap_set(b.asarray(bm.copy()), b.asarray(clear)), REF.bitmap_set(bm.copy(), clear))
    _same(b, b.bitmap_clear(b.asarray(bm.copy()), b.asarray(setb)), REF.bitmap_clear(bm.copy(), setb))
    summ = REF.summary(bm.copy())
    _same(b, b.summary(b.asarray(bm)), summ)
    counts = rng.integers(0, seg + 10, size=nseg, dtype=np.int64)
    ws, wf = REF.select_first(bm, summ, seg, counts)
    gs, gf = b.select_first(b.asarray(bm), b.asarray(summ), seg, b.asarray(counts))
    _same(b, gs, ws)
    np.testing.assert_array_equal(b.to_numpy(gf), wf)
    # flags that disagree with the words: stale ones (empty words flagged) and missing ones (words not examined)
    flags = np.unpackbits(summ, bitorder="little").astype(bool)
    flags ^= rng.random(flags.size) < 0.2
    flags[nseg * seg // 64:] = False  # the padding stays clear
    summ = np.packbits(flags, bitorder="little")
    for k in (counts, np.minimum(counts, 3)):  # many slots (array passes) and a few (walked one by one)
        ws, wf = REF.select_first(bm, summ, seg, k)
        gs, gf = b.select_first(b.asarray(bm), b.asarray(summ), seg, b.asarray(k))
        _same(b, gs, ws)
        np.testing.assert_array_equal(b.to_numpy(gf), wf)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("seed", range(3))
def test_lru_select(name, seed):
    b, rng = _backend(name), np.random.default_rng(seed)
    nseg, seg = int(rng.integers(1, 4)), 64 * int(rng.integers(1, 50))
    stamps = rng.integers(-1, 20, size=nseg * seg, dtype=np.int64)
    eligible = rng.random(nseg * seg) < 0.6
    counts = rng.integers(0, seg, size=nseg, dtype=np.int64)
    ws, wf = REF.lru_select(stamps, eligible, seg, counts)
    gs, gf = b.lru_select(b.asarray(stamps), b.asarray(eligible), seg, b.asarray(counts))
    _same(b, gs, ws)
    np.testing.assert_array_equal(b.to_numpy(gf), wf)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("row_bytes", [16, 656, 1152, 20])
def test_rows(name, row_bytes):
    b, rng = _backend(name), np.random.default_rng(row_bytes)
    pool = rng.integers(0, 256, size=(3000, row_bytes), dtype=np.uint8)
    idx = rng.choice(3000, size=700, replace=False).astype(np.int64)
    _same(b, b.gather_rows(b.asarray(pool), b.asarray(idx)), REF.gather_rows(pool, idx))
    rows = rng.integers(0, 256, size=(700, row_bytes), dtype=np.uint8)
    _same(b, b.scatter_rows(b.asarray(pool.copy()), b.asarray(idx), b.asarray(rows)),
          REF.scatter_rows(pool.copy(), idx, rows))


@pytest.mark.gpu
def test_dlpack_zero_copy():
    """A torch CUDA tensor handed to the cupy kernels is the same memory: the in-place update is visible in torch."""
    from ulacache.backends.torch_backend import TorchBackend, to_cupy

    t = torch.zeros(128, dtype=torch.uint8, device="cuda")
    assert to_cupy(t).data.ptr == t.data_ptr()
    b = TorchBackend("cuda")
    out = b.bitmap_set(t, torch.tensor([0, 9, 1023], device="cuda"))
    assert out.data_ptr() == t.data_ptr()
    assert t[0].item() == 1 and t[1].item() == 2 and t[127].item() == 128
