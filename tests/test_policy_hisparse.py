"""HiSparse baseline: matches a straightforward per-request model of SGLang's swap-in LRU step by step."""
import numpy as np
import pytest

from ulacache import CacheConfig, CapacityError, UlaCache


class RefRequest:
    """SGLang's device buffer for one request (cf. `_expected_lru` in SGLang's hisparse kernel tests): an LRU list
    of D slots (least recent first) plus one slot for the newest token; the fast path while history <= D + 1."""

    def __init__(self, D):
        self.D, self.lru, self.tok, self.newest, self.n = D, list(range(D)), [None] * D, None, 0

    def alloc(self, addrs):
        for a in addrs:
            if self.newest is not None and self.n - 1 < self.D:
                self.tok[self.n - 1] = self.newest
            self.newest, self.n = a, self.n + 1

    def access(self, sel):
        """Returns (hits, misses) over the distinct selected addresses."""
        if self.n <= self.D + 1:
            return len(sel), 0
        hit_slots = [s for s in self.lru if self.tok[s] in sel]
        evict = [s for s in self.lru if self.tok[s] not in sel]
        resident = set(self.tok) | {self.newest}
        misses = sorted(a for a in sel if a not in resident)
        for j, a in enumerate(misses):
            self.tok[evict[j]] = a
        m = len(misses)
        self.lru = evict[m:] + evict[:m][::-1] + hit_slots
        return len(sel) - m, m


def buffer_tokens(c: UlaCache, rid: int):
    order, newest = c.policy.buffer_contents(rid)
    return [None if t < 0 else t for t in order.tolist()], newest


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hisparse_matches_sglang_lru_model(seed):
    D, rng = 16, np.random.default_rng(seed)
    c = UlaCache(CacheConfig(policy="hisparse", gpu_slots=4 * (D + 1), cpu_slots=600, device_buffer_slots=D,
                             payload_bytes=2))
    ref = {}
    for rid, n in ((1, 10), (2, 30), (3, 50)):
        a = c.alloc(rid, n)
        c.write(a, rng.integers(0, 255, (n, 2), dtype=np.uint8))
        ref[rid] = RefRequest(D)
        ref[rid].alloc(a.tolist())
    for step in range(40):
        new = c.alloc_many([1, 2, 3], [1, 1, 1])
        c.write(new, rng.integers(0, 255, (3, 2), dtype=np.uint8))
        sels, expect_h, expect_m = [], 0, 0
        for i, rid in enumerate((1, 2, 3)):
            hist = c.request_addresses(rid)
            ref[rid].alloc([int(new[i])])
            k = int(rng.integers(1, min(D, hist.size - 1) + 1))
            sel = rng.choice(hist[:-1], size=k, replace=False)
            if rng.random() < 0.5:
                sel = np.append(sel, hist[-1])  # the newest token, outside the LRU
            sels.append(np.concatenate([sel, sel[: k // 2], [-1, -1]]))  # duplicates and padding
            h, m = ref[rid].access(set(sel.tolist()))
            expect_h, expect_m = expect_h + h, expect_m + m
        plan = c.access(np.concatenate(sels))
        assert (plan.num_hits, plan.num_misses) == (expect_h, expect_m)
        assert plan.h2d_rows == expect_m and plan.d2h_rows == (90 + 3 if step == 0 else 3)
        c.commit(plan)
        for rid in (1, 2, 3):
            toks, newest = buffer_tokens(c, rid)
            assert toks == [ref[rid].tok[s] for s in ref[rid].lru], f"LRU order differs for request {rid}"
            assert newest == ref[rid].newest
        c.check_invariants()  # includes: every buffer copy equals its CPU entry


def test_hisparse_fast_path_has_no_io_and_capacity_rules():
    D = 8
    c = UlaCache(CacheConfig(policy="hisparse", gpu_slots=2 * (D + 1) + 3, cpu_slots=40, device_buffer_slots=D))
    a = c.alloc(1, D + 1)
    plan = c.access(a)
    assert plan.num_hits == D + 1 and plan.h2d_rows == 0
    c.commit(plan)
    assert (c.locate(a)[0] == 1).all()  # the entry of record is the CPU copy; the buffer holds duplicates
    c.alloc(2, 20)
    with pytest.raises(CapacityError, match="device buffer"):
        c.alloc(3, 1)  # GPU capacity = requests x (D + 1)
    with pytest.raises(CapacityError):
        c.alloc(2, 20)  # the CPU must hold every full history
    assert c.num_free_slots(0) == 0 and c.num_free_slots() == 40 - 29
    b = c.request_addresses(2)
    with pytest.raises(CapacityError, match="device buffer"):
        c.access(b[: D + 1])  # D + 1 distinct non-newest tokens cannot fit the LRU part
    c.free(1)
    c.alloc(3, 1)
    c.check_invariants()


def test_hisparse_tp_replicates_transfers_on_every_rank():
    D = 8
    c = UlaCache(CacheConfig(policy="hisparse", mode="tp", num_ranks=4, gpu_slots=2 * (D + 1), cpu_slots=64,
                             device_buffer_slots=D))
    a = c.alloc(1, 30)
    plan = c.access(a[10:14])
    assert plan.h2d_rows_per_rank.tolist() == [4, 4, 4, 4] and plan.d2h_rows_per_rank.tolist() == [30] * 4
    assert plan.num_peer_fetches == 0
    c.commit(plan)
    assert c.capacity_slots(1) == 64 and c.num_free_slots() == 34
    c.check_invariants()


def test_hisparse_alloc_many_new_requests_get_their_own_buffers():
    D = 8
    c = UlaCache(CacheConfig(policy="hisparse", gpu_slots=3 * (D + 1), cpu_slots=200, device_buffer_slots=D))
    a = c.alloc_many([5, 6, 7], [30, 30, 30]).reshape(3, 30)
    assert len(set(c.policy.region_of[[c.space.requests[r].index for r in (5, 6, 7)]].tolist())) == 3
    plan = c.access(a[:, 10:10 + D])  # D distinct non-newest tokens of each request: fits each buffer
    assert plan.num_misses == 3 * D
    c.commit(plan)
    c.check_invariants()


def test_key_table_widens_past_int32_keys():
    """The address key table (request index << SH | slot + 1) starts int32 and widens to int64 once a request index
    no longer fits (same answers after)."""
    D = 2**16  # SH = 17 bits of slot: request indices from 16,383 on need int64 keys
    c = UlaCache(CacheConfig(mode="dp", num_ranks=1, gpu_slots=(D + 1) * 2, cpu_slots=3 * D, device_buffer_slots=D,
                             policy="hisparse"))
    first = c.alloc(1, D + 6)
    for rid in range(2, 16_400):  # a refused allocation still uses up a request index
        with pytest.raises(CapacityError):
            c.alloc(rid, 3 * D)
    assert c.policy.key_of.dtype == np.int32
    last = c.alloc(16_400, D + 6)
    assert c.policy.key_of.dtype == np.int64
    for a in (first, last):  # the first D tokens resident (filled in order), the newest too, the rest not
        plan = c.access(a[[0, D - 1, D, D + 5]])
        assert (plan.num_hits, plan.num_misses) == (3, 1)
        c.commit(plan)
    c.check_invariants()
