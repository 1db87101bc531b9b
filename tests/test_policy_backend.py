"""The numpy backend's primitives against brute-force definitions (the semantics in ulacache/backends/README.md)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ulacache.backends import BACKENDS, get_backend
from ulacache.backends.base import Backend

be = get_backend("numpy")


def test_registry_and_protocol():
    assert isinstance(be, Backend) and be.name == "numpy"
    assert {"numpy", "torch", "cupy"} <= set(BACKENDS)
    with pytest.raises(ValueError, match="unknown backend"):
        get_backend("jax")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1, 200), max_size=300))
def test_dedup_sorted_distinct_and_marker_clean(values):
    marker = np.zeros(202, dtype=bool)
    uniq, marker = be.dedup(np.array(values, dtype=np.int64), marker)
    assert uniq.dtype == np.int64
    assert uniq.tolist() == sorted(set(v for v in values if v >= 0))
    assert not marker.any()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-1, 5000), max_size=400), st.sampled_from([5002, 10**6]))
def test_dedup_sort_and_marker_paths_agree(values, size):
    """A batch far shorter than the marker is sorted, a long one scanned through the marker: same answer."""
    a, marker = np.array(values, dtype=np.int64), np.zeros(size, dtype=bool)
    expect = sorted(set(v for v in values if v >= 0))
    assert be._dedup_sorted(a, size).tolist() == expect
    assert be._dedup_marker(a, marker).tolist() == expect and not marker.any()
    uniq, marker = be.dedup(a, marker)
    assert uniq.dtype == np.int64 and uniq.tolist() == expect and not marker.any()


def bitmap_of(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits, bitorder="little")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.data())
def test_select_first_takes_lowest_set_slots_per_segment(nseg, words_per_seg, data):
    seg = 64 * words_per_seg
    bits = np.array(data.draw(st.lists(st.booleans(), min_size=nseg * seg, max_size=nseg * seg)), dtype=bool)
    counts = np.array(data.draw(st.lists(st.integers(0, seg), min_size=nseg, max_size=nseg)), dtype=np.int64)
    bm = bitmap_of(bits)
    slots, found = be.select_first(bm, be.summary(bm), seg, counts)
    expect = []
    for r in range(nseg):
        expect += (np.flatnonzero(bits[r * seg:(r + 1) * seg])[: counts[r]] + r * seg).tolist()
    assert slots.tolist() == expect
    assert found.tolist() == [min(int(counts[r]), int(bits[r * seg:(r + 1) * seg].sum())) for r in range(nseg)]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.data())
def test_lru_select_orders_by_stamp_then_slot(nseg, data):
    seg = 64
    n = nseg * seg
    stamps = np.array(data.draw(st.lists(st.integers(-1, 5), min_size=n, max_size=n)), dtype=np.int64)
    eligible = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    counts = np.array(data.draw(st.lists(st.integers(0, seg), min_size=nseg, max_size=nseg)), dtype=np.int64)
    slots, found = be.lru_select(stamps, eligible, seg, counts)
    expect = []
    for r in range(nseg):
        cand = [s for s in range(r * seg, (r + 1) * seg) if eligible[s]]
        expect += sorted(cand, key=lambda s: (stamps[s], s))[: counts[r]]
    assert slots.tolist() == expect and found.sum() == len(expect)


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 4095), max_size=600), st.sets(st.integers(0, 4095), max_size=3000))
def test_bitmap_set_clear_and_summary(a, b):
    bm = np.zeros(4096 // 8, np.uint8)
    sa = np.array(sorted(a), dtype=np.int64)
    bm = be.bitmap_set(bm, sa)
    bits = np.unpackbits(bm, bitorder="little").astype(bool)
    assert np.flatnonzero(bits).tolist() == sa.tolist()
    extra = np.array(sorted(set(b) - a), dtype=np.int64)  # many slots: the unpack/pack path
    bm = be.bitmap_set(bm, extra)
    bm = be.bitmap_clear(bm, sa)
    assert np.flatnonzero(np.unpackbits(bm, bitorder="little")).tolist() == extra.tolist()
    summ = np.unpackbits(be.summary(bm), bitorder="little").astype(bool)[: 4096 // 64]
    words = np.unpackbits(bm, bitorder="little").reshape(-1, 64).any(axis=1)
    assert (summ == words).all()


def test_bucket_of_hit_mask_gather_rows():
    stamps = np.array([0, 3, 5, 9, 10], dtype=np.int64)
    assert be.bucket_of(stamps, np.arange(5), 10, 4).tolist() == [5, 5, 5, 1, 0]
    assert be.hit_mask(np.array([-1, 0, 7, 8], dtype=np.int32), 8).tolist() == [False, True, True, False]
    assert be.hit_mask(np.array([-1, 0, 7, 8], dtype=np.int64), 8).tolist() == [False, True, True, False]
    pool = np.arange(12, dtype=np.uint8).reshape(6, 2)
    rows = be.gather_rows(pool, np.array([4, 1]))
    pool = be.scatter_rows(pool, np.array([1, 4]), rows)
    assert pool[1].tolist() == [8, 9] and pool[4].tolist() == [2, 3]


@pytest.mark.parametrize("policy,mode,ranks", [("pb-lru", "dp", 1), ("pb-lru", "tp", 4), ("lru", "dp", 2),
                                               ("hisparse", "dp", 1)])
def test_torch_backend_on_cpu_gives_the_numpy_plans(policy, mode, ranks):
    """The whole pipeline through the torch backend (CPU) reproduces numpy's plans, places and bytes exactly."""
    pytest.importorskip("torch")
    from ulacache import CacheConfig, UlaCache
    from ulacache.workload import LocalityWorkload

    results = []
    for backend in ("numpy", "torch"):
        c = UlaCache(CacheConfig(policy=policy, mode=mode, num_ranks=ranks, backend=backend, payload_bytes=4,
                                 gpu_slots=4 * 65 if policy == "hisparse" else 400, cpu_slots=3000,
                                 device_buffer_slots=64, local_buffer_slots=1500, num_recent_buckets=3))
        wl = LocalityWorkload(4, 600, 32, 64, 2, seed=1)
        addrs = c.alloc_many(np.arange(4), np.full(4, 600), np.arange(4) % ranks if mode == "dp" else None)
        addrs = addrs.reshape(4, 600)
        c.write(addrs.ravel(), (np.arange(2400 * 4) % 251).astype(np.uint8).reshape(2400, 4))
        out = []
        for _ in range(20):
            sel = np.take_along_axis(addrs, wl.step().reshape(4, -1), axis=1)
            plan = c.access(sel)
            c.commit(plan)
            out.append((plan.counts(), plan.move_src.tolist(), plan.move_dst.tolist()))
        c.check_invariants()
        results.append((out, [x.tolist() for x in c.locate(addrs.ravel())], c.read(addrs.ravel()).tolist()))
    assert results[0] == results[1]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.sampled_from([1, 4, 64, 65, 10**6]), st.data())
def test_lru_select_counting_equals_partition(nseg, span, data):
    """The counting path (stamp range within a segment) and the partition path (any range) select the same slots."""
    seg = 64 * data.draw(st.integers(1, 3))
    n = nseg * seg
    stamps = np.array(data.draw(st.lists(st.integers(-1, span), min_size=n, max_size=n)), dtype=np.int64)
    eligible = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    counts = np.array(data.draw(st.lists(st.integers(0, seg + 2), min_size=nseg, max_size=nseg)), dtype=np.int64)
    slots, found = be.lru_select(stamps, eligible, seg, counts)
    ref, ref_found = be._lru_select_sorted(stamps, eligible, seg, counts)
    assert slots.tolist() == ref.tolist() and found.tolist() == ref_found.tolist()


def _select_first_reference(bits: np.ndarray, seg: int, counts: np.ndarray):
    """select_first by definition: per segment, the lowest min(counts[r], set) set slots."""
    out, found = [], []
    for r, k in enumerate(counts.tolist()):
        got = np.flatnonzero(bits[r * seg:(r + 1) * seg])[: max(k, 0)] + r * seg
        out += got.tolist()
        found.append(min(k, int(bits[r * seg:(r + 1) * seg].sum())))
    return out, found


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 9), st.sampled_from([1, 2, 3, 63, 64, 65, 130, 200]), st.sampled_from([0.0, 0.002, 0.05, 0.5, 1.0]),
       st.sampled_from([0.0, 0.3, 1.0]), st.sampled_from(["low", "high", "any"]), st.integers(0, 2**31))
def test_select_first_equals_reference_with_stale_flags(nseg, words_per_seg, density, stale, where, seed):
    """Random bitmaps whose segments are not aligned with summary words (words_per_seg % 64 != 0), summaries with
    stale flags (set for words that are empty, as after clears), counts from -1 to more than the segment holds."""
    rng = np.random.default_rng(seed)
    seg = 64 * words_per_seg
    bits = rng.random(nseg * seg) < density
    if where != "any":  # set bits only at one end of each segment (pools fill from their low slots)
        half = (np.arange(nseg * seg) % seg) < seg // 2
        bits &= ~half if where == "high" else half
    nonzero = bits.reshape(-1, 64).any(axis=1)
    flags = nonzero | (rng.random(nonzero.size) < stale)
    if seed % 5 == 0:  # words without their flag: not examined (the contract; pools keep non-zero words flagged)
        flags &= rng.random(nonzero.size) < 0.8
    summary = np.packbits(np.concatenate([flags, np.zeros((-flags.size) % 64, bool)]), bitorder="little")
    counts = rng.integers(0, 3, size=nseg) * rng.choice([1, 3, 64, 200, seg + 5], size=nseg)
    counts = np.where(rng.random(nseg) < 0.1, -1, counts).astype(np.int64)  # a negative count takes nothing
    expect, expect_found = _select_first_reference(bits & np.repeat(flags, 64), seg, counts)
    bm = bitmap_of(bits)
    slots, found = be.select_first(bm, summary, seg, counts)
    assert slots.dtype == np.int64 and found.dtype == np.int64
    assert slots.tolist() == expect and found.tolist() == expect_found
    # both searches, whichever the count picks: array passes, and one by one (None: too many stale flags to walk)
    words, summary_words = bm.view("<u8"), summary.view("<u8")
    slots, found = be._select_many(words, summary_words, seg // 64, counts)
    assert slots.tolist() == expect and found.tolist() == expect_found
    few = be._select_few(words, summary_words, seg // 64, counts)
    if few is not None:
        assert few[0].tolist() == expect and few[1].tolist() == expect_found


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([1, 3, 8, 9, 100, 4095, 4096, 4099, 9000]), st.booleans(),
       st.sampled_from(["range", "shuffled range", "scattered"]))
def test_bitmap_writes_of_any_size_and_shape(seed, n, value, shape):
    """Set (clear) n distinct clear (set) slots: byte by byte, ufunc.at, unpack/pack or one contiguous range, all
    equal the bool reference (ranges start and end at any bit of a byte)."""
    rng = np.random.default_rng(seed)
    nslots = 64 * int(rng.integers(-(-(n + 8) // 64), 400))
    if shape == "scattered":
        slots = rng.choice(nslots, size=n, replace=False)
    else:
        lo = int(rng.integers(0, nslots - n + 1))
        slots = np.arange(lo, lo + n)
        if shape == "shuffled range":
            rng.shuffle(slots)
    slots = slots.astype(np.int64)
    bits = rng.random(nslots) < 0.5
    bits[slots] = not value  # the precondition: the bits written are clear (set) on entry
    bm = be.bitmap_set(bitmap_of(bits), slots) if value else be.bitmap_clear(bitmap_of(bits), slots)
    bits[slots] = value
    assert bm.tolist() == bitmap_of(bits).tolist()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-3, 40), min_size=1, max_size=300), st.integers(0, 40), st.integers(0, 9))
def test_bucket_of_by_definition(stamps, now, num_recent):
    stamps = np.array(stamps, dtype=np.int64)
    slots = np.arange(stamps.size)[::-1].copy()
    got = be.bucket_of(stamps, slots, now, num_recent)
    assert got.dtype == np.int32
    assert got.tolist() == [min(max(now - int(stamps[s]), 0), num_recent + 1) for s in slots]
