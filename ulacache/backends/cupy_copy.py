"""GPU row movers for KV exchange and peer gathers (cupy RawModule over kernels/copy_rows.cu).

Rows are token KV rows of one layer (656 B FP8 MLA, 1152 B BF16, ...), moved as 16-B vectors. Three movers:
`exchange_rows` swaps scattered rows between a mapped pinned host pool and a GPU pool (the incoming row goes to its
GPU slot, the victim goes out to the host slot the incoming row vacated, docs/architecture.md); `gather_rows` copies scattered
rows between any two UVA pointers (peer GPU -> local buffer over NVLink, host -> GPU, GPU -> host). cupy is imported
only inside functions, so this module imports on CPU-only hosts.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

_KERNELS = Path(__file__).with_name("kernels")
VEC_BYTES = 16
LINE_BYTES = 128
_BLOCK = 256
# Specialised row widths (vectors per row) compiled with a constant divisor; others use the runtime-width kernel.
_FIXED_VPR = (41, 72)


def _cupy():
    import cupy

    return cupy


def _copy_module(unroll: int):
    """The compiled row movers, one module per device (a module is loaded into one device's context)."""
    return _copy_module_on(unroll, _cupy().cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _copy_module_on(unroll: int, device_id: int):
    cp = _cupy()
    names = [f"gather_rows<{v},{unroll}>" for v in (0, *_FIXED_VPR)]
    names += [f"exchange_rows<{v},{unroll}>" for v in (0, *_FIXED_VPR)]
    names += [f"exchange_rows_lines<{v},{unroll}>" for v in _FIXED_VPR]
    names += [f"exchange_rows_dev<{v},{unroll}>" for v in (0, *_FIXED_VPR)]
    names += [f"stage_victims<{v},{unroll}>" for v in (0, *_FIXED_VPR)]
    names += ["gather_rows_bulk"]
    code = (_KERNELS / "copy_rows.cu").read_text()
    mod = cp.RawModule(code=code, options=("-std=c++17",), name_expressions=names)
    return mod


def _kernel(kind: str, vpr: int, unroll: int):
    v = vpr if vpr in _FIXED_VPR else 0
    return _copy_module(unroll).get_function(f"{kind}<{v},{unroll}>")


def vectors_per_row(row_bytes: int) -> int:
    if row_bytes <= 0 or row_bytes % VEC_BYTES:
        raise ValueError(f"row_bytes={row_bytes}: must be a positive multiple of {VEC_BYTES}")
    return row_bytes // VEC_BYTES


def _grid(num_vectors: int, unroll: int, max_blocks: int | None) -> int:
    blocks = max(1, -(-num_vectors // (_BLOCK * unroll)))
    if max_blocks:
        blocks = min(blocks, max_blocks)
    return blocks


def ptr_of(x) -> int:
    """Device-usable address of a cupy array, a HostPool, a torch tensor or a raw int pointer."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, HostPool):
        return x.ptr
    data = getattr(x, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return int(data.ptr)
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    raise TypeError(f"cannot take a device address of {type(x).__name__}")


def _idx(a):
    cp = _cupy()
    return cp.ascontiguousarray(cp.asarray(a, dtype=cp.int64))


class HostPool:
    """Pinned, portable, device-mapped host memory of `num_rows` rows (plus one padding line).

    `.array` is a numpy uint8 view of shape (num_rows, row_bytes); `.ptr` is the address kernels use (UVA: the
    host and device addresses are equal)."""

    def __init__(self, num_rows: int, row_bytes: int):
        cp = _cupy()
        vectors_per_row(row_bytes)
        self.num_rows, self.row_bytes = int(num_rows), int(row_bytes)
        nbytes = self.num_rows * self.row_bytes + LINE_BYTES
        rt = cp.cuda.runtime
        flags = getattr(rt, "hostAllocPortable", 1) | getattr(rt, "hostAllocMapped", 2)
        self._mem = cp.cuda.PinnedMemory(nbytes, flags)
        self.ptr = int(self._mem.ptr)
        if self.ptr % LINE_BYTES:
            raise RuntimeError("pinned host allocation is not 128-B aligned")
        buf = np.frombuffer(cp.cuda.PinnedMemoryPointer(self._mem, 0), dtype=np.uint8, count=nbytes)
        self.array = buf[: self.num_rows * self.row_bytes].reshape(self.num_rows, self.row_bytes)


def gather_rows(dst, src, dst_idx, src_idx, row_bytes: int, *, unroll: int = 8, max_blocks: int | None = None,
                stream=None) -> None:
    """dst[dst_idx[i]] = src[src_idx[i]] row-wise, on the current device (src may be a peer GPU or host)."""
    cp = _cupy()
    vpr = vectors_per_row(row_bytes)
    di, si = _idx(dst_idx), _idx(src_idx)
    n = int(di.size)
    if si.size != n:
        raise ValueError(f"gather_rows: {n} destination rows but {si.size} source rows")
    if n == 0:
        return
    k = _kernel("gather_rows", vpr, unroll)
    args = (np.uint64(ptr_of(dst)), np.uint64(ptr_of(src)), di, si, np.int32(n), np.int32(vpr))
    k((_grid(n * vpr, unroll, max_blocks),), (_BLOCK,), args, stream=stream or cp.cuda.get_current_stream())


def exchange_rows(gpu_pool, host_pool, gpu_idx, host_idx, victim, row_bytes: int, *, variant: str = "flat",
                  unroll: int = 8, max_blocks: int | None = None, stream=None) -> None:
    """Swap-in exchange: gpu[gpu_idx[i]] <- host[host_idx[i]], and where victim[i], host[host_idx[i]] <- old gpu row.

    variant "flat" reads exactly the row's 16-B pieces; "lines" reads whole 128-B lines (full-size PCIe reads,
    only for the specialised widths 41 and 72 vectors)."""
    cp = _cupy()
    vpr = vectors_per_row(row_bytes)
    gi, hi = _idx(gpu_idx), _idx(host_idx)
    vi = cp.ascontiguousarray(cp.asarray(victim).astype(cp.uint8, copy=False))
    n = int(gi.size)
    if hi.size != n or vi.size != n:
        raise ValueError(f"exchange_rows: {n} GPU slots, {hi.size} host slots, {vi.size} victim flags")
    if n == 0:
        return
    stream = stream or cp.cuda.get_current_stream()
    gp, hp = np.uint64(ptr_of(gpu_pool)), np.uint64(ptr_of(host_pool))
    if variant == "lines" and vpr in _FIXED_VPR:
        width = vpr if vpr % 8 == 0 else ((vpr + 14) // 8) * 8
        k = _copy_module(unroll).get_function(f"exchange_rows_lines<{vpr},{unroll}>")
        k((_grid(n * width, unroll, max_blocks),), (_BLOCK,), (gp, hp, gi, hi, vi, np.int32(n)), stream=stream)
    elif variant in ("flat", "lines"):
        k = _kernel("exchange_rows", vpr, unroll)
        k((_grid(n * vpr, unroll, max_blocks),), (_BLOCK,), (gp, hp, gi, hi, vi, np.int32(n), np.int32(vpr)),
          stream=stream)
    else:
        raise ValueError(f"exchange_rows: unknown variant {variant!r} (flat | lines)")


def exchange_rows_split(gpu_pool, host_pool, gpu_idx, host_idx, victim, row_bytes: int, *, stage=None,
                        writeback_stream=None, unroll: int = 4, stream=None):
    """Split exchange: (1) stage the victims' rows in HBM, (2) read the incoming rows host -> GPU (PCIe reads only),
    (3) write the staged victims to the vacated host slots (PCIe writes only), on `writeback_stream` if given, so the
    write-back can overlap later GPU work; the next exchange must be ordered after it (the returned event).
    Same final bytes as `exchange_rows`."""
    cp = _cupy()
    vpr = vectors_per_row(row_bytes)
    stream = stream or cp.cuda.get_current_stream()
    gi, hi = _idx(gpu_idx), _idx(host_idx)
    vmask = cp.asarray(victim).astype(cp.bool_, copy=False)
    vg, vh = gi[vmask], hi[vmask]
    nv = int(vg.size)
    if stage is None or stage.shape[0] < nv:
        stage = cp.empty((max(nv, 1), row_bytes), dtype=cp.uint8)
    with stream:
        ar = cp.arange(nv, dtype=cp.int64)  # made before the event: the write-back stream reads it
        if nv:
            k = _kernel("stage_victims", vpr, unroll)
            k((_grid(nv * vpr, 1, None),), (_BLOCK,), (np.uint64(ptr_of(gpu_pool)), stage, vg, np.int32(nv),
                                                       np.int32(vpr)), stream=stream)
        gather_rows(gpu_pool, host_pool, gi, hi, row_bytes, unroll=unroll, stream=stream)
    ev = stream.record()
    wb = writeback_stream or stream
    wb.wait_event(ev)
    if nv:
        gather_rows(host_pool, stage, vh, ar, row_bytes, unroll=unroll, stream=wb)
    return wb.record(), stage


def gather_rows_bulk(dst, src, dst_idx, src_idx, row_bytes: int, *, stream=None) -> None:
    """gather_rows through the Hopper bulk copy engine (kernel v3, sm_90): one bulk request per row."""
    cp = _cupy()
    vectors_per_row(row_bytes)
    di, si = _idx(dst_idx), _idx(src_idx)
    n = int(di.size)
    if si.size != n:
        raise ValueError(f"gather_rows_bulk: {n} destination rows but {si.size} source rows")
    if n == 0:
        return
    rps = max(1, 5376 // row_bytes)
    smem = 4 * 2 * rps * row_bytes
    if smem > 48 * 1024:
        raise ValueError(f"gather_rows_bulk: rows of {row_bytes} B need {smem} B of shared memory (max 49152)")
    k = _copy_module(4).get_function("gather_rows_bulk")
    sm = cp.cuda.Device().attributes["MultiProcessorCount"]
    nbatch = -(-n // rps)
    grid = max(1, min(-(-nbatch // 4), sm * 5))
    k((grid,), (128,), (np.uint64(ptr_of(dst)), np.uint64(ptr_of(src)), di, si, np.int32(n), np.int32(row_bytes),
                        np.int32(rps)), shared_mem=smem, stream=stream or cp.cuda.get_current_stream())
