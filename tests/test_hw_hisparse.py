"""HiSparse swap-in: the numpy reference on a hand-checked example and its invariants over random steps (CPU);
the cupy kernel equals the reference bit for bit (gpu-marked)."""
from __future__ import annotations

import numpy as np
import pytest

from hw.hisparse import SwapState, TopkStream, init_state, planned_copy_reference, swapin_reference


def _tiny() -> SwapState:
    # one request, H = 4 LRU slots (+ slot 4 for the newest token), history 10 (newest token 9)
    return SwapState(buf_tok=np.array([[3, 5, -1, 7, 9]], np.int32), lru=np.array([[2, 0, 3, 1]], np.int32),
                     dev_locs=np.array([[10, 11, 12, 13, 14]], np.int32),
                     host_locs=np.arange(10, dtype=np.int64)[None] + 100, seq_lens=np.array([10]))


def test_hand_example():
    st = _tiny()
    # top-k {5, 9, 1}: 5 hits (slot 1), 9 is the newest (slot 4), 1 misses -> least recent evictable = slot 2
    out, miss = swapin_reference(st, np.array([[5, 9, 1]], np.int32))
    assert out.tolist() == [[11, 14, 12]] and miss.tolist() == [1]
    assert st.buf_tok.tolist() == [[3, 5, 1, 7, 9]]
    # new order: unused evictables (0, 3) in LRU order, then the missed slot 2, then the hit slot 1 (MRU)
    assert st.lru.tolist() == [[0, 3, 2, 1]]


def test_fast_path_reads_slots_by_position():
    st = init_state([6], buffer_slots=8, history_cap=16)
    out, miss = swapin_reference(st, np.array([[0, 5, 2]], np.int32))
    assert out.tolist() == [[0, 5, 2]] and miss.tolist() == [0]


@pytest.mark.parametrize("keep", [0.0, 0.44, 0.9])
def test_invariants_over_steps(keep):
    rng = np.random.default_rng(7)
    B, H, K, S, rb = 3, 64, 24, 400, 16
    seq = np.array([400, 300, 65])
    st = init_state(seq, H, S, seed=1)
    host = rng.integers(0, 256, size=(B * S, rb), dtype=np.uint8)
    dev = np.zeros((B * (H + 1), rb), np.uint8)
    for b in range(B):  # the newest token's KV sits in slot H (written by decode, outside the LRU)
        dev[st.dev_locs[b, H]] = host[st.host_locs[b, seq[b] - 1]]
    sel = TopkStream(seq, K, keep, seed=2)
    prev_hits = 0
    for _ in range(12):
        tk = sel.step()
        before = st.buf_tok.copy()
        out, miss = swapin_reference(st, tk, host, dev)
        for b in range(B):
            assert sorted(st.lru[b].tolist()) == list(range(H))  # a permutation of the slots
            # every entry is served by a row holding its token's bytes
            assert np.array_equal(dev[out[b]], host[st.host_locs[b, tk[b]]])
            held = set(before[b, :H].tolist())
            want = len([t for t in tk[b].tolist() if t not in held and t != seq[b] - 1])
            assert miss[b] == want
            lru_toks = st.buf_tok[b, st.lru[b]]
            newest_in = int((tk[b] == seq[b] - 1).sum())
            tail = set(lru_toks[H - (K - newest_in):].tolist())
            assert tail == set(tk[b].tolist()) - {seq[b] - 1}  # the top-k is the MRU end
        prev_hits += int(K * B - miss.sum())
    if keep > 0:
        assert prev_hits > 0


def test_recorded_plan_replays_the_copies():
    """An IndexShare skip layer replaying the anchor's recorded plan into its own buffer gets exactly the rows the
    anchor's swap-in copied (the slot table is shared); hits and the fast path record nothing."""
    rng = np.random.default_rng(4)
    B, H, K, S, rb = 3, 64, 24, 400, 16
    seq = np.array([400, 300, 50])  # the last request takes the fast path
    st = init_state(seq, H, S, seed=2)
    host = rng.integers(0, 256, size=(B * S, rb), dtype=np.uint8)
    anchor, skip = np.zeros((B * (H + 1), rb), np.uint8), np.zeros((B * (H + 1), rb), np.uint8)
    sel = TopkStream(seq, K, 0.5, seed=3)
    for _ in range(6):
        tk = sel.step()
        plan = (np.full((B, K), -1, np.int64), np.full((B, K), -1, np.int32))
        before = anchor.copy()
        _, miss = swapin_reference(st, tk, host, anchor, plan=plan)
        changed = np.flatnonzero((anchor != before).any(1))
        planned_copy_reference(plan[0], plan[1], miss, host, skip)
        assert miss[2] == 0 and (plan[0][2] == -1).all()
        for b in range(B):
            assert np.unique(plan[1][b, :miss[b]]).size == miss[b]  # each miss its own device row
        assert set(changed.tolist()) <= set(np.concatenate([plan[1][b, :miss[b]] for b in range(B)]).tolist())
        rows = np.concatenate([plan[1][b, :miss[b]] for b in range(B)])
        assert np.array_equal(skip[rows], anchor[rows])


@pytest.mark.gpu
@pytest.mark.parametrize("block", [256, 960, 1024])
def test_kernel_equals_reference(block):
    from hw.hisparse_bench import check_against_reference

    res = check_against_reference(batch=5, buffer_slots=512, top_k=256, history=3000, steps=4, block=block)
    assert res["ok"], res["differences"]
    assert res["misses"] > 0
