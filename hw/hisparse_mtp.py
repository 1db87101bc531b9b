"""HiSparse's speculative (MTP verify) swap-in as SGLang runs it (hw/hisparse_mtp.cu, shaped like SGLang's
`hisparse_mtp_swap.cuh`): one plan for all verify steps of a layer, unique misses, a sampled-CLOCK replacement and a
multi-block gather, in two launches (gather, commit). This file holds the numpy reference (the oracle) and the cupy
driver of the kernels.

State per request b: H hot slots (`buf_tok[b, :H]` token or -1, `dev_locs[b, :H]` their device rows, `ref[b]` the
epoch each slot was last referenced in) plus an extra page of P slots `buf_tok[b, H:]` holding the newest tokens;
`scratch_locs[b]` T = steps * top_k spare device rows; `epoch[b]` / `cursor[b]` the CLOCK state; `host_locs[b, t]`
the pinned-host row of token t. One call with selections `topk[b, steps, K]`:
  1. gather: each occurrence (step s, entry k) resolves to the extra page (token >= seq_s - P and on the page), a hot
     hit (its slot gets the current epoch) or a miss. Misses are deduplicated over all steps; each unique miss is
     copied once from pinned host into a scratch row; every occurrence gets its device row.
  2. commit: with M unique misses and U distinct hot hits, if M + U <= H every miss i (ordinal = order of first
     occurrence) takes the oldest-epoch unreferenced slot among <= 6 samples of its own partition of the ring
     (slots cursor + i + j*M); else (overflow) all epochs are cleared, the last step's hits re-marked and only the
     last step's misses admitted, at hashed victims. A victim slot takes over the miss's scratch row (no second
     copy) and the scratch entry gets the victim's old row. The cursor advances by min(M, H).
Differences from SGLang, on purpose and stated: the token -> slot index is a direct table (SGLang: a two-table
hash); scratch holds one row per occurrence (SGLang's scratch-overflow path never triggers); the ordinal of a miss is
the order of its first occurrence (SGLang: the order its claim won, racy) and the rare global fallback probe runs in
ordinal order (SGLang: concurrent CAS). Which scratch row a miss lands in follows the claim order, as in SGLang, so
the reference and the kernel agree on slots, tokens, epochs and every row's bytes, not on physical row names.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

_SOURCE = Path(__file__).with_name("hisparse_mtp.cu")
KNUTH = 2654435761
MASK32 = 0xFFFFFFFF
CLOCK_SAMPLES = 6
GATHER_BLOCK = 64
COMMIT_BLOCK = 512


def epoch_mask(H: int) -> int:
    """SGLang's packed ring state: cursor bits = ceil(log2 H), epoch bits = min(23, 32 - cursor bits)."""
    cursor_bits = max(1, (int(H) - 1).bit_length())
    return (1 << min(23, 32 - cursor_bits)) - 1


def next_epoch(epoch: int, H: int) -> int:
    e = (int(epoch) + 1) & epoch_mask(H)
    return e if e else 1


@dataclasses.dataclass
class MtpState:
    """Numpy (or cupy) arrays of one layer's MTP swap-in state for B requests."""

    buf_tok: np.ndarray       # int32 [B, H + P]
    dev_locs: np.ndarray      # int32 [B, H + P]
    ref: np.ndarray           # int32 [B, H]
    epoch: np.ndarray         # int32 [B]
    cursor: np.ndarray        # int32 [B]
    scratch_locs: np.ndarray  # int32 [B, T]
    host_locs: np.ndarray     # int64 [B, S]
    seq_lens: np.ndarray      # int64 [B]: L, tokens before the verify steps
    steps: int
    page: int

    @property
    def hot(self) -> int:
        return int(self.ref.shape[1])

    @property
    def scratch(self) -> int:
        return int(self.scratch_locs.shape[1])

    def seq_steps(self) -> np.ndarray:
        """Per request and step the attended length: step s verifies position L + s and sees tokens < L + s + 1."""
        return self.seq_lens[:, None] + np.arange(1, self.steps + 1)[None, :]


def init_mtp_state(seq_lens, hot: int, page: int, steps: int, top_k: int, history_cap: int,
                   seed: int = 0) -> MtpState:
    """Empty hot rings; the extra page holds positions [L + steps - page, L + steps); device rows numbered per
    request [hot | page | scratch]; host rows a random permutation."""
    rng = np.random.default_rng(seed)
    seq = np.asarray(seq_lens, dtype=np.int64)
    B, H, P, T = seq.size, int(hot), int(page), int(steps) * int(top_k)
    if (seq + steps > history_cap).any() or (seq + steps - P < 0).any():
        raise ValueError("history_cap must hold L + steps tokens and L + steps >= page")
    buf = np.full((B, H + P), -1, dtype=np.int32)
    buf[:, H:] = (seq + steps - P)[:, None] + np.arange(P)[None, :]
    rows = np.arange(B * (H + P + T), dtype=np.int32).reshape(B, H + P + T)
    return MtpState(buf_tok=buf, dev_locs=rows[:, :H + P].copy(), ref=np.zeros((B, H), np.int32),
                    epoch=np.zeros(B, np.int32), cursor=np.zeros(B, np.int32), scratch_locs=rows[:, H + P:].copy(),
                    host_locs=rng.permutation(B * history_cap).astype(np.int64).reshape(B, history_cap),
                    seq_lens=seq, steps=int(steps), page=P)


def _resolve(st: MtpState, b: int, tk: np.ndarray):
    """Classify the flattened occurrences of request b: (page slot or -1, hot slot or -1, valid mask)."""
    H, P = st.hot, st.page
    seq_s = np.repeat(st.seq_steps()[b], tk.size // st.steps)
    valid = (tk >= 0) & (tk < seq_s)
    page_tok = st.buf_tok[b, H:]
    near = valid & (tk >= seq_s - P)
    pslot = np.full(tk.size, -1, np.int64)
    for j in range(P):  # the extra page is small (a linear search, as SGLang's generic page loop)
        pslot[near & (pslot < 0) & (tk == page_tok[j])] = H + j
    slot_of = np.full(int(st.host_locs.shape[1]), -1, np.int64)
    held = st.buf_tok[b, :H]
    slot_of[held[held >= 0]] = np.flatnonzero(held >= 0)
    hslot = np.where(valid & (pslot < 0), slot_of[np.clip(tk, 0, slot_of.size - 1)], -1)
    return pslot, hslot, valid


def _clock_victims(ref: np.ndarray, order_n: int, M: int, cursor: int, epoch: int, H: int) -> list[int]:
    """Union path: per miss ordinal the oldest unreferenced slot among <= 6 samples of its ring partition."""
    mask, out = epoch_mask(H), []
    for i in range(order_n):  # partitions are disjoint: this order equals the kernel's parallel choice
        part = (H - 1 - i) // M + 1
        ns = min(part, CLOCK_SAMPLES)
        best, oldest = -1, 0
        for s in range(ns):
            cand = (cursor + i + (s * part // ns) * M) % H
            r = int(ref[cand])
            if r == epoch:
                continue
            age = (epoch - r) & mask
            if best < 0 or age > oldest:
                best, oldest = cand, age
        if best >= 0:
            ref[best] = epoch
        out.append(best)
    return out


def _hashed_victims(ref: np.ndarray, admitted: list[bool], M: int, epoch: int, H: int) -> list[int]:
    """Overflow path: admitted miss ordinal i probes (lin * KNUTH + epoch) mod 2^32 mod H for lin = i, i + M, ..."""
    out = []
    for i, adm in enumerate(admitted):
        v = -1
        if adm:
            for lin in range(i, H, M):
                cand = (((lin * KNUTH) & MASK32) + epoch) & MASK32
                cand %= H
                if ref[cand] != epoch:
                    ref[cand], v = epoch, cand
                    break
        out.append(v)
    return out


def _fallback(ref: np.ndarray, victims: list[int], rotating: list[bool], cursor: int, epoch: int, H: int) -> None:
    """A rotating miss whose samples were all referenced probes the whole ring (in ordinal order)."""
    for i, v in enumerate(victims):
        if v >= 0 or not rotating[i]:
            continue
        start = ((cursor + ((i * KNUTH) & MASK32)) & MASK32) % H
        for a in range(H):
            cand = ((start + ((a * KNUTH) & MASK32)) & MASK32) % H
            if ref[cand] != epoch:
                ref[cand] = epoch
                victims[i] = cand
                break


def mtp_swapin_reference(st: MtpState, topk: np.ndarray, host_rows: np.ndarray | None = None,
                         dev_rows: np.ndarray | None = None):
    """One MTP swap-in of `topk` [B, steps, K]; updates `st` (and copies rows into `dev_rows` when given).
    Returns (out_locs int32 [B, steps, K] (-1 for invalid entries), miss_count int32 [B], union_hits int32 [B])."""
    B, steps, K = topk.shape
    H = st.hot
    out = np.full((B, steps * K), -1, dtype=np.int32)
    misses, union = np.zeros(B, np.int32), np.zeros(B, np.int32)
    for b in range(B):  # one request per commit block in the kernel
        tk = topk[b].reshape(-1).astype(np.int64)
        epoch = next_epoch(st.epoch[b], H)
        cursor = int(st.cursor[b])
        pslot, hslot, valid = _resolve(st, b, tk)
        out[b, pslot >= 0] = st.dev_locs[b, pslot[pslot >= 0]]
        hit = hslot >= 0
        out[b, hit] = st.dev_locs[b, hslot[hit]]
        hit_slots = np.unique(hslot[hit])
        st.ref[b, hit_slots] = epoch
        miss = valid & (pslot < 0) & ~hit
        uniq, first = np.unique(tk[miss], return_index=True)
        order = np.argsort(np.flatnonzero(miss)[first], kind="stable")
        toks = uniq[order]  # unique misses by first occurrence: ordinal i
        M, U = toks.size, hit_slots.size
        ordinal = {int(t): i for i, t in enumerate(toks)}
        miss_pos = np.flatnonzero(miss)
        ords = np.array([ordinal[int(t)] for t in tk[miss_pos]], dtype=np.int64)
        out[b, miss_pos] = st.scratch_locs[b, ords]
        if dev_rows is not None and M:
            dev_rows[st.scratch_locs[b, :M]] = host_rows[st.host_locs[b, toks]]
        misses[b], union[b] = M, U
        if M:
            _commit(st, b, tk, toks, hslot, epoch, cursor, M, U)
        st.epoch[b] = epoch
    return out.reshape(B, steps, K), misses, union


def _commit(st: MtpState, b: int, tk, toks, hslot, epoch: int, cursor: int, M: int, U: int) -> None:
    H, K = st.hot, tk.size // st.steps
    ref = st.ref[b]
    if M + U <= H:
        rotating = [True] * M
        victims = _clock_victims(ref, M, M, cursor, epoch, H)
    else:
        ref[:] = 0
        last = slice((st.steps - 1) * K, st.steps * K)
        lh = hslot[last]
        ref[lh[lh >= 0]] = epoch
        in_last = set(tk[last].tolist())
        rotating = [int(t) in in_last for t in toks]
        victims = _hashed_victims(ref, rotating, M, epoch, H)
    _fallback(ref, victims, rotating, cursor, epoch, H)
    for i, v in enumerate(victims):
        if v < 0:
            continue
        old = int(st.dev_locs[b, v])
        st.dev_locs[b, v] = st.scratch_locs[b, i]
        st.scratch_locs[b, i] = old
        st.buf_tok[b, v] = toks[i]
        ref[v] = epoch
    st.cursor[b] = (cursor + min(M, H)) % H


class VerifyTopkStream:
    """Per request the verify steps' top-k sets: step 0 keeps `keep` of the previous call's step 0 (decode-to-decode
    locality, docs/architecture.md: ~0.44), each later step keeps `step_overlap` of step 0's set (as the simulator's synthetic
    traces reuse query 0's draw with probability `spec_share`, 0.6 in traces/profiles/multi-lexsum.yaml); the rest is
    drawn fresh from the tokens that step may attend. Entries within one step are distinct."""

    def __init__(self, seq_lens, top_k: int, steps: int, keep: float, step_overlap: float, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.seq = np.asarray(seq_lens, dtype=np.int64)
        self.k, self.steps, self.keep, self.overlap = int(top_k), int(steps), float(keep), float(step_overlap)
        self.prev = [None] * self.seq.size

    def _draw(self, base, frac: float, limit: int) -> np.ndarray:
        rng = self.rng
        kept = base[rng.random(base.size) < frac] if base is not None else np.zeros(0, np.int64)
        kept = kept[kept < limit]
        taken = np.zeros(limit, dtype=bool)
        taken[kept] = True
        cand = rng.permutation(limit)
        fresh = cand[~taken[cand]][: self.k - kept.size]
        return rng.permutation(np.concatenate([kept, fresh]))

    def step(self) -> np.ndarray:
        out = np.empty((self.seq.size, self.steps, self.k), dtype=np.int32)
        for b, L in enumerate(self.seq.tolist()):  # loop over requests (distinct draws per request)
            first = self._draw(self.prev[b], self.keep, L + 1)
            out[b, 0] = first
            for s in range(1, self.steps):
                out[b, s] = self._draw(first, self.overlap, L + s + 1)
            self.prev[b] = out[b, 0].astype(np.int64)
        return out


# ---------------------------------------------------------------------------------------------------- device side
@functools.lru_cache(maxsize=None)
def _kernels_on(device_id: int):
    import cupy as cp

    mod = cp.RawModule(code=_SOURCE.read_text(), options=("-std=c++17",))
    return mod.get_function("hisparse_mtp_gather"), mod.get_function("hisparse_mtp_commit")


def commit_smem_bytes(scratch: int) -> int:
    """Commit kernel shared memory: prefix[T] + inverse order[T] + victims[T] (int32) + admit flags[T] + warp sums."""
    return 4 * 3 * scratch + 4 * 40 + scratch


class DeviceMtpSwapIn:
    """The gather + commit kernels over cupy copies of an MtpState, a pinned host pool and a device row pool."""

    def __init__(self, st: MtpState, host_pool, dev_rows, row_bytes: int, top_k: int):
        import cupy as cp

        from hw.hisparse import VEC_BYTES

        if row_bytes % VEC_BYTES:
            raise ValueError(f"row_bytes={row_bytes} must be a multiple of {VEC_BYTES}")
        B, H, T = st.seq_lens.size, st.hot, st.scratch
        if T != st.steps * top_k or top_k > H or T > 8192 or not 1 < st.steps <= 4:
            raise ValueError("MTP swap-in needs 2..4 steps, top_k <= hot and steps * top_k <= 8192 (SGLang's limits)")
        self.cp, self.rb, self.K, self.B, self.H, self.T, self.P = cp, row_bytes, top_k, B, H, T, st.page
        self.steps, self.S = st.steps, int(st.host_locs.shape[1])
        self.buf_tok, self.dev_locs, self.ref = (cp.asarray(a) for a in (st.buf_tok, st.dev_locs, st.ref))
        self.epoch, self.cursor = cp.asarray(st.epoch), cp.asarray(st.cursor)
        self.scratch_locs, self.host_locs = cp.asarray(st.scratch_locs), cp.asarray(st.host_locs)
        self.seq_steps = cp.asarray(st.seq_steps().astype(np.int64))
        slot_of = np.full((B, self.S), -1, np.int32)  # token -> hot slot (the kernels keep it in step)
        for b in range(B):
            held = st.buf_tok[b, :H]
            slot_of[b, held[held >= 0]] = np.flatnonzero(held >= 0)
        self.slot_of = cp.asarray(slot_of)
        self.scr_key = cp.zeros((B, T), dtype=cp.uint64)
        self.scr_idx = cp.zeros((B, T), dtype=cp.uint64)
        self.scr_first = cp.zeros((B, T), dtype=cp.int32)
        self.compact = cp.zeros((B, T), dtype=cp.int32)
        self.counters = cp.zeros((B, 3), dtype=cp.int32)  # work count, union hits, scratch epoch
        self.miss, self.union = cp.zeros(B, dtype=cp.int32), cp.zeros(B, dtype=cp.int32)
        self.topk = cp.zeros((B, T), dtype=cp.int32)
        self.out = cp.full((B, T), -1, dtype=cp.int32)
        self.host, self.dev = host_pool, dev_rows
        self.gather, self.commit = _kernels_on(cp.cuda.Device().id)
        self.smem = commit_smem_bytes(T)
        self.commit.max_dynamic_shared_size_bytes = self.smem
        self.tiles = (T + GATHER_BLOCK - 1) // GATHER_BLOCK

    def set_topk(self, topk: np.ndarray) -> None:
        self.topk[...] = self.cp.asarray(topk.reshape(self.B, -1), dtype=self.cp.int32)

    def launch(self, skip_io: bool = False, stream=None) -> None:
        """The launch pair: gather (B x T/64 blocks of 64 threads), then commit (B blocks of 512)."""
        from ulacache.backends.cupy_copy import ptr_of

        cp = self.cp
        with stream or cp.cuda.get_current_stream():
            self.gather((self.B, self.tiles), (GATHER_BLOCK,),
                        (self.topk, self.seq_steps, self.buf_tok, self.dev_locs, self.slot_of, self.host_locs,
                         self.ref, self.epoch, self.scratch_locs, self.scr_key, self.scr_idx, self.scr_first,
                         self.compact, self.counters, self.out, np.uint64(ptr_of(self.host)),
                         np.uint64(ptr_of(self.dev)), np.int32(self.K), np.int32(self.steps), np.int32(self.H),
                         np.int32(self.P), np.int32(self.S), np.int32(self.T), np.int32(self.rb // 16),
                         np.int32(1 if skip_io else 0)))
            self.commit((self.B,), (COMMIT_BLOCK,),
                        (self.topk, self.seq_steps, self.buf_tok, self.dev_locs, self.slot_of, self.ref, self.epoch,
                         self.cursor, self.scratch_locs, self.scr_key, self.scr_idx, self.scr_first, self.compact,
                         self.counters, self.miss, self.union, np.int32(self.K), np.int32(self.steps),
                         np.int32(self.H), np.int32(self.P), np.int32(self.S), np.int32(self.T)),
                        shared_mem=self.smem)

    _STATE = ("buf_tok", "dev_locs", "ref", "epoch", "cursor", "scratch_locs", "slot_of")

    def snapshot(self):
        return {k: getattr(self, k).copy() for k in self._STATE}

    def restore(self, snap) -> None:
        for k in self._STATE:
            getattr(self, k)[...] = snap[k]

    def differences(self, st: MtpState, out, miss, union, ref_dev: np.ndarray) -> list[str]:
        """What differs from the reference after the same call: slot tokens, epochs, cursor, counts exactly; every
        occurrence's and every slot's row bytes; the row set conserved (empty = agree)."""
        dev = self.dev.get()
        d = [f"{k} differs" for k, a, w in (("buf_tok", self.buf_tok, st.buf_tok), ("ref", self.ref, st.ref),
                                            ("epoch", self.epoch, st.epoch), ("cursor", self.cursor, st.cursor),
                                            ("miss_count", self.miss, miss), ("union_hits", self.union, union))
             if not np.array_equal(a.get(), w)]
        got_out, want_out = self.out.get(), out.reshape(self.B, -1)
        if not np.array_equal(got_out < 0, want_out < 0):
            d.append("invalid entries differ")
        ok = want_out >= 0
        if not np.array_equal(dev[got_out[ok]], ref_dev[want_out[ok]]):
            d.append("occurrence row bytes differ")
        gl, sl = self.dev_locs.get(), self.scratch_locs.get()
        if not np.array_equal(dev[gl], ref_dev[st.dev_locs]):
            d.append("slot row bytes differ")
        if not np.array_equal(np.sort(np.concatenate([gl, sl], 1), 1),
                              np.sort(np.concatenate([st.dev_locs, st.scratch_locs], 1), 1)):
            d.append("device row set not conserved")
        return d
