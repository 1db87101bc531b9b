"""A device-resident pb-lru access batch: the facade's exclusive-policy access, commit and rotate as one sync-free
CUDA launch sequence (kernels/access.cu + kernels/pipeline.cu), on a device copy of a UlaCache's policy state.

`DevicePbLru(cache)` copies the state of a numpy-backed pb-lru `UlaCache` to the GPU (`load`), `launch_access(refs,
now)` + `launch_commit(now)` run one batch (capturable in a CUDA graph), `result()` reads back what the facade's plan
holds (misses in order, their replacement slots and victims, counts) so callers can check bit equality. All ranks'
metadata live on the current GPU (one segment per rank).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from hw.gpu import cupy

_KERNELS = Path(__file__).resolve().parents[1] / "ulacache" / "backends" / "kernels"
_BLOCK = 256


def _module():
    return _module_on(cupy().cuda.Device().id)


@functools.lru_cache(maxsize=None)
def _module_on(device_id: int):
    cp = cupy()
    code = (_KERNELS / "access.cu").read_text() + "\n" + (_KERNELS / "pipeline.cu").read_text()
    return cp.RawModule(code=code, options=("-std=c++17",))


def _fn(name):
    return _module().get_function(name)


class DevicePbLru:
    def __init__(self, cache, max_refs: int, version: int = 3):
        cp = cupy()
        pol = cache.policy
        if cache.config.policy != "pb-lru":
            raise ValueError(f"DevicePbLru mirrors the pb-lru policy, not {cache.config.policy!r}")
        self.R, self.G, self.seg = cache.config.num_ranks, pol.gpu.num_places, pol.gpu.seg
        self.cpu_base, self.cpu_slots = pol.cpu.base, max(pol.cpu.slots, 1)
        self.K = pol.buckets.num_recent
        self.max_refs = int(max_refs)
        self.version = version
        if self.R > 8:
            raise ValueError("the device pipeline handles at most 8 ranks (MAX_RANKS in pipeline.cu)")
        sm = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.device_id, self._local = cp.cuda.Device().id, {}
        self.persist = sm * 8
        L = cache.space.marker.size
        z = lambda n, dt=cp.int64: cp.zeros(int(n), dtype=dt)
        self.phys = z(cache.space.phys.size)
        self.owner, self.stamps = z(self.G), z(self.G)
        # All bucket bitmaps as rows of one array (row 0 free, 1 cold, 2.. ring) so v3 selection indexes them.
        self.bms = cp.zeros((self.K + 3, self.G // 8), dtype=cp.uint8)
        self.free_bm, self.cold, self.ring = self.bms[0], self.bms[1], self.bms[2:]
        self.marker = z(L, cp.uint8)
        n = self.max_refs
        self.refs = z(n)
        self.uniq, self.n_uniq = z(n), z(1)
        self.dedup_blocks = max(1, -(-L // (_BLOCK * 64)))
        self.dedup_counts = z(self.dedup_blocks)
        self.miss_blocks = max(1, -(-n // (_BLOCK * 8)))
        self.miss_counts = z(self.miss_blocks * self.R)
        self.places = z(n)
        self.mbase = z(self.R + 1)
        self.miss_addr, self.miss_src, self.dests, self.victims = z(n), z(n), z(n), z(n)
        self.counters = z(2)  # hits, exchanges
        self.nsrc = 2 + self.K
        self.rem = z((self.nsrc + 1) * self.R)
        self.words_per_seg = self.seg // 64
        self.chunks = max(1, -(-self.words_per_seg // (_BLOCK * 1)))  # WPT = 1 in access.cu
        self.chunk_counts = z(self.chunks * self.R)
        self.summary = z(-(-(self.G // 64) // 64) * 8, cp.uint8)
        pairs = (self.K + 2) * self.R
        if pairs > 1024:
            raise ValueError("(num_recent_buckets + 2) * num_ranks must be <= 1024 (SEL_MAX_PAIRS in pipeline.cu)")
        self.sel_counts = z(pairs * self.chunks)
        self.sel_choff = z(pairs * self.chunks)
        self.sel_want, self.sel_base = z(pairs), z(pairs)

    # -- state ---------------------------------------------------------------------------------------------------------
    def load(self, cache) -> None:
        """Copy the facade's policy state to the device (not part of any timed region)."""
        pol = cache.policy
        self.phys.set(cache.space.phys.astype(np.int64))
        self.owner.set(pol.gpu.owner)
        self.stamps.set(pol.gpu.stamps)
        self.ring.set(pol.buckets.ring)
        self.cold.set(pol.buckets.cold)
        self.free_bm.set(pol.gpu.free_bm)

    def snapshot(self) -> list:
        return [a.copy() for a in (self.phys, self.owner, self.stamps, self.ring, self.cold, self.free_bm)]

    def restore(self, snap) -> None:
        for dst, src in zip((self.phys, self.owner, self.stamps, self.ring, self.cold, self.free_bm), snap):
            dst[...] = src

    # -- one access batch ----------------------------------------------------------------------------------------------
    def set_refs(self, refs) -> int:
        cp = cupy()
        flat = cp.asarray(refs, dtype=cp.int64).ravel()
        if flat.size > self.max_refs:
            raise ValueError(f"batch of {flat.size} references exceeds max_refs={self.max_refs}")
        self.refs[: flat.size] = flat
        self.n_refs = int(flat.size)
        return self.n_refs

    def _sources(self, now: int) -> list:
        rows = [(now - age) % (self.K + 1) for age in range(self.K, 0, -1)]
        return [self.free_bm, self.cold] + [self.ring[r] for r in rows]

    def launch_access(self, now: int, mark=None) -> None:
        """Enqueue one access batch; `mark(stage)` (optional) is called after each stage (event timing)."""
        cp = cupy()
        mark = mark or (lambda stage: None)
        i64 = np.int64
        n, L = self.n_refs, self.marker.size
        self.mbase.fill(0)
        self.counters.fill(0)
        _fn("dedup_mark")((self.persist,), (_BLOCK,), (self.refs, i64(n), self.marker))
        mark("dedup_mark")
        _fn("dedup_count")((self.dedup_blocks,), (_BLOCK,), (self.marker, i64(L), self.dedup_counts))
        mark("dedup_count")
        _fn("dedup_emit")((self.dedup_blocks,), (_BLOCK,),
                          (self.marker, i64(L), self.dedup_counts, self.uniq, self.n_uniq))
        mark("dedup_emit")
        mb = -(-n // (_BLOCK * 8))
        if self.version == 1:
            _fn("pipe_hits")((self.persist,), (_BLOCK,),
                             (self.uniq, self.n_uniq, self.phys, i64(self.G), self.stamps, i64(now),
                              np.int32(self.K), self.ring.view(cp.uint32), self.cold.view(cp.uint32),
                              self.counters[0:1]))
            for r in range(self.R):
                args = (self.uniq, self.n_uniq, self.phys, i64(self.G), i64(self.cpu_base), i64(self.cpu_slots),
                        np.int32(r))
                _fn("pipe_miss_count")((mb,), (_BLOCK,), args + (self.miss_counts,))
                _fn("pipe_miss_emit")((mb,), (_BLOCK,), args + (self.miss_counts, self.mbase, self.miss_addr,
                                                                self.miss_src))
        else:
            _fn("pipe_classify")((mb,), (_BLOCK,),
                                 (self.uniq, self.n_uniq, self.phys, i64(self.G), self.stamps, i64(now),
                                  np.int32(self.K), self.ring.view(cp.uint32), self.cold.view(cp.uint32),
                                  self.counters[0:1], i64(self.cpu_base), i64(self.cpu_slots), np.int32(self.R),
                                  self.places, self.miss_counts))
            mark("classify")
            _fn("pipe_miss_emit2")((mb,), (_BLOCK,),
                                   (self.uniq, self.n_uniq, self.places, i64(self.G), i64(self.cpu_base),
                                    i64(self.cpu_slots), np.int32(self.R), self.miss_counts, self.mbase,
                                    self.miss_addr, self.miss_src))
        mark("misses")
        if self.version >= 3:
            S, wps = self.K + 2, self.words_per_seg
            rw = self.G // 64
            grid = (self.chunks, self.R, S)
            words = self.bms.view(cp.uint64)
            _fn("sel_count_all")(grid, (_BLOCK,), (words, i64(rw), i64(wps), i64(now), np.int32(self.K), self.mbase,
                                                   self.sel_counts))
            _fn("sel_plan")((1,), (_BLOCK,), (self.sel_counts, np.int32(self.chunks), np.int32(self.R), np.int32(S),
                                              self.mbase, self.sel_want, self.sel_base, self.sel_choff))
            _fn("sel_emit_all")(grid, (_BLOCK,), (words, i64(rw), i64(wps), i64(now), np.int32(self.K),
                                                  self.sel_want, self.sel_base, self.sel_choff, self.dests))
            mark("select")
        else:
            _fn("pipe_init_rem")((1,), (32,), (self.mbase, self.rem[: self.R], np.int32(self.R)))
            wps = i64(self.words_per_seg)
            nwords = self.G // 64
            for s, bm in enumerate(self._sources(now)):
                rin, rout = self.rem[s * self.R:(s + 1) * self.R], self.rem[(s + 1) * self.R:(s + 2) * self.R]
                words = bm.view(cp.uint64)
                sm = self.summary.view(cp.uint32)
                _fn("bitmap_summary")((-(-(self.summary.size * 8) // _BLOCK),), (_BLOCK,),
                                      (words, i64(nwords), sm, i64(self.summary.size // 4)))
                _fn("pipe_select_count")((self.chunks, self.R), (_BLOCK,), (words, sm, wps, rin, self.chunk_counts))
                _fn("pipe_select_emit")((self.chunks, self.R), (_BLOCK,),
                                        (words, sm, wps, self.chunk_counts, self.mbase, rin, rout, self.dests))
                mark(f"select_src{s}")
        _fn("pipe_victims")((self.persist,), (_BLOCK,),
                            (self.dests, self.mbase, np.int32(self.R), self.owner, self.victims, self.counters[1:2]))
        mark("victims")

    def launch_commit(self, now: int) -> None:
        cp = cupy()
        _fn("pipe_commit")((self.persist,), (_BLOCK,),
                           (self.dests, self.mbase, np.int32(self.R), self.miss_addr, self.miss_src, self.victims,
                            self.phys, self.owner, self.stamps, np.int64(now), np.int32(self.K), np.int64(self.G),
                            self.ring.view(cp.uint32)))
        row = (now + 1) % (self.K + 1)
        nwords = self.G // 64
        _fn("pipe_rotate")((min(self.persist, -(-nwords // _BLOCK)),), (_BLOCK,),
                           (self.ring[row].view(cp.uint64), self.cold.view(cp.uint64), np.int64(nwords)))

    def launch_exchange(self, gpu_pool, host_pool, rank: int, row_bytes: int, unroll: int = 4) -> None:
        """The real KV exchange of rank `rank`'s misses between its GPU pool and pinned host pool (no host sync)."""
        from ulacache.backends.cupy_copy import _kernel, ptr_of, vectors_per_row

        cp = cupy()
        vpr = vectors_per_row(row_bytes)
        lists, r_idx = (self.dests, self.miss_src, self.victims, self.mbase), rank
        dev_id = cp.cuda.Device().id
        if dev_id != self.device_id:  # another GPU: copy this rank's slice of the lists locally first
            loc = self._local.get(dev_id)
            if loc is None:
                loc = self._local[dev_id] = tuple(cp.zeros(self.max_refs, cp.int64) for _ in range(3)) + (
                    cp.zeros(2, cp.int64),)
            _fn("pipe_copy_slice")((self.persist,), (_BLOCK,), (self.dests, self.miss_src, self.victims, self.mbase,
                                                                np.int32(rank)) + loc)
            lists, r_idx = loc, 0
        k = _kernel("exchange_rows_dev", vpr, unroll)
        k((self.persist,), (_BLOCK,), (np.uint64(ptr_of(gpu_pool)), np.uint64(ptr_of(host_pool))) + lists[:3] + (
            lists[3], np.int32(r_idx), np.int64(rank * self.seg), np.int64(self.cpu_base + rank * self.cpu_slots),
            np.int32(vpr)))

    # -- read back -----------------------------------------------------------------------------------------------------
    def result(self) -> dict:
        mb = self.mbase.get()
        m = int(mb[-1])
        hits, exch = (int(x) for x in self.counters.get())
        return {
            "num_unique": int(self.n_uniq.get()[0]), "num_hits": hits, "num_misses": m, "num_exchanges": exch,
            "h2d_rows_per_rank": np.diff(mb), "miss_addrs": self.miss_addr[:m].get(),
            "miss_src": self.miss_src[:m].get(), "dests": self.dests[:m].get(), "victims": self.victims[:m].get(),
        }

    def state(self) -> dict:
        return {"phys": self.phys.get(), "owner": self.owner.get(), "stamps": self.stamps.get(),
                "ring": self.ring.get(), "cold": self.cold.get(), "free_bm": self.free_bm.get()}


def compare_with_plan(dev: dict, plan) -> list[str]:
    """Differences between a device batch result and the facade's plan (empty list = bit-identical)."""
    st = plan.policy_state
    diffs = []
    for key, want in (("num_unique", plan.num_unique), ("num_hits", plan.num_hits), ("num_misses", plan.num_misses),
                      ("num_exchanges", plan.num_exchanges)):
        if dev[key] != want:
            diffs.append(f"{key}: device {dev[key]} vs plan {want}")
    for key, want in (("miss_addrs", st.miss_addrs), ("miss_src", st.miss_src), ("dests", st.dests),
                      ("victims", st.victims)):
        if not np.array_equal(dev[key], want):
            diffs.append(f"{key} differ")
    return diffs


def compare_state(dev: dict, cache) -> list[str]:
    """Differences between the device state after commit and the facade's state after commit."""
    pol = cache.policy
    want = {"phys": cache.space.phys, "owner": pol.gpu.owner, "stamps": pol.gpu.stamps, "ring": pol.buckets.ring,
            "cold": pol.buckets.cold, "free_bm": pol.gpu.free_bm}
    return [f"{k} differs after commit" for k in want if not np.array_equal(dev[k], want[k])]
