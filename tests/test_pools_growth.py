"""Storage growth (rows.RankRows / RaggedRows): every id keeps its value through any sequence of re-layouts (in
place inside a buffer with room, or into a new one), new ids read the fill, and rows are never shorter than asked."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ulacache.rows import HEADROOM, RaggedRows, RankRows

R, STRIDE = 4, 1 << 20

needs = st.lists(st.lists(st.integers(0, 5000), min_size=R, max_size=R), min_size=1, max_size=8)


def _by_id(rows: RaggedRows, arr: np.ndarray) -> dict[int, tuple]:
    """id -> value (last axis laid out like the ids; leading dims as a tuple)."""
    ix = np.arange(rows.size)
    ids = rows.ids(ix)
    return {int(i): tuple(np.atleast_1d(arr[..., k]).tolist()) for k, i in zip(ix.tolist(), ids.tolist())}


@settings(max_examples=60, deadline=None)
@given(needs, st.sampled_from([(-1, np.int32, ()), (0, np.int16, ()), (0, np.uint16, (3,)), (False, bool, (2,))]))
def test_ragged_relayout_keeps_every_id(seq, kind):
    fill, dtype, lead = kind
    rows = RaggedRows(R, STRIDE, STRIDE, floor=64)
    arr = np.zeros((*lead, 0), dtype=dtype)
    expect: dict[int, tuple] = {}
    rng = np.random.default_rng(len(seq))
    for need in seq:
        old = rows.grow(np.array(need) + rows.caps * 0)
        if old is None:
            continue
        before = _by_id_layout(rows, old, arr)
        arr = rows.relayout(arr, old, fill)
        assert arr.shape == (*lead, rows.size)
        assert (rows.caps >= np.minimum(need, STRIDE)).all()
        got = _by_id(rows, arr)
        blank = tuple([fill] * int(np.prod(lead, dtype=np.int64)))
        for i, v in got.items():
            assert v == before.get(i, blank), (i, v, before.get(i))
        # write distinct values into every storage position (as the callers do for ids they hand out)
        vals = rng.integers(1, 100, size=arr.shape).astype(dtype)
        arr[...] = vals
        expect = _by_id(rows, arr)
    assert _by_id(rows, arr) == expect


def _by_id_layout(rows: RaggedRows, layout: tuple, arr: np.ndarray) -> dict[int, tuple]:
    caps, offs = layout
    ix = np.arange(int(offs[-1]))
    ids = rows.ids(ix, layout)
    return {int(i): tuple(np.atleast_1d(arr[..., k]).tolist()) for k, i in zip(ix.tolist(), ids.tolist())}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 20000), min_size=1, max_size=8))
def test_rank_rows_relayout_keeps_every_slot(seq):
    rows = RankRows(R, 1 << 16, 1 << 16)
    own = np.zeros(0, dtype=np.int64)
    bits = np.zeros(0, dtype=np.uint8)
    ring = np.zeros((3, 0), dtype=np.uint8)
    lru = np.zeros((0, 5), dtype=np.int32)
    for need in seq:
        old = rows.grow(need)
        if old == rows.cap:
            continue
        prev = (own.reshape(R, old).copy(), bits.reshape(R, old // 8).copy(), ring.reshape(3, R, old // 8).copy(),
                lru.reshape(R, old, 5).copy())
        own = rows.relayout(own, old, -1)
        bits = rows.relayout(bits, old, 0, 1 / 8)
        ring = rows.relayout_stacked(ring, old, 0, 1 / 8)
        lru = rows.relayout(lru, old, 7)
        c = rows.cap
        assert c >= need and c % 64 == 0
        o2, b2, r2, l2 = own.reshape(R, c), bits.reshape(R, c // 8), ring.reshape(3, R, c // 8), lru.reshape(R, c, 5)
        assert (o2[:, :old] == prev[0]).all() and (o2[:, old:] == -1).all()
        assert (b2[:, :old // 8] == prev[1]).all() and (b2[:, old // 8:] == 0).all()
        assert (r2[:, :, :old // 8] == prev[2]).all() and (r2[:, :, old // 8:] == 0).all()
        assert (l2[:, :old] == prev[3]).all() and (l2[:, old:] == 7).all()
        own[...] = np.arange(own.size)
        bits[...] = np.arange(bits.size) % 251
        ring[...] = np.arange(ring.size).reshape(ring.shape) % 253
        lru[...] = np.arange(lru.size).reshape(lru.shape)


def test_growth_slack_is_bounded():
    """A row's first storage is what it needs; a long row then grows by 1/HEADROOM of its need, not x2; a full row
    grows with the row that overflows (one event)."""
    rows = RaggedRows(2, STRIDE, STRIDE)
    rows.grow(np.array([131072, 0]))
    assert rows.caps.tolist() == [131072, 0]
    rows.grow(np.array([131072, 131072]))  # row 1's first storage; row 0 is full: it grows in the same event
    assert rows.caps[1] == 131072 and 131072 < rows.caps[0] <= 131072 * (1 + 1 / HEADROOM) + 64
    rows.grow(np.array([131072, 131073]))
    assert 131073 < rows.caps[1] <= 131073 * (1 + 1 / HEADROOM) + 64


def test_regrowth_moves_rows_inside_one_buffer():
    """The first re-layout leaves room for one growth step (FIRST_ROOM), a later new buffer SPARE x; growth within
    the room moves rows inside the same buffer."""
    from ulacache.rows import FIRST_ROOM

    rows = RaggedRows(3, STRIDE, STRIDE)
    arr = np.zeros(0, dtype=np.int32)
    arr = rows.relayout(arr, rows.grow(np.array([0, 100000, 0])), -1)
    first = arr.base
    assert first is not None and arr.size == rows.size and first.size == int(rows.size * FIRST_ROOM)
    arr[:] = 5
    arr = rows.relayout(arr, rows.grow(np.array([0, 100100, 0])), -1)  # one growth step: in place
    assert arr.base is first and arr.size == rows.size > 100100
    arr = rows.relayout(arr, rows.grow(np.array([100000, 100100, 0])), -1)  # beyond the room: a new buffer
    buf = arr.base
    assert buf is not None and buf is not first and buf.size > arr.size
    arr = rows.relayout(arr, rows.grow(np.array([100000, 100100, 100000])), -1)
    assert arr.base is buf and rows.size > 0
    assert (arr[rows.index(np.array([0, STRIDE, STRIDE + 100050, 2 * STRIDE, 2 * STRIDE + 99999]))] == [-1, 5, -1, -1, -1]).all()


def test_zero_filled_tables_leave_all_zero_parts_unwritten():
    """Re-laying a zero-filled table (bucket bitmaps) writes no page that stays zero: rows with no bit set stay
    unmapped in the new buffer (their pages are what the resident set and the first-touch cost count)."""
    rows = RankRows(4, 1 << 26, 1 << 26)
    stacked = np.zeros((3, 0), dtype=np.uint8)
    before = _rss_anon()
    old = rows.grow(1 << 24)
    stacked = rows.relayout_stacked(stacked, old, 0, 1 / 8)  # 3 x 8 MiB
    stacked[1, 5] = 7  # one bit in row 1 (rank 0)
    for need in (rows.cap + 1, 2 * rows.cap + 1):  # in place, then into a new buffer
        old = rows.grow(need)
        stacked = rows.relayout_stacked(stacked, old, 0, 1 / 8)
        assert stacked[1, 5] == 7 and int(np.count_nonzero(stacked)) == 1
    after = _rss_anon()
    assert before is None or after - before < stacked.nbytes // 8, (after - before, stacked.nbytes)


def _rss_anon():
    """This process's anonymous resident bytes (pages only read map the shared zero page and are not counted)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def test_structured_tables_keep_their_records():
    """A structured table (the TP slot maps: one record of R slots per address) keeps every record through in-place
    and new-buffer re-layouts (numpy reads a record whose first element is zero as zero)."""
    dt = np.dtype([("s", np.int32, (3,))])
    rows = RaggedRows(2, STRIDE, STRIDE)
    arr = rows.relayout(np.zeros(0, dtype=dt), rows.grow(np.array([1000, 0])), 0)
    arr["s"][5] = [0, 2, 3]  # rank 0 holds no copy: numpy reads the record as zero
    for need in ([1000, 1000], [2100, 1000], [9000, 8000]):  # a row behind, in place, a new buffer
        old = rows.grow(np.array(need))
        assert old is not None
        arr = rows.relayout(arr, old, 0)
        at = rows.index(np.array([5, STRIDE + 5]))
        assert arr["s"][at[0]].tolist() == [0, 2, 3] and arr["s"][at[1]].tolist() == [0, 0, 0]
        assert int(np.count_nonzero(arr["s"])) == 2


def test_narrow_stamps_widen_before_the_clock_outgrows_them():
    """Pools start with narrow stamps (pb-lru: int16 epochs) and widen, values kept, when a clock needs more bits."""
    from ulacache.pools import Pool

    pool = Pool(2, 100, stamp_dtype=np.int16)
    pool.reserve(np.array([10, 10]))
    pool.touch(np.array([1, 3]), 7)
    pool.fit_stamp(2**15 - 1)
    assert pool.stamp.dtype == np.int16
    pool.touch(np.array([2]), 2**15)
    assert pool.stamp.dtype == np.int32 and pool.stamp[[1, 2, 3]].tolist() == [7, 2**15, 7]
    pool.fit_stamp(2**31)
    assert pool.stamp.dtype == np.int64 and pool.stamp[2] == 2**15
    assert pool.stamps.dtype == np.int64  # the dense snapshot keeps one width whatever the storage holds


def test_request_runs_give_back_every_address_in_order():
    """Requests keep runs of consecutive addresses as (first, count): addresses() is what was registered, in order."""
    from ulacache.address_space import AddressSpace

    space = AddressSpace(2, 1000, 5000)
    chunks = [np.arange(10, 20), np.array([20]), np.array([21]), np.array([40]), np.array([7, 5, 6]), np.zeros(0, int),
              np.arange(30, 33), np.array([33, 35])]
    req = space.request(1, 0)
    for c in chunks:
        space.register(1, req, c.astype(np.int64))
    got = space.requests[1].addresses()
    assert got.dtype == np.int64 and got.tolist() == np.concatenate(chunks).tolist()
    assert req.num_tokens == got.size
    assert len(req.runs) == 5  # 10..21 merged, 40, [7 5 6], 30..32, [33 35]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 3000)), min_size=1, max_size=12))
def test_scalar_address_index_and_pop_match_the_array_ones(pops):
    """AddressSpace.index_one / pop_one (a decode token's scalar path) give what index / pop_ids give, through the
    growth of any rank's row."""
    from ulacache.address_space import AddressSpace
    a, b = AddressSpace(3, 100_000, 10**6), AddressSpace(3, 100_000, 10**6)
    for r, n in pops:
        a.pop_ids(r, n)
        b.pop_ids(r, n)
        assert a.pop_one(r) == int(b.pop_ids(r, 1)[0])
        assert a.rows.caps.tolist() == b.rows.caps.tolist()
    ids = np.concatenate([np.arange(r * 100_000, r * 100_000 + int(a.rows.caps[r])) for r in range(3)])
    assert [a.index_one(int(i)) for i in ids] == a.index(ids).tolist()
