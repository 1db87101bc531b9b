"""The numpy backend: the reference implementation of every primitive (README.md gives the semantics)."""
from __future__ import annotations

import numpy as np

_TRIM_FACTOR = 4  # select_first trims its candidate words to each segment's first counts[r] when that cuts this much
_SORT_DEDUP_RATIO = 16  # dedup sorts a batch this many times shorter than its marker (bench/dedup_crossover.py)
_BIN_PASSES = 4  # lru_select counts the oldest stamps one pass each up to this many, then all at once
_BIT = (np.uint8(1) << np.arange(8, dtype=np.uint8)).astype(np.uint8)


class NumpyBackend:
    """Reference backend; arrays are numpy arrays and every state update is in place."""

    name = "numpy"

    def asarray(self, a):
        return a

    def to_numpy(self, a):
        return a

    # -- pipeline primitives -------------------------------------------------------------------------------------------
    def dedup(self, addrs, marker):
        # Work follows the batch, not the address storage: a batch much smaller than the marker is sorted (its
        # adjacent duplicates dropped), else scattered into the marker and the marker scanned (sorted for free).
        if addrs.size * _SORT_DEDUP_RATIO < marker.size:
            return self._dedup_sorted(addrs, marker.size), marker
        return self._dedup_marker(addrs, marker), marker

    @staticmethod
    def _dedup_sorted(addrs, size):
        """Sorted distinct values >= 0 (int64) by sorting a copy: int32 when `size` allows (sorts ~2x faster)."""
        a = addrs.reshape(-1).astype(np.int32 if size < 2**31 else np.int64)
        a.sort()
        a = a[np.searchsorted(a, 0):]  # -1 padding sorts first
        if a.size > 1:
            keep = np.empty(a.size, dtype=bool)
            keep[0] = True
            np.not_equal(a[1:], a[:-1], out=keep[1:])
            a = a[keep]
        return a.astype(np.int64)

    @staticmethod
    def _dedup_marker(addrs, marker):
        """Scatter-marker dedup: O(n) scatter + one scan of the marker, left all False; -1 padding lands on
        marker[-1] (never a valid address: the marker is longer than max(addrs))."""
        marker[addrs] = True
        uniq = np.flatnonzero(marker)
        marker[uniq] = False
        marker[-1] = False
        if uniq.size and uniq[-1] == marker.size - 1:
            uniq = uniq[:-1]
        return uniq.astype(np.int64, copy=False)

    def gather(self, table, idx):
        return table[idx]

    def scatter(self, table, idx, values):
        table[idx] = values
        return table

    def hit_mask(self, places, num_gpu_places):
        # One unsigned compare covers both bounds: negative places wrap to huge unsigned values.
        return places.view(np.dtype(f"u{places.dtype.itemsize}")) < num_gpu_places

    def bucket_of(self, stamps, slots, now, num_recent):
        age = now - stamps[slots]
        return np.clip(age, 0, num_recent + 1).astype(np.int32)

    def bitmap_set(self, bitmap, slots):
        return self._bitmap_write(bitmap, slots, True)

    def bitmap_clear(self, bitmap, slots):
        return self._bitmap_write(bitmap, slots, False)

    @staticmethod
    def _bitmap_write(bitmap, slots, value):
        if slots.size * 64 > bitmap.size * 8:
            # Many slots: unpack to one bool per slot, scatter, pack again (measured ~4x faster than ufunc.at).
            bits = np.unpackbits(bitmap, bitorder="little").view(bool)
            bits[slots] = value
            bitmap[:] = np.packbits(bits, bitorder="little")
        elif value:  # few slots: distinct clear bits, so adding the bit values equals OR-ing them
            np.add.at(bitmap, slots >> 3, _BIT[slots & 7])
        else:
            np.subtract.at(bitmap, slots >> 3, _BIT[slots & 7])
        return bitmap

    def summary(self, bitmap):
        nonzero = bitmap.view("<u8") != 0
        pad = (-nonzero.size) % 64
        if pad:
            nonzero = np.concatenate([nonzero, np.zeros(pad, dtype=bool)])
        return np.packbits(nonzero, bitorder="little")

    def select_first(self, bitmap, summary, seg_slots, counts):
        counts = np.asarray(counts, dtype=np.int64)
        nseg = counts.size
        words = bitmap.view("<u8")
        words_per_seg = seg_slots // 64
        cand = np.flatnonzero(np.unpackbits(summary, bitorder="little")[: words.size])  # non-empty words, ascending
        if nseg and cand.size > _TRIM_FACTOR * (int(counts.sum()) + nseg):
            # A flagged word holds >= 1 set bit unless stale, so a segment's first counts[r] flagged words usually
            # hold its answer: look only at those (exact: used where they hold counts[r] bits or are all there is).
            starts = np.searchsorted(cand, np.arange(nseg + 1, dtype=np.int64) * words_per_seg)
            ends = np.minimum(starts[:-1] + np.maximum(counts, 0), starts[1:])
            n = ends - starts[:-1]
            sub = cand.take(np.repeat(starts[:-1] - (np.cumsum(n) - n), n) + np.arange(int(n.sum())))
            total = np.bincount(sub // words_per_seg, weights=np.bitwise_count(words[sub]), minlength=nseg)
            if ((total >= counts) | (ends == starts[1:])).all():
                cand = sub
        popc = np.bitwise_count(words[cand]).astype(np.int64)
        seg = cand // words_per_seg
        seg_total = np.bincount(seg, weights=popc, minlength=nseg).astype(np.int64)
        seg_offset = np.cumsum(seg_total) - seg_total
        before = np.cumsum(popc) - popc - seg_offset[seg]  # set bits earlier in the same segment
        need = np.flatnonzero(before < counts[seg])  # words holding the bits to take
        take = cand.take(need)
        bits = np.unpackbits(bitmap.reshape(-1, 8).take(take, axis=0), axis=1, bitorder="little")
        rows, cols = np.nonzero(bits)
        slots = take.take(rows) * 64 + cols  # ascending
        found = np.minimum(counts, seg_total)
        if nseg == 1:
            return slots[: found[0]].astype(np.int64, copy=False), found
        sseg = seg.take(need).take(rows)
        per = np.bincount(sseg, minlength=nseg)
        rank_in_seg = np.arange(slots.size) - (np.cumsum(per) - per)[sseg]
        return slots.take(np.flatnonzero(rank_in_seg < counts[sseg])).astype(np.int64, copy=False), found

    def lru_select(self, stamps, eligible, seg_slots, counts):
        # Stamps are steps: a segment's stamps span few values and the victims carry the oldest. While the span fits
        # in the segment, the threshold bin t (the stamp of the counts[r]-th victim) is found by counting the oldest
        # bins (one pass each, then one bincount); the victims are the eligible slots below t in (stamp, slot) order,
        # then the lowest eligible slots at t: no partition of (stamp, slot) keys (_lru_select_sorted, any span).
        counts = np.asarray(counts, dtype=np.int64)
        out, found = [], np.zeros(counts.size, dtype=np.int64)
        for r, k in enumerate(counts.tolist()):  # loop over ranks (segments), not over slots
            if k <= 0:
                continue
            lo = r * seg_slots
            s, e = stamps[lo:lo + seg_slots], eligible[lo:lo + seg_slots]
            if s.size == 0:
                continue
            low, high = int(s.min()), int(s.max())
            span = high - low + 1
            if span > s.size or low <= -2**31 or high >= 2**31 - 1:
                got, _ = self._lru_select_sorted(s, e, s.size, counts[r:r + 1])
                out.append(got + lo)
                found[r] = got.size
                continue
            v = s.astype(np.int32)  # bin of each slot: 1 + stamp - low, 0 where ineligible (a segment at a time)
            v -= low - 1
            np.multiply(v, e, out=v)
            cum, t = 0, 1  # cum: eligible slots in bins below t
            while t <= span:
                if t > _BIN_PASSES:  # many bins to read: count them all at once
                    upto = np.cumsum(np.bincount(v, minlength=span + 1)[1:])  # eligible in bins 1..j
                    t = int(np.searchsorted(upto, k)) + 1  # span + 1: fewer than k eligible in all
                    cum = int(upto[t - 2]) if t >= 2 else 0
                    break
                n = int(np.count_nonzero(v == t))
                if cum + n >= k:
                    break
                cum, t = cum + n, t + 1
            if t > 1:  # every eligible slot below bin t: (v - 1) wraps to huge for ineligible slots
                below = np.flatnonzero((v - 1).view(np.uint32) < t - 1)
                if t > 2 and below.size > 1:
                    below = below.take(np.argsort(v.take(below), kind="stable"))  # (stamp, slot) order
            else:
                below = np.zeros(0, dtype=np.int64)
            if t <= span:
                below = np.concatenate([below, np.flatnonzero(v == t)[:k - below.size]])
            out.append(below + lo)
            found[r] = below.size
        slots = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
        return slots.astype(np.int64, copy=False), found

    @staticmethod
    def _lru_select_sorted(stamps, eligible, seg_slots, counts):
        """lru_select by partitioning (stamp, slot) keys: any stamp range."""
        counts = np.asarray(counts, dtype=np.int64)
        out, found = [], np.zeros(counts.size, dtype=np.int64)
        for r, k in enumerate(counts.tolist()):  # loop over ranks (segments), not over slots
            lo = r * seg_slots
            idx = np.flatnonzero(eligible[lo:lo + seg_slots])
            key = (stamps[lo + idx] + 1) * seg_slots + idx  # unique: (stamp, slot) order
            if k < idx.size:
                key = key[np.argpartition(key, k)[:k]] if k > 0 else key[:0]
            key = np.sort(key)
            out.append(lo + key % seg_slots)
            found[r] = key.size
        slots = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
        return slots.astype(np.int64, copy=False), found

    def gather_rows(self, pool, idx):
        return pool[idx]

    def scatter_rows(self, pool, idx, rows):
        pool[idx] = rows
        return pool
