"""The torch backend: the access-pipeline primitives on torch tensors (CPU or CUDA), equal to numpy bit for bit.

On CPU it is plain torch (CI checks its parity with numpy). On CUDA tensors, where cupy is installed, the primitives
run the cupy kernels on the same memory through DLPack (`to_cupy` / `to_torch`, no copies), so an engine holding torch
tensors uses the CUDA kernels directly. torch is imported when this module is imported (only when a config names it).
"""
from __future__ import annotations

import numpy as np
import torch


def _shifts(device):
    return torch.arange(8, dtype=torch.uint8, device=device)


def to_cupy(t):
    """torch CUDA tensor -> cupy array on the same memory (DLPack, zero-copy)."""
    import cupy

    return cupy.from_dlpack(t.contiguous()) if t.dtype != torch.bool else cupy.from_dlpack(
        t.contiguous().view(torch.uint8)).view(cupy.bool_)


def to_torch(a):
    """cupy array -> torch CUDA tensor on the same memory (DLPack, zero-copy)."""
    import cupy

    if a.dtype == cupy.bool_:
        return torch.from_dlpack(a.view(cupy.uint8)).view(torch.bool)
    return torch.from_dlpack(a)


def _cupy_backend():
    try:
        from ulacache.backends.cupy_backend import CupyBackend
    except ImportError:
        return None
    return CupyBackend()


def _unpack(bitmap):
    """uint8 bitmap -> bool per slot (little-endian bit order)."""
    return ((bitmap.unsqueeze(1) >> _shifts(bitmap.device)) & 1).reshape(-1).bool()


def _pack(bits):
    """bool per slot (length multiple of 8) -> uint8 bitmap."""
    b = bits.reshape(-1, 8).to(torch.uint8) << _shifts(bits.device)
    return b.sum(dim=1, dtype=torch.uint8)


class TorchBackend:
    """Protocol backend on torch tensors; CUDA tensors use the cupy kernels through DLPack when cupy is present."""

    name = "torch"

    def __init__(self, device: str | None = None, use_cupy_kernels: bool = True):
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self._cp = _cupy_backend() if (use_cupy_kernels and self.device.type == "cuda") else None

    def asarray(self, a):
        if isinstance(a, torch.Tensor):
            return a.to(self.device)
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def to_numpy(self, a):
        if isinstance(a, torch.Tensor):
            return a.detach().cpu().numpy()
        return np.asarray(a)

    def _via_cupy(self, name, *args, **kw):
        conv = [to_cupy(x) if isinstance(x, torch.Tensor) else x for x in args]
        res = getattr(self._cp, name)(*conv, **kw)
        if isinstance(res, tuple):
            return tuple(to_torch(r) for r in res)
        return to_torch(res)

    def _cuda(self, *ts) -> bool:
        return self._cp is not None and all(isinstance(t, torch.Tensor) and t.is_cuda for t in ts)

    # -- pipeline primitives -------------------------------------------------------------------------------------------
    def dedup(self, addrs, marker):
        if self._cuda(addrs, marker):
            return self._via_cupy("dedup", addrs, marker)
        a = addrs.reshape(-1)
        a = a[a >= 0]
        marker[a] = True
        uniq = torch.nonzero(marker).reshape(-1)
        marker[uniq] = False
        return uniq.to(torch.int64), marker

    def gather(self, table, idx):
        return table[idx]

    def scatter(self, table, idx, values):
        table[idx] = torch.as_tensor(values, dtype=table.dtype, device=table.device)
        return table

    def hit_mask(self, places, num_gpu_places):
        return (places >= 0) & (places < num_gpu_places)

    def bucket_of(self, stamps, slots, now, num_recent):
        age = now - stamps[slots].to(torch.int64)
        return torch.clamp(age, 0, num_recent + 1).to(torch.int32)

    def _bitmap_write(self, bitmap, slots, set_: bool):
        slots = slots.reshape(-1).to(torch.int64)
        if slots.numel() == 0:
            return bitmap
        if self._cuda(bitmap, slots):
            return self._via_cupy("bitmap_set" if set_ else "bitmap_clear", bitmap, slots)
        vals = torch.ones(1, dtype=torch.int32, device=bitmap.device) << (slots & 7).to(torch.int32)
        acc = torch.zeros(bitmap.numel(), dtype=torch.int32, device=bitmap.device).index_add_(0, slots >> 3, vals)
        # distinct slots whose bits are clear (set) on entry: adding (subtracting) bit values equals OR (AND NOT)
        new = bitmap.to(torch.int32) + acc if set_ else bitmap.to(torch.int32) - acc
        bitmap.copy_(new.to(torch.uint8))
        return bitmap

    def bitmap_set(self, bitmap, slots):
        return self._bitmap_write(bitmap, slots, True)

    def bitmap_clear(self, bitmap, slots):
        return self._bitmap_write(bitmap, slots, False)

    def summary(self, bitmap):
        nz = bitmap.reshape(-1, 8).ne(0).any(dim=1)
        pad = (-nz.numel()) % 64
        if pad:
            nz = torch.cat([nz, torch.zeros(pad, dtype=torch.bool, device=nz.device)])
        return _pack(nz)

    def select_first(self, bitmap, summary, seg_slots, counts):
        counts = torch.as_tensor(counts, dtype=torch.int64).cpu()
        nseg = counts.numel()
        nwords = bitmap.numel() // 8
        cand = _unpack(summary)[:nwords]  # words worth examining
        bits = _unpack(bitmap).reshape(nwords, 64) & cand.unsqueeze(1)
        bits = bits.reshape(nseg, seg_slots)
        out, found = [], torch.zeros(nseg, dtype=torch.int64)
        for r in range(nseg):  # loop over segments (ranks), not slots
            idx = torch.nonzero(bits[r]).reshape(-1)
            take = idx[: max(int(counts[r]), 0)]
            out.append(take + r * seg_slots)
            found[r] = min(int(counts[r]), idx.numel())
        slots = torch.cat(out) if out else torch.zeros(0, dtype=torch.int64, device=bitmap.device)
        return slots.to(torch.int64), found.to(bitmap.device)

    def lru_select(self, stamps, eligible, seg_slots, counts):
        counts = torch.as_tensor(counts, dtype=torch.int64).cpu()
        out, found = [], torch.zeros(counts.numel(), dtype=torch.int64)
        for r in range(counts.numel()):
            lo = r * seg_slots
            idx = torch.nonzero(eligible[lo:lo + seg_slots]).reshape(-1)
            key = (stamps[lo + idx].to(torch.int64) + 1) * seg_slots + idx
            key = torch.sort(key).values[: max(int(counts[r]), 0)]
            out.append(lo + key % seg_slots)
            found[r] = key.numel()
        slots = torch.cat(out) if out else torch.zeros(0, dtype=torch.int64, device=stamps.device)
        return slots.to(torch.int64), found.to(stamps.device)

    def gather_rows(self, pool, idx):
        return pool[idx]

    def scatter_rows(self, pool, idx, rows):
        pool[idx] = torch.as_tensor(rows, dtype=pool.dtype, device=pool.device)
        return pool
