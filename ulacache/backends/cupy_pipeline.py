"""The GPU twin of pb-lru: one access batch (epoch rule included) and its commit as one sync-free CUDA launch sequence
(kernels/access.cu + kernels/pipeline.cu) on a device copy of a numpy-backed cache's state. Contract: README.md,
"Fused device pipeline".

`DevicePbLru(cache, max_refs)` sizes device arrays from the public executor API (`cache.layout()`,
`cache.device_state()`); `load(cache)` copies the state in (bucket clock included); `set_refs` + `launch_access()` +
`launch_commit()` run one batch (CUDA-graph capturable; the epoch rule runs on the device); `result()` reads back
what `plan.exchanges` holds (misses in order, their slots and victims, counts) so callers can check bit equality;
`launch_exchange` moves one rank's rows. All ranks' metadata live on the current GPU (one segment per rank). cupy is
imported inside functions only.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

_KERNELS = Path(__file__).with_name("kernels")
_BLOCK = 256
MAX_RANKS = 8  # MAX_RANKS in pipeline.cu
SEL_MAX_PAIRS = 1024  # (num_recent + 2) * ranks, SEL_MAX_PAIRS in pipeline.cu


def _cupy():
    import cupy

    return cupy


@functools.lru_cache(maxsize=None)
def _module_on(device_id: int):
    cp = _cupy()
    code = (_KERNELS / "access.cu").read_text() + "\n" + (_KERNELS / "pipeline.cu").read_text()
    return cp.RawModule(code=code, options=("-std=c++17",))


def kernel(name: str):
    """A pipeline kernel compiled for the current device."""
    return _module_on(_cupy().cuda.Device().id).get_function(name)


def spin(ns: int) -> None:
    """Hold the current stream for `ns` ns (lets the host enqueue a whole timed region before the GPU starts)."""
    kernel("spin_ns")((1,), (1,), (np.int64(ns),))


_STATE = ("phys", "owner", "stamps", "ring", "cold", "free_bm")
_CLOCK = ("epoch", "epoch_inserted")  # clock[0], clock[1]; clock[2] = whether the last batch rotated (scratch)


class DevicePbLru:
    def __init__(self, cache, max_refs: int):
        cp = _cupy()
        if cache.config.policy != "pb-lru":
            raise ValueError(f"DevicePbLru mirrors the pb-lru policy, not {cache.config.policy!r}")
        lay, st = cache.layout(), cache.device_state()
        self.R, self.seg = lay.num_ranks, lay.gpu_seg
        self.G = lay.cpu_base
        self.cpu_base, self.cpu_slots = lay.cpu_base, max(lay.cpu_slots, 1)
        self.K = st.num_recent
        self.gpu_slots, self.volume = lay.gpu_slots, st.epoch_volume
        self.max_refs = int(max_refs)
        if self.R > MAX_RANKS:
            raise ValueError(f"the device pipeline handles at most {MAX_RANKS} ranks")
        sm = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.device_id, self._local = cp.cuda.Device().id, {}
        self.persist = sm * 8
        L = st.marker_size
        z = lambda n, dt=cp.int64: cp.zeros(int(n), dtype=dt)
        self.phys = z(st.phys.size)
        self.owner, self.stamps = z(self.G), z(self.G)
        # All bucket bitmaps as rows of one array (row 0 free, 1 cold, 2.. ring) for the selection kernels.
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
        self.clock = z(3)  # epoch, insertions during it, rotated by this batch
        self.rank_hits, self.cur_counts = z(self.R), z(self.R)
        self.words_per_seg = self.seg // 64
        self.chunks = max(1, -(-self.words_per_seg // _BLOCK))  # WPT = 1 in access.cu
        pairs = (self.K + 2) * self.R
        if pairs > SEL_MAX_PAIRS:
            raise ValueError(f"(num_recent_buckets + 2) * num_ranks must be <= {SEL_MAX_PAIRS}")
        self.sel_counts = z(pairs * self.chunks)
        self.sel_choff = z(pairs * self.chunks)
        self.sel_want, self.sel_base = z(pairs), z(pairs)

    # -- state ---------------------------------------------------------------------------------------------------------
    def _arrays(self):
        return (self.phys, self.owner, self.stamps, self.ring, self.cold, self.free_bm, self.clock)

    def load(self, cache) -> None:
        """Copy the cache's committed state (`device_state()`) to the device (not part of any timed region)."""
        st = cache.device_state()
        for dst, name in zip(self._arrays(), _STATE):
            dst.set(np.ascontiguousarray(getattr(st, name), dtype=dst.dtype))
        self.clock.set(np.array([st.epoch, st.epoch_inserted, 0], dtype=np.int64))

    def snapshot(self) -> list:
        return [a.copy() for a in self._arrays()]

    def restore(self, snap) -> None:
        for dst, src in zip(self._arrays(), snap):
            dst[...] = src

    # -- one access batch ----------------------------------------------------------------------------------------------
    def set_refs(self, refs) -> int:
        cp = _cupy()
        flat = cp.asarray(refs, dtype=cp.int64).ravel()
        if flat.size > self.max_refs:
            raise ValueError(f"batch of {flat.size} references exceeds max_refs={self.max_refs}")
        self.refs[: flat.size] = flat
        self.n_refs = int(flat.size)
        return self.n_refs

    def launch_access(self, mark=None) -> None:
        """Enqueue one access batch; `mark(stage)` (optional) is called after each stage (event timing)."""
        cp = _cupy()
        mark = mark or (lambda stage: None)
        i64 = np.int64
        n, L = self.n_refs, self.marker.size
        self.mbase.fill(0)
        self.counters.fill(0)
        self.rank_hits.fill(0)
        self.cur_counts.fill(0)
        kernel("dedup_mark")((self.persist,), (_BLOCK,), (self.refs, i64(n), self.marker))
        mark("dedup_mark")
        kernel("dedup_count")((self.dedup_blocks,), (_BLOCK,), (self.marker, i64(L), self.dedup_counts))
        mark("dedup_count")
        kernel("dedup_emit")((self.dedup_blocks,), (_BLOCK,),
                             (self.marker, i64(L), self.dedup_counts, self.uniq, self.n_uniq))
        mark("dedup_emit")
        mb = -(-n // (_BLOCK * 8))
        kernel("pipe_classify")((mb,), (_BLOCK,),
                                (self.uniq, self.n_uniq, self.phys, i64(self.G), i64(self.seg), self.counters[0:1],
                                 self.rank_hits, i64(self.cpu_base), i64(self.cpu_slots), np.int32(self.R),
                                 self.places, self.miss_counts))
        mark("classify")
        kernel("pipe_miss_emit")((mb,), (_BLOCK,),
                                 (self.uniq, self.n_uniq, self.places, i64(self.G), i64(self.cpu_base),
                                  i64(self.cpu_slots), np.int32(self.R), self.miss_counts, self.mbase,
                                  self.miss_addr, self.miss_src))
        mark("misses")
        K, S, wps, rw = np.int32(self.K), self.K + 2, self.words_per_seg, self.G // 64
        ring64 = self.ring.view(cp.uint64)
        kernel("pipe_cur_count")((self.chunks, self.R), (_BLOCK,), (ring64, i64(rw), i64(wps), self.clock, K,
                                                                    self.cur_counts))
        kernel("pipe_epoch")((1,), (32,), (self.cur_counts, self.rank_hits, self.mbase, np.int32(self.R),
                                           i64(self.gpu_slots), i64(self.volume), self.clock))
        kernel("pipe_rotate")((min(self.persist, -(-rw // _BLOCK)),), (_BLOCK,),
                              (ring64, self.cold.view(cp.uint64), i64(rw), self.clock, K))
        kernel("pipe_touch")((self.persist,), (_BLOCK,), (self.n_uniq, self.places, i64(self.G), self.stamps,
                                                          self.clock, K, self.ring.view(cp.uint32),
                                                          self.cold.view(cp.uint32)))
        mark("epoch_touch")
        grid = (self.chunks, self.R, S)
        words = self.bms.view(cp.uint64)
        kernel("sel_count_all")(grid, (_BLOCK,), (words, i64(rw), i64(wps), self.clock, K, self.mbase,
                                                  self.sel_counts))
        kernel("sel_plan")((1,), (_BLOCK,), (self.sel_counts, np.int32(self.chunks), np.int32(self.R), np.int32(S),
                                             self.mbase, self.sel_want, self.sel_base, self.sel_choff))
        kernel("sel_emit_all")(grid, (_BLOCK,), (words, i64(rw), i64(wps), self.clock, K,
                                                 self.sel_want, self.sel_base, self.sel_choff, self.dests))
        mark("select")
        kernel("pipe_victims")((self.persist,), (_BLOCK,),
                               (self.dests, self.mbase, np.int32(self.R), self.owner, self.victims,
                                self.counters[1:2]))
        mark("victims")

    def launch_commit(self) -> None:
        """Apply the batch (mapping, owners, stamps, the chosen slots into the current bucket)."""
        cp = _cupy()
        kernel("pipe_commit")((self.persist,), (_BLOCK,),
                              (self.dests, self.mbase, np.int32(self.R), self.miss_addr, self.miss_src, self.victims,
                               self.phys, self.owner, self.stamps, self.clock, np.int32(self.K), np.int64(self.G),
                               self.ring.view(cp.uint32)))

    def launch_exchange(self, gpu_pool, host_pool, rank: int, row_bytes: int, unroll: int = 4) -> None:
        """The real KV exchange of rank `rank`'s misses between its GPU pool (on the current device) and its pinned
        host pool, from the batch's device lists (no host sync)."""
        from ulacache.backends.cupy_copy import _kernel, ptr_of, vectors_per_row

        cp = _cupy()
        vpr = vectors_per_row(row_bytes)
        lists, r_idx = (self.dests, self.miss_src, self.victims, self.mbase), rank
        dev_id = cp.cuda.Device().id
        if dev_id != self.device_id:  # another GPU: copy this rank's slice of the lists locally first
            loc = self._local.get(dev_id)
            if loc is None:
                loc = self._local[dev_id] = tuple(cp.zeros(self.max_refs, cp.int64) for _ in range(3)) + (
                    cp.zeros(2, cp.int64),)
            kernel("pipe_copy_slice")((self.persist,), (_BLOCK,), (self.dests, self.miss_src, self.victims,
                                                                   self.mbase, np.int32(rank)) + loc)
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
        out = {name: a.get() for name, a in zip(_STATE, self._arrays())}
        clock = self.clock.get()
        out.update(epoch=int(clock[0]), epoch_inserted=int(clock[1]))
        return out


def compare_with_plan(dev: dict, plan) -> list[str]:
    """Differences between a device batch result and the plan (`plan.exchanges`); empty list = bit-identical."""
    ex = plan.exchanges
    diffs = []
    for key, want in (("num_unique", plan.num_unique), ("num_hits", plan.num_hits), ("num_misses", plan.num_misses),
                      ("num_exchanges", plan.num_exchanges)):
        if dev[key] != want:
            diffs.append(f"{key}: device {dev[key]} vs plan {want}")
    for key, want in (("miss_addrs", ex.miss_addrs), ("miss_src", ex.miss_src), ("dests", ex.miss_dst)):
        if not np.array_equal(dev[key], want):
            diffs.append(f"{key} differ")
    # the library names the victim by its address (-1: the slot was free), as the device does
    if not np.array_equal(dev["victims"], ex.victims):
        diffs.append("victims differ")
    return diffs


def compare_state(dev: dict, cache) -> list[str]:
    """Differences between the device state after commit and the cache's (`device_state()`) after commit."""
    st = cache.device_state()
    return [f"{k} differs after commit" for k in _STATE + _CLOCK if not np.array_equal(dev[k], getattr(st, k))]
