"""HiSparse's per-layer swap-in on the GPU (hw/hisparse.cu, shaped like SGLang's `load_cache_to_device_buffer`),
its numpy reference, and the timing that calibrates the simulator's HiSparse transfer model.

State per request b (docs/architecture.md): `buf_tok[b, slot]` token held by each of the H LRU slots (-1 = empty) plus slot H
for the newest token; `lru[b]` the slot order, least recent first; `dev_locs[b, slot]` the device-buffer row of a
slot; `host_locs[b, token]` the pinned-host row of a token. `swapin_reference` is the oracle the kernel must equal
bit for bit (state, output slots, miss counts and the copied bytes).
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

_SOURCE = Path(__file__).with_name("hisparse.cu")
VEC_BYTES = 16


@dataclasses.dataclass
class SwapState:
    """Numpy (or cupy) arrays of one layer's HiSparse device buffers for B requests."""

    buf_tok: np.ndarray    # int32 [B, H + 1]
    lru: np.ndarray        # int32 [B, H]
    dev_locs: np.ndarray   # int32 [B, H + 1]
    host_locs: np.ndarray  # int64 [B, S]
    seq_lens: np.ndarray   # int64 [B]

    @property
    def buffer_slots(self) -> int:
        return int(self.lru.shape[1])


def init_state(seq_lens, buffer_slots: int, history_cap: int, seed: int = 0) -> SwapState:
    """Empty buffers (the newest token in slot H), device rows b*(H+1)+slot, host rows a random permutation."""
    rng = np.random.default_rng(seed)
    seq = np.asarray(seq_lens, dtype=np.int64)
    B, H = seq.size, int(buffer_slots)
    buf = np.full((B, H + 1), -1, dtype=np.int32)
    buf[:, H] = seq - 1
    return SwapState(buf_tok=buf, lru=np.tile(np.arange(H, dtype=np.int32), (B, 1)),
                     dev_locs=np.arange(B * (H + 1), dtype=np.int32).reshape(B, H + 1),
                     host_locs=rng.permutation(B * history_cap).astype(np.int64).reshape(B, history_cap),
                     seq_lens=seq)


def swapin_reference(st: SwapState, topk: np.ndarray, host_rows: np.ndarray | None = None,
                     dev_rows: np.ndarray | None = None, plan: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One swap-in of top-k [B, K] (distinct positions in [0, L)); updates `st` (and copies rows into `dev_rows`
    when given; fills `plan` = (host row, device row) arrays [B, K] per miss in miss order when given).
    Returns (out_locs int32 [B, K]: device row serving each entry, miss_count int32 [B])."""
    B, K = topk.shape
    H = st.buffer_slots
    out = np.empty((B, K), dtype=np.int32)
    misses = np.zeros(B, dtype=np.int32)
    for b in range(B):  # one block per request in the kernel
        L, tk, dloc = int(st.seq_lens[b]), topk[b].astype(np.int64), st.dev_locs[b]
        if L <= H:
            out[b] = dloc[tk]
            continue
        newest = tk == L - 1
        out[b, newest] = dloc[H]
        slots = st.lru[b].copy()
        toks = st.buf_tok[b, slots].astype(np.int64)
        sorter = np.argsort(tk, kind="stable")
        pos = np.minimum(np.searchsorted(tk[sorter], toks), K - 1)
        idx = sorter[pos]
        found = (tk[idx] == toks) & (toks >= 0) & (toks != L - 1)
        hit_slots = slots[found]
        out[b, idx[found]] = dloc[hit_slots]
        served = newest.copy()
        served[idx[found]] = True
        miss_idx = np.flatnonzero(~served)
        M = miss_idx.size
        evict = slots[~found]
        use = evict[:M]
        st.buf_tok[b, use] = tk[miss_idx]
        out[b, miss_idx] = dloc[use]
        st.lru[b] = np.concatenate([evict[M:], use, hit_slots])
        misses[b] = M
        if plan is not None:
            plan[0][b, :M] = st.host_locs[b, tk[miss_idx]]
            plan[1][b, :M] = dloc[use]
        if dev_rows is not None:
            dev_rows[dloc[use]] = host_rows[st.host_locs[b, tk[miss_idx]]]
    return out, misses


class TopkStream:
    """Per request a top-k set of distinct positions that keeps a fraction `keep` of itself each step (docs/architecture.md:
    ~44% exact overlap between consecutive steps' top-2048 in layers 20-60); the rest is drawn fresh."""

    def __init__(self, seq_lens, top_k: int, keep: float, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.seq = np.asarray(seq_lens, dtype=np.int64)
        self.k, self.keep = int(top_k), float(keep)
        self.cur = np.stack([self.rng.choice(int(s), size=self.k, replace=False) for s in self.seq])

    def step(self) -> np.ndarray:
        rng = self.rng
        for b, L in enumerate(self.seq.tolist()):  # loop over requests (distinct draws per request)
            kept = self.cur[b][rng.random(self.k) < self.keep]
            taken = np.zeros(L, dtype=bool)
            taken[kept] = True
            cand = rng.permutation(L)
            fresh = cand[~taken[cand]][: self.k - kept.size]
            self.cur[b] = rng.permutation(np.concatenate([kept, fresh]))
        return self.cur.astype(np.int32)


# ---------------------------------------------------------------------------------------------------- device side
@functools.lru_cache(maxsize=None)
def _kernels_on(device_id: int):
    import cupy as cp

    mod = cp.RawModule(code=_SOURCE.read_text(), options=("-std=c++17",))
    return mod.get_function("hisparse_swapin"), mod.get_function("hisparse_copy_planned")


def planned_copy_reference(plan_src: np.ndarray, plan_dst: np.ndarray, miss: np.ndarray, host_rows: np.ndarray,
                           dev_rows: np.ndarray) -> None:
    """A skip layer's IO: copy each request's recorded misses (host row -> device row) into its own buffers."""
    for b, m in enumerate(miss.tolist()):
        dev_rows[plan_dst[b, :m]] = host_rows[plan_src[b, :m]]


PLANNED_COPY_BLOCKS = 4   # SGLang's `_prefetch_copy_blocks`
PLANNED_COPY_THREADS = 1024


def smem_bytes(top_k: int, buffer_slots: int) -> int:
    return 4 * (6 * top_k + buffer_slots + 32)


class DeviceSwapIn:
    """The kernel over cupy copies of a SwapState, a pinned host pool and a device buffer pool."""

    def __init__(self, st: SwapState, host_pool, dev_rows, row_bytes: int, top_k: int, block: int = 256):
        import cupy as cp

        if row_bytes % VEC_BYTES:
            raise ValueError(f"row_bytes={row_bytes} must be a multiple of {VEC_BYTES}")
        H = st.buffer_slots
        if block % 32 or H > 32 * block or top_k > 32 * block or top_k > H:
            raise ValueError(f"block={block}: needs H={H} and top_k={top_k} <= 32 * block, top_k <= H")
        self.cp, self.rb, self.K, self.H, self.block = cp, row_bytes, top_k, H, block
        self.buf_tok, self.lru = cp.asarray(st.buf_tok), cp.asarray(st.lru)
        self.dev_locs, self.host_locs = cp.asarray(st.dev_locs), cp.asarray(st.host_locs)
        self.seq_lens = cp.asarray(st.seq_lens)
        self.host, self.dev = host_pool, dev_rows
        B = st.seq_lens.size
        self.B = B
        self.out = cp.zeros((B, top_k), dtype=cp.int32)
        self.miss = cp.zeros(B, dtype=cp.int32)
        self.topk = cp.zeros((B, top_k), dtype=cp.int32)
        self.plan_src = cp.zeros((B, top_k), dtype=cp.int64)
        self.plan_dst = cp.zeros((B, top_k), dtype=cp.int32)
        self.fn, self.copy_fn = _kernels_on(cp.cuda.Device().id)
        self.smem = smem_bytes(top_k, H)
        self.fn.max_dynamic_shared_size_bytes = self.smem

    def set_topk(self, topk: np.ndarray) -> None:
        self.topk[...] = self.cp.asarray(topk, dtype=self.cp.int32)

    def launch(self, skip_io: bool = False, stream=None, record_plan: bool = False) -> None:
        """The fused swap-in (one block per request); with `record_plan` it also writes the miss plan."""
        from ulacache.backends.cupy_copy import ptr_of

        cp = self.cp
        plan = (self.plan_src, self.plan_dst) if record_plan else (np.uint64(0), np.uint64(0))
        with stream or cp.cuda.get_current_stream():
            self.fn((self.B,), (self.block,),
                    (self.topk, self.seq_lens, self.buf_tok, self.lru, self.dev_locs, self.host_locs,
                     np.int64(self.host_locs.shape[1]), np.uint64(ptr_of(self.host)), np.uint64(ptr_of(self.dev)),
                     self.out, self.miss, np.int32(self.K), np.int32(self.H), np.int32(self.rb // VEC_BYTES),
                     np.int32(1 if skip_io else 0), *plan, np.int32(self.K)),
                    shared_mem=self.smem)

    def launch_planned_copy(self, dev_rows, stream=None, blocks: int = PLANNED_COPY_BLOCKS) -> None:
        """Replay the recorded plan into another layer's device rows (`dev_rows`): SGLang's skip-layer IO."""
        from ulacache.backends.cupy_copy import ptr_of

        cp = self.cp
        with stream or cp.cuda.get_current_stream():
            self.copy_fn((blocks,), (PLANNED_COPY_THREADS,),
                         (self.plan_src, self.plan_dst, self.miss, np.int32(self.B), np.int32(self.K),
                          np.uint64(ptr_of(self.host)), np.uint64(ptr_of(dev_rows)), np.int32(self.rb // VEC_BYTES)))

    def snapshot(self):
        return self.buf_tok.copy(), self.lru.copy()

    def restore(self, snap) -> None:
        self.buf_tok[...] = snap[0]
        self.lru[...] = snap[1]

    def differences(self, st: SwapState, out: np.ndarray, miss: np.ndarray) -> list[str]:
        """What differs from the numpy reference after the same step (empty = bit-identical)."""
        got = {"buf_tok": self.buf_tok.get(), "lru": self.lru.get(), "out_locs": self.out.get(),
               "miss_count": self.miss.get()}
        want = {"buf_tok": st.buf_tok, "lru": st.lru, "out_locs": out, "miss_count": miss}
        return [f"{k} differs" for k in got if not np.array_equal(got[k], want[k])]
