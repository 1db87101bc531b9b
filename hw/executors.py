"""Executors of a plan's real transfers for `hw validate`: pools per rank, bytes per entry.

`transfer_lists(cache, plan, pending)` turns the facade's plan into per-rank index lists (host, numpy): the exchange
(GPU slot, host slot, has-victim), the new tokens' KV written to the CPU tier, and in TP the peer gathers into each
rank's local buffer (source: the entry's GPU place on its home rank after this batch's exchange -- the same bytes the
plan's fetch reads). `NumpyExecutor` applies them to CPU arrays (any rank count, no timings); `GpuExecutor` runs the
device pb-lru pipeline and the real copies on one GPU per rank and times the region with CUDA events.
"""
from __future__ import annotations

import numpy as np


def transfer_lists(cache, plan, pending: list) -> list[dict]:
    """Per rank: the exchange (GPU slot g, host slot h, has-victim v), the pending new-token writes (host slots and
    rows) and, in TP, the peer gathers {home rank: (source GPU slots, buffer slots, addresses)}, from the plan's
    public `exchanges` and the cache's `layout()`."""
    lay, ex, R = cache.layout(), plan.exchanges, cache.layout().num_ranks
    _, drank, g = lay.decode(ex.miss_dst)
    _, _, h = lay.decode(ex.miss_src)
    p_tier, p_home, p_slot = lay.decode(ex.peer_src_after)
    if (p_tier != lay.GPU).any():
        raise AssertionError("a peer fetch source is not GPU-resident after the exchange")
    _, _, b_slot = lay.decode(ex.peer_dst)
    out = []
    pend = [(a, *lay.decode(np.array([p]))[1:], row) for a, p, row in pending]
    for r in range(R):
        sel = drank == r
        lst = {"g": g[sel], "h": h[sel], "v": ex.victims[sel] >= 0}
        pa = [(int(s[0]), row) for _, rk, s, row in pend if int(rk[0]) == r]
        lst["pend_h"] = np.array([s for s, _ in pa], dtype=np.int64)
        lst["pend_rows"] = np.stack([row for _, row in pa]) if pa else None
        lst["peers"] = {}
        m = ex.peer_rank == r
        for home in np.unique(p_home[m]).tolist():  # loop over home ranks
            k = m & (p_home == home)
            lst["peers"][home] = (p_slot[k], b_slot[k], ex.peer_addrs[k])
        out.append(lst)
    return out


class NumpyExecutor:
    """CPU arrays standing in for the pools: checks the index logic of any rank count (no timings)."""

    def __init__(self, cache, row_bytes: int):
        lay = cache.layout()
        R = lay.num_ranks
        self.cache, self.lay, self.rb, self.R = cache, lay, row_bytes, R
        self.gpu = [np.zeros((lay.gpu_seg, row_bytes), np.uint8) for _ in range(R)]
        self.host = [np.zeros((max(lay.cpu_slots, 1), row_bytes), np.uint8) for _ in range(R)]
        self.buf = [np.zeros((lay.buffer_seg, row_bytes), np.uint8) for _ in range(R)] if lay.buffer_seg else None
        self.buf_owner = [np.full(lay.buffer_seg, -1, np.int64) for _ in range(R)]  # what this executor copied

    def facts(self) -> dict:
        return {"gpu": "none (numpy dry run)", "num_gpus": 0}

    def _split(self, places):
        tier, rank, local = self.lay.decode(places)
        return tier == self.lay.GPU, rank, local

    def _track(self, lists) -> None:
        for r, lst in enumerate(lists):
            for _, (_, dst, addrs) in lst["peers"].items():
                self.buf_owner[r][dst] = addrs

    def write(self, addrs, places, rows) -> None:
        on_gpu, rank, local = self._split(places)
        for r in range(self.R):  # loop over ranks
            g, h = on_gpu & (rank == r), ~on_gpu & (rank == r)
            self.gpu[r][local[g]] = rows[g]
            self.host[r][local[h]] = rows[h]

    def write_new(self, addrs, places, rows, pending: list) -> None:
        on_gpu = self._split(places)[0]
        self.write(addrs[on_gpu], places[on_gpu], rows[on_gpu])
        pending.extend(zip(addrs[~on_gpu].tolist(), places[~on_gpu].tolist(), rows[~on_gpu]))

    def prepare(self, refs) -> None:
        """Before `cache.access(refs)`: nothing to mirror on the CPU."""

    def run_step(self, plan, refs, pending) -> dict:
        lists = transfer_lists(self.cache, plan, pending)
        for r, lst in enumerate(lists):  # phase 1: every rank's exchange and new-token writes
            g, h, v = lst["g"], lst["h"], lst["v"]
            incoming, outgoing = self.host[r][h].copy(), self.gpu[r][g[v]].copy()
            self.gpu[r][g] = incoming
            self.host[r][h[v]] = outgoing
            if lst["pend_rows"] is not None:
                self.host[r][lst["pend_h"]] = lst["pend_rows"]
        for r, lst in enumerate(lists):  # phase 2 (after all exchanges): peer gathers into local buffers
            for home, (src, dst, _) in lst["peers"].items():
                self.buf[r][dst] = self.gpu[home][src]
        self._track(lists)
        return {}

    def check_state(self) -> list:
        return []

    def _rows_at(self, places):
        on_gpu, rank, local = self._split(places)
        rows = np.empty((places.size, self.rb), np.uint8)
        for r in range(self.R):
            g, h = on_gpu & (rank == r), ~on_gpu & (rank == r)
            rows[g] = self.gpu[r][local[g]]
            rows[h] = self.host[r][local[h]]
        return rows

    def _buffer_rows(self, r, slots):
        return self.buf[r][slots]

    def verify(self, cache, addrs, payload_rows) -> dict:
        """Every allocated entry's bytes (at `cache.places`) and every TP buffer copy this executor made must encode
        its logical address."""
        addrs = np.asarray(addrs, dtype=np.int64)
        bad = 0
        for chunk in np.array_split(addrs, max(1, addrs.size // 200_000)):
            rows = self._rows_at(cache.places(chunk))
            bad += int((rows != payload_rows(chunk, self.rb)).any(axis=1).sum())
        copies, bad_entries = 0, bad
        if self.buf:
            for r in range(self.R):  # loop over ranks
                occ = np.flatnonzero(self.buf_owner[r] >= 0)
                rows = self._buffer_rows(r, occ)
                bad += int((rows != payload_rows(self.buf_owner[r][occ], self.rb)).any(axis=1).sum())
                copies += int(occ.size)
        return {"checked_entries": int(addrs.size), "checked_buffer_copies": copies, "bad": bad,
                "bad_entries": bad_entries, "bad_buffer_copies": bad - bad_entries}

    def flush(self, pending: list) -> None:
        """Write the KV of new tokens still pending for the CPU tier (untimed; before a final verify)."""
        if pending:
            a, p, rows = zip(*pending)
            self.write(np.array(a), np.array(p, dtype=np.int64), np.stack(rows))
            pending.clear()


class GpuExecutor(NumpyExecutor):
    """Pools on GPU r (HBM) and in pinned host memory per rank; the device pipeline on GPU 0; CUDA-event timing."""

    SPIN_NS = 6_000_000  # holds GPU 0 while the host enqueues the step (measured time = GPU time)

    def __init__(self, cache, row_bytes: int):
        import cupy as cp

        from hw.gpu import enable_peer_access
        from ulacache.backends.cupy_copy import HostPool
        from ulacache.backends.cupy_pipeline import DevicePbLru

        lay = cache.layout()
        R = lay.num_ranks
        self.lay, self.order, self.exchange_kernel = lay, list(range(R)), "device"
        self.buf_owner = [np.full(lay.buffer_seg, -1, np.int64) for _ in range(R)]
        if cp.cuda.runtime.getDeviceCount() < R:
            raise ValueError(f"--ranks {R} needs {R} GPUs; this host has {cp.cuda.runtime.getDeviceCount()}")
        self.cp, self.cache, self.rb, self.R = cp, cache, row_bytes, R
        if R > 1:
            enable_peer_access(R)
        self.gpu, self.host, self.buf, self.streams = [], [], [], []
        for r in range(R):
            with cp.cuda.Device(r):
                self.gpu.append(cp.zeros((lay.gpu_seg, row_bytes), cp.uint8))
                self.host.append(HostPool(max(lay.cpu_slots, 1), row_bytes))
                if lay.buffer_seg:
                    self.buf.append(cp.zeros((lay.buffer_seg, row_bytes), cp.uint8))
                self.streams.append(cp.cuda.Stream(non_blocking=True))
        with cp.cuda.Device(0):
            self.dev = DevicePbLru(cache, max_refs=1)
        self.max_refs = 1

    def facts(self) -> dict:
        from hw.gpu import device_facts

        return device_facts()

    def write(self, addrs, places, rows) -> None:
        cp = self.cp
        on_gpu, rank, local = self._split(places)
        for r in range(self.R):  # loop over ranks
            g, h = on_gpu & (rank == r), ~on_gpu & (rank == r)
            if g.any():
                with cp.cuda.Device(r):
                    self.gpu[r][cp.asarray(local[g])] = cp.asarray(rows[g])
                    cp.cuda.Device(r).synchronize()
            self.host[r].array[local[h]] = rows[h]

    def prepare(self, refs) -> None:
        """Before `cache.access(refs)` (the committed state is public only while no plan is pending): mirror the
        cache's state on GPU 0 and upload the batch."""
        from ulacache.backends.cupy_pipeline import DevicePbLru

        with self.cp.cuda.Device(0):
            if refs.size > self.max_refs:
                self.dev = DevicePbLru(self.cache, max_refs=refs.size)
                self.max_refs = refs.size
            self.dev.load(self.cache)
            self.dev.set_refs(refs)

    def run_step(self, plan, refs, pending) -> dict:
        """One step on the GPUs, timed: GPU 0's access, each rank's exchange and new-token writes, then (after every
        exchange) the peer gathers, then GPU 0's commit; the step time and its parts, the device's hits and its
        differences from the facade's plan."""
        from ulacache.backends.cupy_pipeline import compare_with_plan, spin

        cp = self.cp
        lists = transfer_lists(self.cache, plan, pending)
        self._track(lists)
        staged = self._stage(lists)
        s0 = self.streams[0]
        with cp.cuda.Device(0), s0:
            spin(self.SPIN_NS)
            e0 = s0.record()
            self.dev.launch_access()
            e_acc = s0.record()
        starts, exchanged = self._exchanges(staged, e_acc)
        gathers, done = self._peer_gathers(staged, exchanged)
        with cp.cuda.Device(0), s0:
            for e in done.values():
                s0.wait_event(e)
            e_x = s0.record()
            self.dev.launch_commit()
            e1 = s0.record()
        e1.synchronize()
        for r in range(self.R):
            self.streams[r].synchronize()
        t = lambda a, b: cp.cuda.get_elapsed_time(a, b) * 1e-3
        res = self.dev.result()
        parts = {"access": t(e0, e_acc), "transfers": t(e_acc, e_x), "commit": t(e_x, e1)}
        for r in range(self.R):  # per-rank GPU time of its exchange, and of its peer gathers (events on that GPU)
            parts[f"exchange_r{r}"] = t(starts[r], exchanged[r])
            if self.R > 1:  # peer = waiting for the other ranks' exchanges + the gathers themselves
                parts[f"peer_r{r}"] = t(exchanged[r], done[r])
                parts[f"gather_r{r}"] = t(gathers[r], done[r])
        return {"measured_s": t(e0, e1), "parts_s": parts,
                "num_hits": res["num_hits"], "diffs": compare_with_plan(res, plan)}

    def _stage(self, lists: list[dict]) -> list[dict]:
        """Untimed: upload each rank's index lists and the new tokens' rows to its GPU."""
        cp = self.cp
        staged = []
        for r, lst in enumerate(lists):
            with cp.cuda.Device(r):
                d = {"peers": {h: (cp.asarray(s), cp.asarray(t)) for h, (s, t, _) in lst["peers"].items()}}
                if self.exchange_kernel == "grid":
                    d["ex"] = (cp.asarray(lst["g"]), cp.asarray(lst["h"]), cp.asarray(lst["v"].astype(np.uint8)))
                if lst["pend_rows"] is not None:
                    d["pend_h"] = cp.asarray(lst["pend_h"])
                    d["pend_rows"] = cp.asarray(lst["pend_rows"])
                    d["pend_i"] = cp.arange(lst["pend_h"].size, dtype=cp.int64)
                staged.append(d)
                cp.cuda.Device(r).synchronize()
        return staged

    def _exchanges(self, staged: list[dict], e_acc) -> tuple[dict, dict]:
        """Phase 1, after the access (`e_acc`): each rank's exchange (PCIe) and new-token writes; per rank its start
        and end events."""
        from ulacache.backends.cupy_copy import gather_rows

        cp = self.cp
        starts, exchanged = {}, {}
        for r in self.order:
            s = self.streams[r]
            with cp.cuda.Device(r), s:
                s.wait_event(e_acc)
                starts[r] = s.record()
                if self.exchange_kernel == "grid":  # the calibration's kernel: grid sized by rows, lists on GPU r
                    from ulacache.backends.cupy_copy import exchange_rows

                    exchange_rows(self.gpu[r], self.host[r], *staged[r]["ex"], self.rb, unroll=4, stream=s)
                else:
                    self.dev.launch_exchange(self.gpu[r], self.host[r], r, self.rb)
                d = staged[r]
                if "pend_h" in d:
                    gather_rows(self.host[r], d["pend_rows"], d["pend_h"], d["pend_i"], self.rb, stream=s)
                exchanged[r] = s.record()
        return starts, exchanged

    def _peer_gathers(self, staged: list[dict], exchanged: dict) -> tuple[dict, dict]:
        """Phase 2: peer gathers read promoted entries from their home GPU, after all exchanges; per rank the events
        at its gathers' start and end."""
        from ulacache.backends.cupy_copy import gather_rows

        cp = self.cp
        gathers, done = {}, {}
        for r in self.order:
            s = self.streams[r]
            with cp.cuda.Device(r), s:
                for q, e in exchanged.items():
                    if q != r and staged[r]["peers"]:
                        s.wait_event(e)
                gathers[r] = s.record()
                for h, (src, dst) in staged[r]["peers"].items():
                    gather_rows(self.buf[r], self.gpu[h], dst, src, self.rb, stream=s)
                done[r] = s.record()
        return gathers, done

    def check_state(self) -> list:
        from ulacache.backends.cupy_pipeline import compare_state

        with self.cp.cuda.Device(0):
            return compare_state(self.dev.state(), self.cache)

    def _rows_at(self, places):
        cp = self.cp
        on_gpu, rank, local = self._split(places)
        rows = np.empty((places.size, self.rb), np.uint8)
        for r in range(self.R):
            g, h = on_gpu & (rank == r), ~on_gpu & (rank == r)
            with cp.cuda.Device(r):
                rows[g] = cp.asnumpy(self.gpu[r][cp.asarray(local[g])])
            rows[h] = self.host[r].array[local[h]]
        return rows

    def _buffer_rows(self, r, slots):
        with self.cp.cuda.Device(r):
            return self.cp.asnumpy(self.buf[r][self.cp.asarray(slots)])


def make_executor(backend: str, cache, row_bytes: int):
    if backend == "numpy":
        return NumpyExecutor(cache, row_bytes)
    if backend == "cupy":
        return GpuExecutor(cache, row_bytes)
    raise ValueError(f"unknown validate backend {backend!r} (cupy | numpy)")
