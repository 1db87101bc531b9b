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
    pol, R = cache.policy, cache.config.num_ranks
    seg, base, cs = pol.gpu.seg, pol.cpu.base, max(pol.cpu.slots, 1)
    st = plan.policy_state
    out = []
    drank = st.dests // seg
    new_place = dict(zip(st.miss_addrs.tolist(), st.dests.tolist())) if plan.buffer_state is not None else {}
    bs = plan.buffer_state
    for r in range(R):
        sel = drank == r
        lst = {"g": st.dests[sel] - r * seg, "h": st.miss_src[sel] - base - r * cs, "v": st.victims[sel] >= 0}
        pa = [(a, p, row) for a, p, row in pending if (p - base) // cs == r]
        lst["pend_h"] = np.array([p - base - r * cs for _, p, _ in pa], dtype=np.int64)
        lst["pend_rows"] = (np.stack([row for _, _, row in pa]) if pa else None)
        lst["peers"] = {}
        if bs is not None:
            lseg = cache.buffers.seg
            miss_rank = getattr(bs, "miss_rank", None)
            if miss_rank is None:  # misses grouped by receiving rank, `counts` per rank
                miss_rank = np.repeat(np.arange(R, dtype=np.int64), bs.counts)
            m = miss_rank == r
            addrs, dst = bs.miss_addrs[m], bs.dests[m] - r * lseg
            src = np.array([new_place.get(a, -1) for a in addrs.tolist()], dtype=np.int64)
            old = cache.space.phys[addrs].astype(np.int64)
            src = np.where(src >= 0, src, old)
            if (src >= pol.gpu.num_places).any():
                raise AssertionError("a peer fetch source is not GPU-resident after the exchange")
            home = src // seg
            for h in np.unique(home).tolist():  # loop over home ranks
                k = home == h
                lst["peers"][h] = (src[k] - h * seg, dst[k])
        out.append(lst)
    return out


def _place_split(cache, places):
    pol = cache.policy
    G, seg, base, cs = pol.gpu.num_places, pol.gpu.seg, pol.cpu.base, max(pol.cpu.slots, 1)
    on_gpu = places < G
    rank = np.where(on_gpu, places // seg, (places - base) // cs)
    local = np.where(on_gpu, places - rank * seg, places - base - rank * cs)
    return on_gpu, rank, local


class NumpyExecutor:
    """CPU arrays standing in for the pools: checks the index logic of any rank count (no timings)."""

    def __init__(self, cache, row_bytes: int):
        pol, R = cache.policy, cache.config.num_ranks
        self.cache, self.rb, self.R = cache, row_bytes, R
        self.gpu = [np.zeros((pol.gpu.seg, row_bytes), np.uint8) for _ in range(R)]
        self.host = [np.zeros((max(pol.cpu.slots, 1), row_bytes), np.uint8) for _ in range(R)]
        self.buf = ([np.zeros((cache.buffers.seg, row_bytes), np.uint8) for _ in range(R)]
                    if cache.buffers is not None else None)

    def facts(self) -> dict:
        return {"gpu": "none (numpy dry run)", "num_gpus": 0}

    def write(self, addrs, places, rows) -> None:
        on_gpu, rank, local = _place_split(self.cache, places)
        for r in range(self.R):  # loop over ranks
            g, h = on_gpu & (rank == r), ~on_gpu & (rank == r)
            self.gpu[r][local[g]] = rows[g]
            self.host[r][local[h]] = rows[h]

    def write_new(self, addrs, places, rows, pending: list) -> None:
        on_gpu = places < self.cache.policy.gpu.num_places
        self.write(addrs[on_gpu], places[on_gpu], rows[on_gpu])
        pending.extend(zip(addrs[~on_gpu].tolist(), places[~on_gpu].tolist(), rows[~on_gpu]))

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
            for home, (src, dst) in lst["peers"].items():
                self.buf[r][dst] = self.gpu[home][src]
        return {}

    def check_state(self) -> list:
        return []

    def _rows_at(self, places):
        on_gpu, rank, local = _place_split(self.cache, places)
        rows = np.empty((places.size, self.rb), np.uint8)
        for r in range(self.R):
            g, h = on_gpu & (rank == r), ~on_gpu & (rank == r)
            rows[g] = self.gpu[r][local[g]]
            rows[h] = self.host[r][local[h]]
        return rows

    def _buffer_rows(self, r, slots):
        return self.buf[r][slots]

    def verify(self, cache, payload_rows) -> dict:
        """Every allocated entry's bytes (and every TP buffer copy) must encode its logical address."""
        addrs = np.flatnonzero(cache.space.phys >= 0)
        bad = 0
        for chunk in np.array_split(addrs, max(1, addrs.size // 200_000)):
            rows = self._rows_at(cache.space.phys[chunk].astype(np.int64))
            bad += int((rows != payload_rows(chunk, self.rb)).any(axis=1).sum())
        copies, bad_entries = 0, bad
        if cache.buffers is not None:
            b = cache.buffers
            for r in range(self.R):  # loop over ranks
                occ = np.flatnonzero(b.owner[r * b.seg:(r + 1) * b.seg] >= 0)
                own = b.owner[r * b.seg + occ]
                rows = self._buffer_rows(r, occ)
                bad += int((rows != payload_rows(own, self.rb)).any(axis=1).sum())
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
        from hw.pipeline import DevicePbLru
        from ulacache.backends.cupy_copy import HostPool

        pol, R = cache.policy, cache.config.num_ranks
        if cp.cuda.runtime.getDeviceCount() < R:
            raise ValueError(f"--ranks {R} needs {R} GPUs; this host has {cp.cuda.runtime.getDeviceCount()}")
        self.cp, self.cache, self.rb, self.R = cp, cache, row_bytes, R
        if R > 1:
            enable_peer_access(R)
        self.gpu, self.host, self.buf, self.streams = [], [], [], []
        for r in range(R):
            with cp.cuda.Device(r):
                self.gpu.append(cp.zeros((pol.gpu.seg, row_bytes), cp.uint8))
                self.host.append(HostPool(max(pol.cpu.slots, 1), row_bytes))
                if cache.buffers is not None:
                    self.buf.append(cp.zeros((cache.buffers.seg, row_bytes), cp.uint8))
                self.streams.append(cp.cuda.Stream(non_blocking=True))
        with cp.cuda.Device(0):
            self.dev = DevicePbLru(cache, max_refs=1)
        self.max_refs = 1

    def facts(self) -> dict:
        from hw.gpu import device_facts

        return device_facts()

    def write(self, addrs, places, rows) -> None:
        cp = self.cp
        on_gpu, rank, local = _place_split(self.cache, places)
        for r in range(self.R):  # loop over ranks
            g, h = on_gpu & (rank == r), ~on_gpu & (rank == r)
            if g.any():
                with cp.cuda.Device(r):
                    self.gpu[r][cp.asarray(local[g])] = cp.asarray(rows[g])
                    cp.cuda.Device(r).synchronize()
            self.host[r].array[local[h]] = rows[h]

    def run_step(self, plan, refs, pending) -> dict:
        from hw.pipeline import DevicePbLru, compare_with_plan
        from ulacache.backends.cupy_copy import gather_rows

        cp, R = self.cp, self.R
        lists = transfer_lists(self.cache, plan, pending)
        with cp.cuda.Device(0):
            if refs.size > self.max_refs:
                self.dev = DevicePbLru(self.cache, max_refs=refs.size)
                self.max_refs = refs.size
            self.dev.load(self.cache)
            self.dev.set_refs(refs)
        staged = []
        for r, lst in enumerate(lists):  # untimed: upload the index lists and the new tokens' rows
            with cp.cuda.Device(r):
                d = {"peers": {h: (cp.asarray(s), cp.asarray(t)) for h, (s, t) in lst["peers"].items()}}
                if lst["pend_rows"] is not None:
                    d["pend_h"] = cp.asarray(lst["pend_h"])
                    d["pend_rows"] = cp.asarray(lst["pend_rows"])
                    d["pend_i"] = cp.arange(lst["pend_h"].size, dtype=cp.int64)
                staged.append(d)
                cp.cuda.Device(r).synchronize()
        s0 = self.streams[0]
        ev = lambda s: s.record()
        with cp.cuda.Device(0), s0:
            from hw.pipeline import _fn

            _fn("spin_ns")((1,), (1,), (np.int64(self.SPIN_NS),))
            e0 = ev(s0)
            self.dev.launch_access(plan.now)
            e_acc = ev(s0)
        exchanged, done, starts = [], [], []
        for r in range(R):  # phase 1: each rank's exchange (PCIe) and new-token writes
            s = self.streams[r]
            with cp.cuda.Device(r), s:
                s.wait_event(e_acc)
                starts.append(ev(s))
                self.dev.launch_exchange(self.gpu[r], self.host[r], r, self.rb)
                d = staged[r]
                if "pend_h" in d:
                    gather_rows(self.host[r], d["pend_rows"], d["pend_h"], d["pend_i"], self.rb, stream=s)
                exchanged.append(ev(s))
        for r in range(R):  # phase 2: peer gathers read promoted entries from their home GPU: after all exchanges
            s = self.streams[r]
            with cp.cuda.Device(r), s:
                for q, e in enumerate(exchanged):
                    if q != r and staged[r]["peers"]:
                        s.wait_event(e)
                for h, (src, dst) in staged[r]["peers"].items():
                    gather_rows(self.buf[r], self.gpu[h], dst, src, self.rb, stream=s)
                done.append(ev(s))
        with cp.cuda.Device(0), s0:
            for e in done:
                s0.wait_event(e)
            e_x = ev(s0)
            self.dev.launch_commit(plan.now)
            e1 = ev(s0)
        e1.synchronize()
        for r in range(R):
            self.streams[r].synchronize()
        t = lambda a, b: cp.cuda.get_elapsed_time(a, b) * 1e-3
        res = self.dev.result()
        parts = {"access": t(e0, e_acc), "transfers": t(e_acc, e_x), "commit": t(e_x, e1)}
        for r in range(R):  # per-rank GPU time of its exchange, and of its peer gathers (events on that GPU)
            parts[f"exchange_r{r}"] = t(starts[r], exchanged[r])
            if R > 1:
                parts[f"peer_r{r}"] = t(exchanged[r], done[r])
        return {"measured_s": t(e0, e1), "parts_s": parts,
                "num_hits": res["num_hits"], "diffs": compare_with_plan(res, plan)}

    def check_state(self) -> list:
        from hw.pipeline import compare_state

        with self.cp.cuda.Device(0):
            return compare_state(self.dev.state(), self.cache)

    def _rows_at(self, places):
        cp = self.cp
        on_gpu, rank, local = _place_split(self.cache, places)
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
