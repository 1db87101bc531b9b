"""PB-LRU recency buckets as membership bitmaps: a ring of current/recent buckets and one cold bucket.

A GPU slot touched at step s (its stamp) is in ring row s % (K + 1) while its age (now - s) is <= K, and in the
cold bitmap after that. `rotate(now)` runs once per access batch (before the access at `now`): the ring row that is
about to hold stamp `now` still holds stamp now - K - 1, which just turned cold, so it is OR-ed into the cold bitmap
and cleared. Eviction order (DESIGN §3): cold, then recent buckets oldest -> newest; age 0 (current) is never a
candidate. Candidate search goes through each bitmap's summary (one bit per non-empty 64-slot word); numpy derives a
summary per search (O(slots / 64)), a GPU kernel would keep it current with atomics. Member counts per bucket let
the search skip empty buckets."""
from __future__ import annotations

import numpy as np


class BucketBitmaps:
    def __init__(self, num_places: int, num_recent: int):
        self.num_recent = num_recent
        self.ring = np.zeros((num_recent + 1, num_places // 8), dtype=np.uint8)
        self.cold = np.zeros(num_places // 8, dtype=np.uint8)
        # Members per bucket (ring rows, then cold): lets the candidate search skip empty buckets without a scan.
        self.count = np.zeros(num_recent + 2, dtype=np.int64)

    def copy(self) -> BucketBitmaps:
        other = BucketBitmaps.__new__(BucketBitmaps)
        other.num_recent, other.ring, other.cold = self.num_recent, self.ring.copy(), self.cold.copy()
        other.count = self.count.copy()
        return other

    def row(self, stamp: int) -> int:
        return stamp % (self.num_recent + 1)

    def rotate(self, now: int) -> None:
        i = self.row(now)
        if self.count[i]:
            np.bitwise_or(self.cold, self.ring[i], out=self.cold)
            self.ring[i] = 0
            self.count[-1] += self.count[i]
            self.count[i] = 0

    def _write(self, be, age: int, now: int, slots: np.ndarray, value: bool) -> None:
        op = be.bitmap_set if value else be.bitmap_clear
        if age > self.num_recent:
            self.cold = be.to_numpy(op(be.asarray(self.cold), be.asarray(slots)))
            self.count[-1] += slots.size if value else -slots.size
        else:
            i = self.row(now - age)
            self.ring[i] = be.to_numpy(op(be.asarray(self.ring[i]), be.asarray(slots)))
            self.count[i] += slots.size if value else -slots.size

    def remove(self, be, slots: np.ndarray, stamps: np.ndarray, now: int) -> None:
        """Take occupied slots out of whatever bucket their stamps put them in (age >= 0 at `now`)."""
        if slots.size == 0:
            return
        ages = be.to_numpy(be.bucket_of(be.asarray(stamps), be.asarray(slots), now, self.num_recent))
        present = np.flatnonzero(np.bincount(ages, minlength=self.num_recent + 2))
        if present.size == 1:
            return self._write(be, int(present[0]), now, slots, False)
        for age in present.tolist():  # loop over buckets (at most K + 2)
            self._write(be, age, now, slots.take(np.flatnonzero(ages == age)), False)

    def add(self, be, slots: np.ndarray, stamp: int, now: int) -> None:
        """Put slots (not in any bucket) into the bucket of `stamp` as seen at `now`."""
        if slots.size:
            self._write(be, max(now - stamp, 0), now, slots, True)

    def eviction_order(self, now: int) -> list[tuple[str, int]]:
        """(kind, row) of the candidate bitmaps in eviction order: cold, then ages K .. 1."""
        return [("cold", -1)] + [("ring", self.row(now - age)) for age in range(self.num_recent, 0, -1)]

    def get(self, kind: str, row: int) -> np.ndarray:
        return self.cold if kind == "cold" else self.ring[row]

    def size(self, kind: str, row: int) -> int:
        return int(self.count[-1] if kind == "cold" else self.count[row])

    def put(self, kind: str, row: int, bitmap: np.ndarray, taken: int) -> None:
        """Install `bitmap`, the bucket's bitmap after `taken` members were claimed as replacement slots."""
        if kind == "cold":
            self.cold = bitmap
            self.count[-1] -= taken
        else:
            self.ring[row] = bitmap
            self.count[row] -= taken


__all__ = ["BucketBitmaps"]
