"""AddressIndex: logical addresses -> storage positions -> places, checked (the facade's translate step).

Every error is a ValueError naming the first bad address, raised before anything changes: out of range, never
handed out (beyond its home row's end), or freed (no place). An access batch is deduplicated either by sorting its
addresses (a batch much shorter than the storage, numpy) or by the backend's dedup over storage positions.
"""
from __future__ import annotations

import numpy as np

from .inputs import check_rank, int_array

# A numpy batch this many times shorter than the address storage is deduplicated by sorting its addresses
# (`translate`); a longer one by the backend's dedup over storage positions (the numpy backend's own
# sort/marker crossover, bench/dedup_crossover.py).
_SORT_BATCH_RATIO = 16
# A TP batch of at least this many distinct addresses is located by home runs (slices), a smaller one by per-address
# gathers (measured, 8 homes: 2048 addresses 13 vs 39 us, 30000 addresses 176 vs 45 us; crossover ~6000).
_RUN_SHIFT_MIN = 8192


def check_allocated(addrs: np.ndarray, places: np.ndarray, what: str) -> None:
    """ValueError naming the first address without a place (freed)."""
    if not places.size or int(places.min()) >= 0:  # one reduction; the scan only to name the first one
        return
    bad = np.flatnonzero(places < 0)
    raise ValueError(f"{what} holds unallocated address {int(addrs[bad[0]])}")


class AddressIndex:
    """The checked translation over one policy's address space (`space`), with the backend `be` for large batches."""

    def __init__(self, space, be, num_ranks: int):
        self.space, self.be, self.num_ranks = space, be, num_ranks
        self._rows_key, self._rows_tables, self._rows_lists = None, None, None  # row_tables' cache (+ as lists)
        self._marker = None  # a device backend's own dedup marker (all False between accesses), kept on the device

    # -- addresses and places ------------------------------------------------------------------------------------------
    def addresses(self, addrs, what: str, allow_padding: bool = False) -> np.ndarray:
        """Flat int64 addresses, every one in range (-1 padding allowed when asked)."""
        return self.address_range(addrs, what, allow_padding)[0]

    def address_range(self, addrs, what: str, allow_padding: bool) -> tuple[np.ndarray, int, int]:
        """(flat int64 addresses, their min, their max; 0, -1 when empty), every one in range (-1 padding allowed)."""
        a = int_array(addrs, what).ravel()
        if not a.size:
            return a, 0, -1
        lo, hi = int(a.min()), int(a.max())
        self.check_range(lo, hi, what, allow_padding)
        return a, lo, hi

    def check_range(self, lo: int, hi: int, what: str, allow_padding: bool) -> None:
        """ValueError unless addresses of min lo and max hi are in range (hi < lo: none)."""
        if hi < lo:
            return
        floor = -1 if allow_padding else 0
        if lo < floor:
            raise ValueError(f"{what} holds {lo}: addresses are >= 0" + (" (-1 = padding)" if allow_padding else ""))
        if hi >= self.space.size:
            raise ValueError(f"{what} holds {hi}: beyond the address space of {self.space.size}")

    def storage_index(self, a: np.ndarray, what: str, allow_padding: bool, hi: int | None = None) -> np.ndarray:
        """Storage positions of in-range addresses (-1 padding kept); ValueError for one never handed out. `hi`:
        max(a) when the caller has it."""
        rows = self.space.rows
        if rows.identity:
            if a.size:
                hi = int(a.max()) if hi is None else hi
                if hi >= self.space.table.size:
                    raise ValueError(f"{what} holds unallocated address {hi}")
            return a
        shift, end = self.row_tables(rows)
        home = a // rows.stride  # -1 padding: home -1, the tables' last entry (shift 0: stays -1; end 0: valid)
        ix = a + shift.take(home)
        bad = ix >= end.take(home)
        if bad.any():
            raise ValueError(f"{what} holds unallocated address {int(a[np.flatnonzero(bad)[0]])}")
        return ix

    def row_tables(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """Per home rank (+ one entry for -1 padding): storage shift (position - address) and end of its row; rebuilt
        only when the address storage grew (rows only grow, so its size names the layout)."""
        if self._rows_key != rows.size:
            r = np.arange(rows.R, dtype=np.int64)
            self._rows_tables = (np.append(rows.offs[:-1] - r * rows.stride, 0),
                                 np.append(rows.offs[:-1] + rows.caps, 0))
            self._rows_lists = tuple(t.tolist() for t in self._rows_tables)
            self._rows_key = rows.size
        return self._rows_tables

    def places(self, a: np.ndarray, what: str) -> np.ndarray:
        """Current places of valid, allocated addresses (int64)."""
        places = self.space.table[self.storage_index(a, what, allow_padding=False)].astype(np.int64)
        check_allocated(a, places, what)
        return places

    # -- an access batch -----------------------------------------------------------------------------------------------
    def translate(self, selected, rank, tp: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, list | None,
                                                          int | None]:
        """An access batch (any shape, -1 = padding) and its optional DP `rank` (checked after the addresses' range,
        before they are located): (distinct addresses ascending, their storage positions, their places, references
        without padding, their home bounds or None, the rank as int or None).

        A batch much smaller than the storage (numpy) is sorted (in the caller's width: int32 sorts ~2x faster), its
        ends are the range to check, and the addresses themselves are deduplicated (storage order is address order,
        so these are the same distinct addresses), then only the distinct ones located: saves the storage positions
        of every reference and their mapping back (~40 us of a 2048-reference batch), and locating them cuts their
        home bounds (AddressSpace.home_bounds). A larger one goes to `_translate_marker`."""
        arr = np.asarray(selected)
        small = (self.be.name == "numpy" and arr.size * _SORT_BATCH_RATIO < self.space.rows.size + 1
                 and arr.dtype.kind in "iu" and arr.dtype.itemsize <= 8 - 4 * (arr.dtype.kind == "u"))
        if small:
            s = arr.flatten()  # (a copy: sorted in place)
            s.sort()
            lo, hi = (int(s[0]), int(s[-1])) if s.size else (0, -1)
            self.check_range(lo, hi, "selected", allow_padding=True)
        else:
            flat, lo, hi = self.address_range(arr, "selected", allow_padding=True)
        if rank is not None:
            if tp:
                raise ValueError("rank must be None in TP mode: every rank executes the batch")
            rank = check_rank(rank, self.num_ranks)
        if not small:
            return (*self._translate_marker(flat, lo, hi), None, rank)
        n = s.size
        if not n:
            return s.astype(np.int64), s.astype(np.int64), self.space.table[:0], 0, [0] * (self.num_ranks + 1), rank
        pads = int(s.searchsorted(0)) if lo < 0 else 0  # -1 padding sorts first
        if pads:
            s = s[pads:]
        if s.size > 1:
            keep = np.empty(s.size, dtype=bool)
            keep[0] = True
            np.not_equal(s[1:], s[:-1], out=keep[1:])
            if np.count_nonzero(keep) < s.size:  # (one query token per request repeats none: no copy)
                s = s[keep]
        s = s.astype(np.int64, copy=False)
        ix, bounds = self._sorted_index(s) if s.size else (s, [0] * (self.num_ranks + 1))
        places = self.space.table.take(ix)  # take: no fancy-index set-up
        check_allocated(s, places, "selected")
        return s, ix, places, n - pads, bounds, rank

    def check_batch_rank(self, uniq: np.ndarray, rank: int) -> None:
        """DP: ValueError unless every one of the ascending distinct addresses is homed on `rank`."""
        if uniq.size:
            homes = self.space.home(uniq[[0, -1]])
            if homes[0] != rank or homes[1] != rank:
                raise ValueError(f"selected holds addresses of another rank than {rank}")

    def _translate_marker(self, flat: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """`translate` of a large batch of in-range addresses (min lo, max hi): storage positions deduplicated by the
        backend (the scatter marker over storage), turned back into addresses."""
        be, space = self.be, self.space
        ix = self.storage_index(flat, "selected", allow_padding=True, hi=hi)
        uix, _ = be.dedup(be.asarray(ix), self._dedup_marker(space.rows.size + 1))  # (left all False: in place)
        uix = be.to_numpy(uix)
        places = space.table.take(uix)  # batch-sized on the host: the table stays where the facade keeps it
        uniq = space.rows.ids(uix)
        check_allocated(uniq, places, "selected")
        num_refs = flat.size if lo >= 0 else int(flat.size - np.count_nonzero(flat == -1))  # -1 pads
        return uniq, uix, places, num_refs

    def _dedup_marker(self, n: int):
        """The dedup marker of at least `n` entries: numpy shares the process's (AddressSpace.scratch); a device
        backend keeps its own on the device (all False between accesses, so it never travels; the host's
        storage-sized marker used to be copied in and out on every access, and the copy thrown away)."""
        if self.be.name == "numpy":
            return self.space.scratch
        if self._marker is None or self._marker.shape[0] < n:
            held = 0 if self._marker is None else self._marker.shape[0]
            self._marker = self.be.asarray(np.zeros(max(n, 2 * held), dtype=bool))
        return self._marker[:n]

    def _sorted_index(self, a: np.ndarray) -> tuple[np.ndarray, list]:
        """Storage positions of ascending, in-range, distinct addresses (ValueError for one never handed out), and
        their home bounds (AddressSpace.home_bounds)."""
        rows, R, n = self.space.rows, self.num_ranks, a.size
        if rows.identity:  # (one rank)
            if int(a[-1]) >= self.space.table.size:
                raise ValueError(f"selected holds unallocated address {int(a[-1])}")
            return a, [0] * R + [n]
        shift, end = self.row_tables(rows)
        h0, h1 = int(a[0]) // rows.stride, int(a[-1]) // rows.stride
        if h0 == h1:  # one home rank (a DP batch): one shift, and the last address is the largest
            sh = int(shift[h0])
            if int(a[-1]) + sh >= int(end[h0]):
                ix = a + sh
                raise ValueError(f"selected holds unallocated address {int(a[np.flatnonzero(ix >= end[h0])[0]])}")
            return a + sh, [0] * (h0 + 1) + [n] * (R - h0)
        # Several homes (TP): each home's addresses are one run of the ascending batch, so only each run's last
        # (largest) address is checked against its row's end, and each run gets its row's shift: repeated per run
        # (a small batch), or added by a slice (many addresses: in place, no per-address shift array). No per-address
        # home (a division), shift and end gathers.
        cuts = a.searchsorted(self.space.home_starts[h0 + 1:h1 + 1]).tolist()
        bounds = [0] * (h0 + 1) + cuts + [n] * (R - h1)
        sh, ends = self._rows_lists
        if a.size < _RUN_SHIFT_MIN:
            los, his = [0] + cuts, cuts + [a.size]
            lens = [hi - lo for lo, hi in zip(los, his)]
            last = a.take([hi - 1 for hi, n in zip(his, lens) if n]).tolist()
            if any(x + sh[r] >= ends[r] for x, r in zip(last, [r for r, n in zip(range(h0, h1 + 1), lens) if n])):
                return self.storage_index(a, "selected", allow_padding=False), bounds  # raises, naming the first one
            return a + shift[h0:h1 + 1].repeat(lens), bounds
        ix = a + sh[h0]
        for r, lo, hi in zip(range(h0, h1 + 1), [0] + cuts, cuts + [a.size]):  # loop over home ranks
            if lo == hi:
                continue
            if r != h0:
                ix[lo:hi] += sh[r] - sh[h0]
            if int(ix[hi - 1]) >= ends[r]:
                return self.storage_index(a, "selected", allow_padding=False), bounds  # raises, naming the first one
        return ix, bounds


__all__ = ["AddressIndex", "check_allocated"]
