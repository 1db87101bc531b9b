"""The cupy backend: the access-pipeline primitives as CUDA kernels (kernels/access.cu) and elementwise kernels.

Results equal the numpy reference bit for bit (README.md gives the exact order of every output). Kernels that feed a
later step keep their counts on the device; the protocol methods read a count back only where they must return an
exactly sized array (dedup, select_first). `DeviceOps` exposes the sync-free forms for a device-resident pipeline.
cupy is imported when this module is imported, which happens only when a config names the backend.
"""
from __future__ import annotations

import functools
from pathlib import Path

import cupy as cp
import numpy as np

_KERNELS = Path(__file__).with_name("kernels")
_BLOCK = 256
_DEDUP_BYTES_PER_BLOCK = _BLOCK * 64
_SELECT_WORDS_PER_BLOCK = _BLOCK * 1  # WPT in access.cu


def _module():
    return _module_on(cp.cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _module_on(device_id: int):  # one module per device: a module is loaded into one device's context
    return cp.RawModule(code=(_KERNELS / "access.cu").read_text(), options=("-std=c++17",))


def _fn(name: str):
    return _module().get_function(name)


@functools.lru_cache(maxsize=None)
def _sm_count() -> int:
    return cp.cuda.Device().attributes["MultiProcessorCount"]


def _grid(n: int) -> int:
    return int(max(1, min(-(-n // _BLOCK), _sm_count() * 8)))


@functools.lru_cache(maxsize=None)
def _ew(name: str):
    kernels = {
        "gather": ("raw T table, int64 idx", "T out", "out = table[idx]"),
        "scatter": ("int64 idx, T v", "raw T table", "table[idx] = v"),
        "hit": ("int64 p, int64 g", "bool out", "out = (p >= 0) && (p < g)"),
        "bucket": ("raw T stamps, int64 s, int64 now, int64 k", "int32 out",
                   "long long a = now - (long long)stamps[s]; out = a <= 0 ? 0 : (a > k ? k + 1 : a)"),
    }
    ins, outs, body = kernels[name]
    return cp.ElementwiseKernel(ins, outs, body, f"ulacache_{name}")


def _i64(a):
    return cp.ascontiguousarray(cp.asarray(a, dtype=cp.int64))


class DeviceOps:
    """Sync-free forms: outputs go to caller-provided buffers, counts stay in device int64 scalars."""

    @staticmethod
    def dedup_into(addrs, marker, out, out_count, stream=None) -> None:
        n, length = int(addrs.size), int(marker.size)
        if marker.data.ptr % 16:
            raise ValueError("dedup: marker must be 16-byte aligned")
        nblocks = max(1, -(-length // _DEDUP_BYTES_PER_BLOCK))
        counts = cp.empty(nblocks, dtype=cp.int64)
        kw = {"stream": stream} if stream is not None else {}
        _fn("dedup_mark")((_grid(n),), (_BLOCK,), (addrs, np.int64(n), marker), **kw)
        _fn("dedup_count")((nblocks,), (_BLOCK,), (marker, np.int64(length), counts), **kw)
        _fn("dedup_emit")((nblocks,), (_BLOCK,), (marker, np.int64(length), counts, out, out_count), **kw)

    @staticmethod
    def select_first_into(bitmap, summary, seg_slots: int, counts, out, found, out_count, stream=None) -> None:
        nseg = int(counts.size)
        words = bitmap.view(cp.uint64)
        words_per_seg = seg_slots // 64
        if seg_slots % 64 or words.size != nseg * words_per_seg:
            raise ValueError(f"select_first: bitmap of {bitmap.size * 8} slots is not {nseg} segments of {seg_slots}")
        chunks = max(1, -(-words_per_seg // _SELECT_WORDS_PER_BLOCK))
        chunk_counts = cp.empty(nseg * chunks, dtype=cp.int64)
        sm = summary.view(cp.uint32)
        kw = {"stream": stream} if stream is not None else {}
        _fn("select_count")((chunks, nseg), (_BLOCK,), (words, sm, np.int64(words_per_seg), chunk_counts), **kw)
        _fn("select_emit")((chunks, nseg), (_BLOCK,),
                           (words, sm, np.int64(words_per_seg), chunk_counts, counts, out, found, out_count), **kw)


class CupyBackend:
    """Protocol backend on the current CUDA device; arrays are cupy arrays."""

    name = "cupy"

    def asarray(self, a):
        return cp.asarray(a)

    def to_numpy(self, a):
        return cp.asnumpy(a)

    def dedup(self, addrs, marker):
        addrs = _i64(addrs).ravel()
        out = cp.empty(addrs.size, dtype=cp.int64)
        count = cp.zeros(1, dtype=cp.int64)
        if addrs.size:
            DeviceOps.dedup_into(addrs, marker.view(cp.uint8), out, count)
        return out[: int(count.get()[0])], marker

    def gather(self, table, idx):
        return _ew("gather")(table, _i64(idx))

    def scatter(self, table, idx, values):
        idx = _i64(idx)
        if idx.size:
            _ew("scatter")(idx, cp.asarray(values, dtype=table.dtype), table)
        return table

    def hit_mask(self, places, num_gpu_places):
        return _ew("hit")(_i64(places), np.int64(num_gpu_places))

    def bucket_of(self, stamps, slots, now, num_recent):
        return _ew("bucket")(stamps, _i64(slots), np.int64(now), np.int64(num_recent))

    def _bitmap_write(self, bitmap, slots, set_: int):
        slots = _i64(slots)
        n = int(slots.size)
        if n:
            _fn("bitmap_write")((_grid(n),), (_BLOCK,), (bitmap.view(cp.uint32), slots, np.int64(n), np.int32(set_)))
        return bitmap

    def bitmap_set(self, bitmap, slots):
        return self._bitmap_write(bitmap, slots, 1)

    def bitmap_clear(self, bitmap, slots):
        return self._bitmap_write(bitmap, slots, 0)

    def summary(self, bitmap):
        words = bitmap.view(cp.uint64)
        nwords = int(words.size)
        nsum64 = -(-nwords // 64)
        out = cp.zeros(nsum64 * 8, dtype=cp.uint8)
        if nwords == 0:
            return out
        nthreads = nsum64 * 64
        _fn("bitmap_summary")((-(-nthreads // _BLOCK),), (_BLOCK,),
                              (words, np.int64(nwords), out.view(cp.uint32), np.int64(nsum64 * 2)))
        return out

    def select_first(self, bitmap, summary, seg_slots, counts):
        counts = _i64(counts)
        nseg = int(counts.size)
        found = cp.zeros(nseg, dtype=cp.int64)
        total = cp.zeros(1, dtype=cp.int64)
        cap = int(min(int(cp.maximum(counts, 0).sum()), bitmap.size * 8))
        out = cp.empty(max(cap, 1), dtype=cp.int64)
        if nseg:
            DeviceOps.select_first_into(bitmap, summary, int(seg_slots), counts, out, found, total)
        return out[: int(total.get()[0])], found

    def lru_select(self, stamps, eligible, seg_slots, counts):
        counts = cp.asnumpy(cp.asarray(counts, dtype=cp.int64))
        out, found = [], np.zeros(counts.size, dtype=np.int64)
        for r, k in enumerate(counts.tolist()):  # loop over segments (ranks), not slots
            lo = r * seg_slots
            idx = cp.flatnonzero(eligible[lo:lo + seg_slots])
            key = (stamps[lo + idx].astype(cp.int64) + 1) * seg_slots + idx
            key = cp.sort(key)[: max(int(k), 0)]
            out.append(lo + key % seg_slots)
            found[r] = key.size
        slots = cp.concatenate(out) if out else cp.zeros(0, dtype=cp.int64)
        return slots.astype(cp.int64, copy=False), cp.asarray(found)

    def gather_rows(self, pool, idx):
        idx = _i64(idx)
        rows, row_bytes = pool.shape
        if row_bytes % 16 or not pool.flags.c_contiguous or pool.data.ptr % 16:
            return pool[idx]
        out = cp.empty((idx.size, row_bytes), dtype=pool.dtype)
        vpr = row_bytes // 16
        if idx.size:
            _fn("rows_gather")((_grid(idx.size * vpr),), (_BLOCK,), (pool, idx, out, np.int64(idx.size), np.int32(vpr)))
        return out

    def scatter_rows(self, pool, idx, rows):
        idx = _i64(idx)
        rows = cp.ascontiguousarray(cp.asarray(rows, dtype=pool.dtype))
        row_bytes = pool.shape[1]
        if row_bytes % 16 or not pool.flags.c_contiguous or pool.data.ptr % 16 or rows.data.ptr % 16:
            pool[idx] = rows
            return pool
        vpr = row_bytes // 16
        if idx.size:
            _fn("rows_scatter")((_grid(idx.size * vpr),), (_BLOCK,), (pool, idx, rows, np.int64(idx.size),
                                                                       np.int32(vpr)))
        return pool
