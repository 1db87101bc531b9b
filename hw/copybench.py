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


def _inner(n: int, row_bytes: int) -> int:
    """Back-to-back calls per timed sample: enough that small batches are not timed as host launch gaps."""
    return max(1, min(20, (8 << 20) // max(1, n * row_bytes)))


def bench_exchange(row_bytes: int, sizes: list[int], *, host_rows: int, gpu_rows: int, variants=("flat",),
                   unrolls=(4,), seed: int = 0, repeat: int = 15) -> list[dict]:
    """Swap-in exchange host->GPU of n scattered rows (every GPU slot holds a victim) for each n in sizes.

    variants: "flat" / "lines" (fused swap kernel, see copy_rows.cu), "split" (stage victims in HBM, read the
    incoming rows, write the victims back: all three), "split_read" (stage + read only: the critical path when the
    write-back overlaps later GPU work), "read_only" (no victims: free GPU slots)."""
    from ulacache.backends.cupy_copy import HostPool, exchange_rows

    cp = cupy()
    rng = np.random.default_rng(seed)
    host = HostPool(host_rows, row_bytes)
    host.array[:] = rng.integers(0, 255, size=host.array.shape, dtype=np.uint8)
    gpu = cp.asarray(rng.integers(0, 255, size=(gpu_rows, row_bytes), dtype=np.uint8))
    out = []
    for n in sizes:
        hs, gs = _index_sets(rng, host_rows, n), _index_sets(rng, gpu_rows, n)
        yes, no = cp.ones(n, dtype=cp.uint8), cp.zeros(n, dtype=cp.uint8)
        stage = cp.empty((n, row_bytes), dtype=cp.uint8)
        ar = cp.arange(n, dtype=cp.int64)
        for variant in variants:
            for u in unrolls:
                if variant in ("flat", "lines", "read_only"):
                    vic = no if variant == "read_only" else yes
                    v = "flat" if variant == "read_only" else variant
                    f = lambda i, vic=vic, v=v, u=u: exchange_rows(gpu, host, gs[i], hs[i], vic, row_bytes,
                                                                   variant=v, unroll=u)
                elif variant == "split":
                    f = lambda i, u=u: _split_full(gpu, host, gs[i], hs[i], stage, ar, row_bytes, u)
                elif variant == "split_read":
                    f = lambda i, u=u: _stage_and_read(gpu, host, gs[i], hs[i], stage, row_bytes, u)
                else:
                    raise ValueError(f"unknown exchange variant {variant!r}")
                t = time_gpu(_rotating(f), repeat=repeat, inner=_inner(n, row_bytes))
                out.append({"row_bytes": row_bytes, "num_rows": n, "variant": variant, "unroll": u,
                            "time_s": t["median_s"], "time_p90_s": t["p90_s"],
                            "h2d_gb_s": n * row_bytes / t["median_s"] / 1e9})
    return out


def _split_full(gpu, host, gi, hi, stage, ar, row_bytes, unroll):
    """All three phases of the split exchange, every row with a victim (write-back on the same stream)."""
    from ulacache.backends.cupy_copy import gather_rows

    _stage_and_read(gpu, host, gi, hi, stage, row_bytes, unroll)
    gather_rows(host, stage, hi, ar, row_bytes, unroll=unroll)


def _stage_and_read(gpu, host, gi, hi, stage, row_bytes, unroll):
    """Phases 1 and 2 of the split exchange (victims staged in HBM, incoming rows read over PCIe)."""
    from ulacache.backends.cupy_copy import _kernel, gather_rows, ptr_of, vectors_per_row

    vpr = vectors_per_row(row_bytes)
    n = int(gi.size)
    k = _kernel("stage_victims", vpr, unroll)
    k((-(-n * vpr // 256),), (256,), (np.uint64(ptr_of(gpu)), stage, gi, np.int32(n), np.int32(vpr)))
    gather_rows(gpu, host, gi, hi, row_bytes, unroll=unroll)


def bench_gather(row_bytes: int, sizes: list[int], *, src_rows: int, dst_rows: int, mode: str = "pull",
                 unrolls=(8,), seed: int = 0, repeat: int = 20, bulk: bool = False) -> list[dict]:
    """Scattered row gather into a local buffer on GPU 0.

    mode "local": source pool on GPU 0; "pull": source on GPU 1, kernel on GPU 0 reads over NVLink; "push": kernel
    on GPU 1 reads its pool and writes into GPU 0's buffer; "h2d": source in pinned host memory."""
    from ulacache.backends.cupy_copy import HostPool, gather_rows, gather_rows_bulk

    cp = cupy()
    rng = np.random.default_rng(seed)
    if bulk:
        unrolls = (0,)
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
                if bulk:
                    fn = _rotating(lambda i: gather_rows_bulk(dst, src, ds[i], ss[i], row_bytes))
                else:
                    fn = _rotating(lambda i, u=u: gather_rows(dst, src, ds[i], ss[i], row_bytes, unroll=u))
                t = time_gpu(fn, repeat=repeat, inner=_inner(n, row_bytes))
                out.append({"row_bytes": row_bytes, "num_rows": n, "mode": mode + ("_bulk" if bulk else ""),
                            "unroll": u,
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


def bench_node(row_bytes: int, sizes: list[int], *, gpus: list[int], op: str, host_rows: int, gpu_rows: int,
               all_gpus: int | None = None, seed: int = 0, repeat: int = 7) -> list[dict]:
    """The same transfer on each GPU of `gpus` at once (a node where those ranks exchange together). Per GPU its own
    pinned host pool and GPU pool. op: "read_only" (exchange into free slots: PCIe reads), "swap" (fused swap
    exchange: reads + victim write-backs), "split" (stage victims in HBM, read, write back; one stream), "peer_all"
    (each GPU gathers the rows evenly from every other GPU of `gpus`, one gather per peer). GPU 0 spins while the
    host enqueues; every GPU waits on an event recorded after the spin, so all start together. Returns per point the
    slowest GPU's time (a step waits for it) and every GPU's own."""
    cp = cupy()
    rng = np.random.default_rng(seed)
    if op == "peer_all":
        if len(gpus) < 2:
            raise ValueError("peer_all needs at least 2 GPUs")
        enable_peer_access(all_gpus or max(gpus) + 1)
    pools = _node_pools(gpus, op, row_bytes, host_rows, gpu_rows, max(sizes))
    out = []
    for n in sizes:
        idx = {}
        for g in gpus:
            with cp.cuda.Device(g):
                idx[g] = (_index_sets(rng, gpu_rows, n), _index_sets(rng, host_rows, n),
                          cp.full(n, 1 if op in ("swap", "split") else 0, dtype=cp.uint8), cp.arange(n, dtype=cp.int64))
                cp.cuda.Device(g).synchronize()
        inner = _inner(n, row_bytes)
        samples, per = [], []
        for rep in range(repeat + 1):
            ends = _node_repeat(gpus, pools, idx, op, n, row_bytes, inner, rep)
            for g in gpus:
                pools[g][2].synchronize()
            if rep:
                t = [cp.cuda.get_elapsed_time(a, b) * 1e-3 / inner for a, b in ends]
                samples.append(max(t))
                per.append(t)
        t = float(np.median(samples))
        per_gpu = [float(x) for x in np.median(np.array(per), axis=0)]
        out.append({"row_bytes": row_bytes, "num_rows": n, "op": op, "num_gpus": len(gpus), "gpus": list(gpus),
                    "time_s": t, "per_gpu_s": per_gpu, "gb_s_per_gpu": n * row_bytes / t / 1e9,
                    "gb_s_by_gpu": [n * row_bytes / x / 1e9 for x in per_gpu]})
    return out


def _node_pools(gpus: list[int], op: str, row_bytes: int, host_rows: int, gpu_rows: int, max_rows: int) -> dict:
    """Per GPU: its GPU pool, the source (a peer-readable GPU array for peer_all, else its pinned host pool), a
    stream and a staging buffer; non-zero patterns (cheap to make; a copy does not care which bytes)."""
    from ulacache.backends.cupy_copy import HostPool

    cp = cupy()
    pools = {}
    for g in gpus:
        with cp.cuda.Device(g):
            gpu = (cp.arange(gpu_rows * row_bytes, dtype=cp.int64) * 7 + g).astype(cp.uint8).reshape(gpu_rows, -1)
            if op == "peer_all":
                src = (cp.arange(host_rows * row_bytes, dtype=cp.int64) * 5 + 1).astype(cp.uint8).reshape(host_rows,
                                                                                                          -1)
            else:
                src = HostPool(host_rows, row_bytes)
                src.array.reshape(-1)[:] = np.arange(src.array.size, dtype=np.int64).astype(np.uint8) | 1
            pools[g] = (gpu, src, cp.cuda.Stream(non_blocking=True), cp.empty((max_rows, row_bytes), cp.uint8))
            cp.cuda.Device(g).synchronize()  # made on the default stream; the timed streams do not wait for it
    return pools


def _node_repeat(gpus: list[int], pools: dict, idx: dict, op: str, n: int, row_bytes: int, inner: int,
                 rep: int) -> list[tuple]:
    """One repeat: GPU 0 spins while the host enqueues `inner` transfers of `op` on every GPU, all released by one
    event; each GPU's (start, end) events."""
    from ulacache.backends.cupy_copy import exchange_rows, gather_rows
    from ulacache.backends.cupy_pipeline import spin

    cp = cupy()
    g0 = gpus[0]
    with cp.cuda.Device(g0), pools[g0][2]:
        spin(2_000_000)
        go = pools[g0][2].record()
    ends = []
    for g in gpus:
        gpu, src, s, stage = pools[g]
        with cp.cuda.Device(g), s:
            s.wait_event(go)
            a = s.record()
            gi, hi, vic, ar = idx[g]
            peers = [h for h in gpus if h != g]
            for k in range(inner):
                i = (rep * inner + k) % NUM_SETS
                if op == "peer_all":
                    for j, h in enumerate(peers):  # an even share of the rows from each peer
                        lo, hi_ = j * n // len(peers), (j + 1) * n // len(peers)
                        gather_rows(gpu, pools[h][1], gi[i][lo:hi_], hi[i][lo:hi_], row_bytes, unroll=4, stream=s)
                elif op == "split":
                    _stage_and_read(gpu, src, gi[i], hi[i], stage, row_bytes, 4)
                    gather_rows(src, stage, hi[i], ar, row_bytes, unroll=4, stream=s)
                else:
                    exchange_rows(gpu, src, gi[i], hi[i], vic, row_bytes, unroll=4, stream=s)
            ends.append((a, s.record()))
    return ends


def bench_gather_after_exchange(row_bytes: int, gather_sizes: list[int], *, gpus: list[int], exchange_sizes: list[int],
                                host_rows: int, gpu_rows: int, seed: int = 0, repeat: int = 7) -> list[dict]:
    """A TP step's order on the first k of `gpus` at once (k = 2..len(gpus)): every GPU runs a fused swap exchange
    of `exchange_rows` rows with its own pinned pool; then (each GPU waiting on every exchange) every GPU gathers n
    rows evenly from its peers' pools (one gather per peer, reading rows that peer just promoted), and right after
    that the same number of other rows again (the warm control: the all-to-all microbenchmark's regime). Per point
    (slowest GPU, median over repeats): `after_s` the first gathers, `warm_s` the second, `wait_s` the event wait
    before them; per GPU too. Pools are made once for all points."""
    cp = cupy()
    if len(gpus) < 2:
        raise ValueError("a gather after an exchange needs at least 2 GPUs")
    if max(exchange_sizes) > min(host_rows, gpu_rows) or max(gather_sizes) > gpu_rows:
        raise ValueError(f"sizes exceed the pools ({host_rows} host, {gpu_rows} GPU rows)")
    rng = np.random.default_rng(seed)
    enable_peer_access(max(gpus) + 1)
    pools = _exchange_pools(gpus, row_bytes, host_rows, gpu_rows, max(gather_sizes))
    draw = lambda pool, n: [rng.choice(pool, n, replace=False).astype(np.int64) for _ in range(NUM_SETS)]
    dev = lambda arrays: [cp.asarray(a) for a in arrays]  # index lists live on the GPU whose kernel reads them
    out = []
    for ex_rows in exchange_sizes:
        slots = {g: draw(gpu_rows, ex_rows) for g in gpus}  # the GPU slots each GPU's exchange promotes into
        ex, promoted = {}, {}
        for g in gpus:
            with cp.cuda.Device(g):
                ex[g] = (dev(slots[g]), dev(draw(host_rows, ex_rows)), cp.ones(ex_rows, cp.uint8))
                promoted[g] = {h: dev(slots[h]) for h in gpus if h != g}
                cp.cuda.Device(g).synchronize()
        for k in range(2, len(gpus) + 1):
            sub = gpus[:k]
            for n in gather_sizes:
                per_peer = [(j * n // (k - 1), (j + 1) * n // (k - 1)) for j in range(k - 1)]
                if max(b - a for a, b in per_peer) > ex_rows:
                    continue  # more rows from a peer than it promoted
                idx = {}
                for g in sub:
                    with cp.cuda.Device(g):
                        idx[g] = (dev([rng.permutation(n).astype(np.int64) for _ in range(NUM_SETS)]),
                                  dev(draw(gpu_rows, n)))
                        cp.cuda.Device(g).synchronize()
                steps = (pools, ex, promoted, idx, per_peer)
                med, per_gpu = _time_gather_after_exchange(sub, steps, row_bytes, repeat)
                out.append({"row_bytes": row_bytes, "num_rows": n, "op": "gather_after_exchange", "num_gpus": k,
                            "gpus": list(sub), "exchange_rows": ex_rows, "host_rows": host_rows,
                            "gpu_rows": gpu_rows, "wait_s": float(med[0]), "after_s": float(med[1]),
                            "warm_s": float(med[2]), "after_s_by_gpu": [float(x) for x in per_gpu[:, 1]],
                            "warm_s_by_gpu": [float(x) for x in per_gpu[:, 2]]})
    return out


def _exchange_pools(gpus: list[int], row_bytes: int, host_rows: int, gpu_rows: int, max_gather: int) -> dict:
    """Per GPU: its pool (any non-zero bytes: a copy does not care which), a gather buffer, its pinned host pool
    and a stream."""
    from ulacache.backends.cupy_copy import HostPool

    cp = cupy()
    pools = {}
    for g in gpus:
        with cp.cuda.Device(g):
            gpu = cp.full((gpu_rows, row_bytes), g + 1, dtype=cp.uint8)
            buf = cp.zeros((max_gather, row_bytes), cp.uint8)
            host = HostPool(host_rows, row_bytes)
            host.array.fill(0x5A)
            pools[g] = (gpu, buf, host, cp.cuda.Stream(non_blocking=True))
            cp.cuda.Device(g).synchronize()
    return pools


def _time_gather_after_exchange(sub: list[int], steps: tuple, row_bytes: int, repeat: int):
    """Median over `repeat` timed repeats (after one untimed) of (wait, gathers after, warm gathers): of the slowest
    GPU, and per GPU."""
    cp = cupy()
    pools = steps[0]
    samples, per = [], []
    for rep in range(repeat + 1):
        marks = _exchange_then_gather(sub, steps, row_bytes, rep % NUM_SETS)
        for g in sub:
            pools[g][3].synchronize()
        if rep:
            t = lambda x, y: cp.cuda.get_elapsed_time(x, y) * 1e-3
            row = [(t(w0, a), t(a, b), t(b, c)) for w0, a, b, c in marks]
            per.append(row)
            samples.append([max(r[j] for r in row) for j in range(3)])
    return np.median(np.array(samples), axis=0), np.median(np.array(per), axis=0)


def _exchange_then_gather(sub: list[int], steps: tuple, row_bytes: int, i: int) -> list[tuple]:
    """One repeat on index set i: every GPU of `sub` exchanges (all released at once after a spin on the first),
    then gathers what its peers promoted, then the warm control; each GPU's four events."""
    from ulacache.backends.cupy_copy import exchange_rows as exchange
    from ulacache.backends.cupy_copy import gather_rows
    from ulacache.backends.cupy_pipeline import spin

    cp = cupy()
    pools, ex, promoted, idx, per_peer = steps
    with cp.cuda.Device(sub[0]), pools[sub[0]][3]:
        spin(6_000_000)  # longer than the host takes to enqueue every GPU's work: no launch gaps
        go = pools[sub[0]][3].record()
    exchanged = {}
    for g in sub:
        gpu, _, host, s = pools[g]
        with cp.cuda.Device(g), s:
            s.wait_event(go)
            exchange(gpu, host, ex[g][0][i], ex[g][1][i], ex[g][2], row_bytes, unroll=4, stream=s)
            exchanged[g] = s.record()
    marks = []
    for g in sub:
        _, buf, _, s = pools[g]
        dst, warm_src = idx[g]
        peers = [h for h in sub if h != g]
        with cp.cuda.Device(g), s:
            w0 = s.record()
            for h in peers:
                s.wait_event(exchanged[h])
            a = s.record()
            for (lo, hi), h in zip(per_peer, peers):  # rows peer h just promoted (its GPU slots)
                gather_rows(buf, pools[h][0], dst[i][lo:hi], promoted[g][h][i][:hi - lo], row_bytes, unroll=4,
                            stream=s)
            b = s.record()
            for (lo, hi), h in zip(per_peer, peers):  # warm control: other rows of the same pools
                gather_rows(buf, pools[h][0], dst[i][lo:hi], warm_src[i][lo:hi], row_bytes, unroll=4, stream=s)
            marks.append((w0, a, b, s.record()))
    return marks
