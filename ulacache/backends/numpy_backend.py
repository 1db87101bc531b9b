"""The numpy backend: the reference implementation of every primitive (README.md gives the semantics)."""
from __future__ import annotations

import numpy as np

from .. import threads

_SORT_DEDUP_RATIO = 16  # dedup sorts a batch this many times shorter than its marker (bench/dedup_crossover.py)
_BIN_PASSES = 4  # lru_select counts the oldest stamps one pass each up to this many, then all at once
_EMPTY = np.zeros(0, dtype=np.int64)
_SLOT_IN_WORD = np.arange(64, dtype=np.int64)
_TRIM_FACTOR = 4  # select_first reads every flag at once when they are at most this many times the slots asked
_FEW_SLOTS = 64  # select_first takes at most this many slots one by one in Python (no per-call array passes)
_FEW_WORDS = 64  # ... reading at most this many summary words (more: the vectorized search)
_FEW_BITS = 8  # bitmap writes of at most this many slots update byte by byte in Python
_RUN_BITS = 4096  # writes of this many slots or more check for one contiguous range (whole bytes at once)
_BIT = (np.uint8(1) << np.arange(8, dtype=np.uint8)).astype(np.uint8)
_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").astype(bool)  # (256, 8)


def _set_bits(words: np.ndarray) -> np.ndarray:
    """Set-bit positions of uint64 `words` read as one little-endian bit string (word i's bit b is 64 i + b),
    ascending: np.unpackbits(words.view(np.uint8), bitorder="little").nonzero()[0], unpacking only the non-zero
    bytes through a byte table (free-slot words hold ~6 set bits: measured ~2x faster than unpacking every bit)."""
    by = words.view(np.uint8)
    nzb = by.nonzero()[0]
    flat = np.flatnonzero(_BYTE_BITS.take(by.take(nzb), axis=0))
    return nzb.take(flat >> 3) * 8 + (flat & 7)


class NumpyBackend:
    """Reference backend; arrays are numpy arrays and every state update is in place."""

    name = "numpy"
    # State lives in host numpy arrays updated in place: callers may update a few entries with Python scalars instead
    # of calling primitives (small batches: per-call array passes cost more than the work). Same results.
    scalar_updates = True

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
        a = a[a.searchsorted(0):]  # -1 padding sorts first
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
        threads.scatter(marker, addrs, True)  # (repeated positions all write True: the same on threads)
        uniq = threads.flatnonzero(marker)
        threads.scatter(marker, uniq, False)
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
        age = stamps.take(slots)
        np.subtract(now, age, out=age)
        np.maximum(age, 0, out=age)  # two in-place bounds: np.clip costs ~30 us more per call
        return np.minimum(age, num_recent + 1, out=np.empty(age.size, dtype=np.int32), casting="unsafe")

    def bitmap_set(self, bitmap, slots):
        return self._bitmap_write(bitmap, slots, True)

    def bitmap_clear(self, bitmap, slots):
        return self._bitmap_write(bitmap, slots, False)

    @staticmethod
    def _bitmap_write(bitmap, slots, value):
        n = slots.size
        if n <= _FEW_BITS:  # one Python update per slot (ufunc.at costs ~14 us per call)
            for s in slots.tolist():
                if value:
                    bitmap[s >> 3] |= 1 << (s & 7)
                else:
                    bitmap[s >> 3] &= 255 ^ (1 << (s & 7))
            return bitmap
        lo = int(slots[0])
        if n >= _RUN_BITS and int(slots[-1]) == lo + n - 1 and slots.min() == lo and slots.max() == lo + n - 1:
            # n distinct slots spanning n values: the range lo .. lo + n - 1 (a bulk claim of free slots)
            return NumpyBackend._bitmap_write_range(bitmap, lo, lo + n, value)
        if n * 64 > bitmap.size * 8:
            # Many slots: unpack to one bool per slot, scatter, pack again (measured ~4x faster than ufunc.at).
            bits = np.unpackbits(bitmap, bitorder="little").view(bool)
            bits[slots] = value
            bitmap[:] = np.packbits(bits, bitorder="little")
        elif value:  # few slots: distinct clear bits, so adding the bit values equals OR-ing them
            np.add.at(bitmap, slots >> 3, _BIT[slots & 7])
        else:
            np.subtract.at(bitmap, slots >> 3, _BIT[slots & 7])
        return bitmap

    @staticmethod
    def _bitmap_write_range(bitmap, lo, hi, value):
        """Set (clear) the bits of slots lo .. hi - 1 (hi - lo >= 16): partial bytes at both ends, whole bytes
        in between."""
        head, tail = -(-lo // 8), hi // 8  # whole bytes: head .. tail - 1
        if lo & 7:
            mask = 256 - (1 << (lo & 7))  # bits lo & 7 .. 7 of byte lo >> 3
            bitmap[lo >> 3] = bitmap[lo >> 3] | mask if value else bitmap[lo >> 3] & (255 ^ mask)
        bitmap[head:tail] = 255 if value else 0
        if hi & 7:
            mask = (1 << (hi & 7)) - 1  # bits 0 .. (hi & 7) - 1 of byte hi >> 3
            bitmap[tail] = bitmap[tail] | mask if value else bitmap[tail] & (255 ^ mask)
        return bitmap

    def summary(self, bitmap):
        nonzero = bitmap.view("<u8") != 0
        pad = (-nonzero.size) % 64
        if pad:
            nonzero = np.concatenate([nonzero, np.zeros(pad, dtype=bool)])
        return np.packbits(nonzero, bitorder="little")

    def select_first(self, bitmap, summary, seg_slots, counts):
        # Work follows the slots taken, not the bitmap: a few slots are walked one by one in Python ints, more are
        # found by array passes over only the flags and words they need (_select_many).
        counts = np.asarray(counts, dtype=np.int64)
        words, flags = bitmap.view("<u8"), summary.view("<u8")
        if int(np.maximum(counts, 0).sum()) <= _FEW_SLOTS:
            got = self._select_few(words, flags, seg_slots >> 6, counts)
            if got is not None:
                return got
        return self._select_many(words, flags, seg_slots >> 6, counts)

    @staticmethod
    def _select_many(words, flags, wps, counts):
        """select_first by array passes, each segment read only as far as its count needs: its first flags (summary
        bits) name its first candidate words; a flagged word holds >= 1 set bit unless stale (cleared since it was
        flagged), so the first counts[r] flags usually suffice, and a segment left short while it has unread flags
        reads 4x more (all flags at once when there are few more than the slots asked). Of the candidates, the words
        up to the one holding the counts[r]-th set bit are unpacked (whole words without unpacking)."""
        nseg = counts.size
        want = np.maximum(counts, 0)
        nzf = flags.nonzero()[0]  # summary words holding flags, ascending
        if nzf.size == 0 or not want.any():
            return np.zeros(0, dtype=np.int64), np.minimum(counts, 0)
        per = np.bitwise_count(flags.take(nzf))
        if int(per.sum()) <= _TRIM_FACTOR * (int(want.sum()) + nseg):  # few flags: read them all
            nw = min(words.size, nseg * wps)
            p = _set_bits(flags.take(nzf))
            cw = nzf.take(p >> 6) * 64 + (p & 63)
            if cw[-1] >= nw:  # flags past the segments (or the bitmap)
                cw = cw[:cw.searchsorted(nw)]
            cseg = cw // wps
            pc, csum, base, tot = NumpyBackend._tally(words, cw, cseg, nseg)
        else:
            lo = np.arange(nseg, dtype=np.int64) * wps  # first word of each segment
            first = nzf.searchsorted(lo >> 6)  # segment r's flag words: nzf[first[r]:end[r]]
            end = nzf.searchsorted(((lo + wps - 1) >> 6) + 1)
            fc = np.zeros(nzf.size + 1, dtype=np.int64)
            per.cumsum(out=fc[1:])  # flags in nzf[:i]
            slack = 0 if wps & 63 == 0 else 63  # a segment's first flag word may hold up to 63 of the one before
            need = want
            while True:
                stop = np.minimum(fc.searchsorted(fc.take(first) + need + slack), end)
                stop[want == 0] = first[want == 0]
                cw, cseg = NumpyBackend._flagged_words(flags, nzf, first, stop, lo, wps, slack, words.size)
                pc, csum, base, tot = NumpyBackend._tally(words, cw, cseg, nseg)
                short = (tot < want) & (stop < end)
                if not short.any():
                    break
                need = np.where(short, 4 * need, need)  # stale flags: read further (geometric: O(flags read))
        before = csum[:-1] - base.take(cseg)  # set bits before each candidate, within its segment
        use = (before < want.take(cseg)).nonzero()[0]  # candidates holding the bits to take
        wu, found = cw.take(use), np.minimum(counts, tot)
        if (pc.take(use) == 64).all():  # whole words (free regions): their slots without unpacking
            slots = np.add.outer(wu * 64, _SLOT_IN_WORD)
            if slots.size != int(np.maximum(found, 0).sum()):  # a segment's last word holds more than it needs
                keep = np.add.outer(before.take(use), _SLOT_IN_WORD) < want.take(cseg.take(use))[:, None]
                return slots[keep], found
            return slots.reshape(-1), found
        p = _set_bits(words.take(wu))
        k = p >> 6
        slots = wu.take(k) * 64 + (p & 63)  # ascending within each segment, segments in order
        if slots.size != int(np.maximum(found, 0).sum()):  # a segment's last word holds more than it needs
            pu = pc.take(use).astype(np.int64)
            first_bit = pu.cumsum() - pu  # position in p of each used word's first bit
            rank = np.arange(p.size) - first_bit.take(k) + before.take(use).take(k)  # of each bit in its segment
            slots = slots[rank < want.take(cseg.take(use).take(k))]
        return slots, found

    @staticmethod
    def _tally(words, cw, cseg, nseg):
        """Set bits of candidate words cw (grouped by segment cseg): per word, running (csum[i]: in cw[:i]), the
        running count at each segment's first candidate, and per segment."""
        pc = np.bitwise_count(words.take(cw))
        csum = np.zeros(cw.size + 1, dtype=np.int64)
        pc.cumsum(out=csum[1:])
        b = cseg.searchsorted(np.arange(nseg + 1))  # segment r's candidates: cw[b[r]:b[r + 1]]
        base = csum.take(b[:-1])
        return pc, csum, base, csum.take(b[1:]) - base

    @staticmethod
    def _select_few(words, flags, wps, counts):
        """select_first for a few slots in Python ints: per segment, its summary words in order; of each, the
        non-zero flagged words (one slice scan skips stale flags), their set bits lowest first. None when more than
        _FEW_WORDS summary words would be read: the caller vectorizes."""
        out, found, budget, nw = [], [], _FEW_WORDS, words.size
        for r, k in enumerate(counts.tolist()):
            if k <= 0:
                found.append(k)
                continue
            lo, hi = r * wps, min((r + 1) * wps, nw)  # the segment's words
            want = k
            j0 = lo >> 6
            for j in flags[j0:((hi - 1) >> 6) + 1].nonzero()[0].tolist():
                budget -= 1
                if budget < 0:
                    return None
                j += j0
                f, a = int(flags[j]), max(lo, j << 6)
                for w_ix in words[a:min(hi, (j + 1) << 6)].nonzero()[0].tolist():
                    w_ix += a
                    if not (f >> (w_ix & 63)) & 1:  # a word without its flag is not examined
                        continue
                    w = int(words[w_ix])
                    while w and k:
                        bit = w & -w
                        w ^= bit
                        out.append((w_ix << 6) + bit.bit_length() - 1)
                        k -= 1
                    if not k:
                        break
                if not k:
                    break
            found.append(want - k)
        return np.array(out, dtype=np.int64), np.array(found, dtype=np.int64)

    @staticmethod
    def _flagged_words(flags, nzf, first, stop, lo, wps, slack, num_words):
        """Words flagged in summary words nzf[first[r]:stop[r]] that lie in segment r: (word, segment), ascending."""
        n = stop - first
        total = int(n.sum())
        if total == 0:
            return _EMPTY, _EMPTY
        pos = np.arange(total, dtype=np.int64)
        if n.size > 1:
            pos += (first - (n.cumsum() - n)).repeat(n)
            seg = np.arange(n.size, dtype=np.int64).repeat(n)
        else:
            pos += first[0]
            seg = np.zeros(total, dtype=np.int64)
        fw = nzf.take(pos)
        p = _set_bits(flags.take(fw))
        k = p >> 6
        cw, cseg = fw.take(k) * 64 + (p & 63), seg.take(k)
        if slack or lo[-1] + wps > num_words:  # drop flags of a neighbouring segment (or past the bitmap)
            start = lo.take(cseg)
            keep = ((cw >= start) & (cw < np.minimum(start + wps, num_words))).nonzero()[0]
            cw, cseg = cw.take(keep), cseg.take(keep)
        return cw, cseg

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
                    upto = np.bincount(v, minlength=span + 1)[1:].cumsum()  # eligible in bins 1..j
                    t = int(upto.searchsorted(k)) + 1  # span + 1: fewer than k eligible in all
                    cum = int(upto[t - 2]) if t >= 2 else 0
                    break
                n = int(np.count_nonzero(v == t))
                if cum + n >= k:
                    break
                cum, t = cum + n, t + 1
            if t > 1:  # every eligible slot below bin t: (v - 1) wraps to huge for ineligible slots
                below = ((v - 1).view(np.uint32) < t - 1).nonzero()[0]
                if t > 2 and below.size > 1:
                    below = below.take(v.take(below).argsort(kind="stable"))  # (stamp, slot) order
            else:
                below = np.zeros(0, dtype=np.int64)
            if t <= span:
                below = np.concatenate([below, (v == t).nonzero()[0][:k - below.size]])
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
            idx = eligible[lo:lo + seg_slots].nonzero()[0]
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
