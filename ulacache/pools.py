"""The one slot-pool class (GPU pools, TP local buffers, the exact-LRU policy) and the CPU pools' free lists.

`Pool` is the slot pool of every slot kind: GPU pools (pb-lru, lru), TP local buffers. Its storage is a set of
rank-row tables (rows.RankRows: memory follows the slots in use, never the budget). It keeps, per slot in
storage, the owner (address held, -1 none), the recency stamp (step of the last touch) and a free bitmap with a
summary (one flag per 64-slot word, updated incrementally by every write) so free-slot search reads only the words
it needs. Replacement: `take_free` (lowest free slots per rank) and `select_free_then_lru` (exact LRU by
(stamp, slot) over occupied slots not protected by the batch) for the exact-LRU policy; the TP local buffers take
free slots here and their LRU victims from a stamp log (lru_log.StampLog).
"""
from __future__ import annotations

import numpy as np

from .rows import IdStack, RankRows, id_dtype, pad64

FEW_SLOTS = 512  # take_free of at most this many slots runs in Python ints (numpy backend; measured, 8 ranks with holes:
# 512 slots 190-320 us vs 260-460 us by select_first, 1024 slots 380-430 vs 230-270 us)
_FEW_CHUNK_WORDS = 16  # _take_few reads a rank's bitmap words below high in chunks of 16, 64, 256, .. words
_CHUNK = np.arange(_FEW_CHUNK_WORDS, dtype=np.int64)
_FULL = (1 << 64) - 1
_FULL_BYTES = [b""]  # all-ones bytes, grown on demand: whole free words are compared as bytes (a numpy compare with
# 2**64 - 1 costs ~5x more instructions)


def _all_free(words: np.ndarray) -> bool:
    """Every bit of these bitmap words set."""
    n = 8 * words.size
    if len(_FULL_BYTES[0]) < n:
        _FULL_BYTES[0] = b"\xff" * max(n, 2 * len(_FULL_BYTES[0]))
    return words.tobytes() == _FULL_BYTES[0][:n]


def pack_summary(nonzero: np.ndarray) -> np.ndarray:
    """The backends' summary bitmap from per-word non-zero flags (bit w set <=> word w non-zero, padded to 64 bits)."""
    pad = (-nonzero.size) % 64
    if pad:
        nonzero = np.concatenate([nonzero, np.zeros(pad, dtype=bool)])
    return np.packbits(nonzero, bitorder="little")


def merge_by_rank(parts: list[np.ndarray], found: list[np.ndarray]) -> np.ndarray:
    """Concatenate arrays each grouped by rank (found[k][r] items of rank r in parts[k]) into one grouped by rank,
    part order kept within a rank (what a stable sort by rank gives, without the sort)."""
    keep = [k for k, p in enumerate(parts) if p.size]
    if len(keep) <= 1 or found[0].size == 1:
        return np.concatenate(parts) if len(keep) != 1 else parts[keep[0]]
    parts, found = [parts[k] for k in keep], [found[k] for k in keep]
    f = np.stack(found)  # (parts, R)
    start = np.cumsum(f.sum(axis=0)) - f.sum(axis=0)  # first position of each rank
    before = np.cumsum(f, axis=0) - f  # items of the rank in earlier parts
    out = np.empty(int(f.sum()), dtype=np.int64)
    for k, p in enumerate(parts):  # loop over parts (a few)
        fk = f[k]
        first = np.cumsum(fk) - fk
        out[np.repeat(start + before[k] - first, fk) + np.arange(p.size)] = p
    return out


class Pool:
    """R ranks x `slots` slots; rank r's slot s is place base + r * seg + s (seg = slots padded to 64).

    Storage (by `idx`, see RankRows): `own` (address, -1 free), `stamp` (last-touch step), `free` (free bitmap,
    bits of padding slots never set) with `free_nz` (flags covering its non-zero words, kept like the bucket
    summaries in bitmaps.py: raised by a set, recomputed after as many clears as words). `owner`, `stamps`,
    `free_bm` are dense copies over all R * seg places (for snapshots). `num_free` are the committed free counts
    per rank the caller reports; `in_use` counts slots taken (claimed at planning time)."""

    def __init__(self, num_ranks: int, slots: int, base: int = 0, exact_lru: bool = False,
                 address_limit: int | None = None, lru_log_mode: str = "auto", stamp_dtype=np.int64):
        from .lru_log import LruLog

        self.R, self.slots, self.seg, self.base = num_ranks, slots, pad64(slots), base
        self.num_places = num_ranks * self.seg
        self.rows = RankRows(num_ranks, self.seg, self.seg)
        self.own = np.zeros(0, dtype=id_dtype(address_limit))  # int32 while the addresses held fit
        self.stamp = np.zeros(0, dtype=stamp_dtype)  # narrow where clocks stay small (TP buffers, pb-lru epochs)
        self._stamp_max = int(np.iinfo(stamp_dtype).max)  # widened (`fit_stamp`) before a clock outgrows it
        self.free = np.zeros(0, dtype=np.uint8)
        self.free_nz = np.zeros(0, dtype=bool)
        self.cleared = 0
        self.num_free = np.full(num_ranks, slots, dtype=np.int64)
        self.in_use = np.zeros(num_ranks, dtype=np.int64)
        # Slots of each rank ever taken lie below high[r] (row-relative); the free ones below it are holes, so a rank
        # with in_use == high has its lowest free slots at [high, ..): taken without a search (fresh pools, prompts).
        self.high = np.zeros(num_ranks, dtype=np.int64)
        # Row-relative bitmap word of each rank below which no slot is free: a few-slot take starts its search there
        # (takes fill holes lowest first, so the words before the first hole are all taken and need no re-reading).
        self.low = np.zeros(num_ranks, dtype=np.int64)
        self.listeners: list = []  # grow(old_cap) of storage laid out like this pool's (bucket bitmaps)
        self.log = LruLog(self, lru_log_mode) if exact_lru else None  # exact LRU order kept per rank (lru_log.py)

    @property
    def cap(self) -> int:
        return self.rows.cap

    # -- layout --------------------------------------------------------------------------------------------------------
    def idx(self, places: np.ndarray) -> np.ndarray:
        return self.rows.index(places - self.base if self.base else places)

    def places(self, idx: np.ndarray) -> np.ndarray:
        p = self.rows.ids(idx)
        return p + self.base if self.base else p

    def rank_of_idx(self, idx: np.ndarray) -> np.ndarray:
        return idx // max(self.cap, 1)

    def reserve(self, extra: np.ndarray) -> None:
        """Grow storage so that `extra[r]` more slots of each rank can be taken lowest-first."""
        if self.cap == self.seg:
            return
        need = min(int((self.in_use + extra).max()), self.seg)
        if need <= self.cap:
            return
        old = self.rows.grow(need)
        self.own = self.rows.relayout(self.own, old, -1)
        self.stamp = self.rows.relayout(self.stamp, old, 0)
        self.free = self.rows.relayout(self.free, old, 0, 1 / 8)
        self.free_nz = self.rows.relayout(self.free_nz, old, False, 1 / 64)
        fresh = (np.arange(old, self.cap) < self.slots)  # new valid slots are free (the new words only: old % 64 == 0)
        row = np.packbits(fresh, bitorder="little")
        self.free.reshape(self.R, -1)[:, old // 8:] = row
        self.free_nz.reshape(self.R, -1)[:, old // 64:] = row.view("<u8") != 0
        if self.log is not None and self.log.active and self.R > 1 and old:
            cap = self.cap
            self.log.remap(lambda a: a + (a // old) * (cap - old))
        for grow in self.listeners:
            grow(old)

    # -- free slots ----------------------------------------------------------------------------------------------------
    def summary(self) -> np.ndarray:
        return pack_summary(self.free_nz)

    def _write_free(self, be, idx: np.ndarray, value: bool) -> None:
        op = be.bitmap_set if value else be.bitmap_clear
        self.free = be.to_numpy(op(be.asarray(self.free), be.asarray(idx)))
        if value:
            self.free_nz[idx >> 6] = True
        else:
            self._cleared(idx.size)

    def _cleared(self, n: int) -> None:
        """Count n slots taken (free bits cleared); the word flags are recomputed once the clears outnumber the words
        (until then a flag may be stale-set, never missing: amortized O(1) per slot)."""
        self.cleared += n
        if self.cleared > self.free_nz.size:
            self.free_nz[:] = self.free.view("<u8") != 0
            self.cleared = 0

    def take_free(self, be, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """min(counts[r], free) lowest free slots of each rank, as storage idx grouped by rank; and found[r]."""
        scalar = getattr(be, "scalar_updates", False)
        if scalar:
            c = counts.tolist()
            if sum(c) <= FEW_SLOTS and min(c) >= 0:
                return self._take_few(c)
        if not (counts > 0).any() or (self.in_use >= self.slots).all():  # nothing asked or nothing free
            return np.zeros(0, dtype=np.int64), np.zeros(self.R, dtype=np.int64)
        self.reserve(counts)
        if not ((counts > 0) & (self.in_use < self.high)).any():  # no holes where slots are asked: fresh ones
            return self._take_fresh(np.minimum(np.maximum(counts, 0), self.slots - self.high))
        if scalar and min(c) >= 0:  # many slots: one run of free slots per rank, when they are (no bitmap search)
            got = self._take_runs(c)
            if got is not None:
                return got
        bm = be.asarray(self.free)
        s, found = be.select_first(bm, be.asarray(self.summary()), max(self.cap, 64), be.asarray(counts))
        s, found = be.to_numpy(s), be.to_numpy(found)
        if s.size:
            self._write_free(be, s, False)
            self.in_use += found
            last = s.take(np.cumsum(found)[found > 0] - 1)  # each rank's highest slot taken (grouped, ascending)
            rows = np.flatnonzero(found)
            self.high[rows] = np.maximum(self.high[rows], last - rows * self.cap + 1)
            self.low[rows] = np.maximum(self.low[rows], (last - rows * self.cap) >> 6)  # lowest free ones taken
        return s, found

    def _take_runs(self, counts: list) -> tuple[np.ndarray, np.ndarray] | None:
        """`take_free` (numpy backend) when each rank asked has its counts[r] lowest free slots in one run (a local
        buffer refilled after a request's copies were dropped, a pool's fresh slots): checked from each rank's lowest
        free slot by its edge words and a compare of the whole words between, then claimed by clearing those bits
        (whole words at once); what select_first returns, the same state after. None, with nothing changed, when
        some rank's are not one run (or it has fewer free slots than asked)."""
        runs = self._find_runs(counts)
        return None if runs is None else self._claim_runs(runs)

    def _find_runs(self, counts: list) -> list | None:
        """`_take_runs`' check, every rank before any slot is claimed: per rank asked (r, its lowest free slot p,
        k = counts[r], the words a and b of the run's first and last slot), or None when some rank's are not one run."""
        iu, cap, slots, low = self.in_use.tolist(), self.cap, self.slots, self.low.tolist()  # (storage reserved)
        wpr = cap >> 6
        words = self.free.view("<u8")
        item = words.item
        runs = []
        for r, k in enumerate(counts):  # loop over ranks: check every rank before claiming any slot
            if not k:
                continue
            a = r * wpr + low[r]  # the rank's lowest free word
            if iu[r] + k > slots or a >= (r + 1) * wpr:
                return None
            v = item(a)
            if not v and a + 1 < (r + 1) * wpr:  # (a take that ended at a word's last free slot left low there)
                a += 1
                v = item(a)
            if not v:
                return None
            t = (v & -v).bit_length() - 1
            p = (a << 6) + t  # the rank's lowest free slot
            b = (p + k - 1) >> 6  # the word of the run's last slot
            if b >= (r + 1) * wpr:
                return None
            if a == b:
                m = ((1 << k) - 1) << t
                if v & m != m:
                    return None
            else:
                e = ((p + k - 1) & 63) + 1  # the run's bits in word b: 0 .. e - 1
                if v >> t != _FULL >> t or item(b) & ((1 << e) - 1) != (1 << e) - 1:
                    return None
                if b > a + 1 and not _all_free(words[a + 1:b]):
                    return None
            runs.append((r, p, k, a, b))
        return runs

    def _claim_runs(self, runs: list) -> tuple[np.ndarray, np.ndarray]:
        """`_take_runs`' claim of the runs `_find_runs` found: their bits cleared, the counters moved; the slots taken
        (grouped by rank, ascending) and found per rank."""
        iu, cap, low, high = self.in_use.tolist(), self.cap, self.low.tolist(), self.high.tolist()
        words = self.free.view("<u8")
        item = words.item
        found = [0] * self.R
        for r, p, k, a, b in runs:  # claim: clear the runs' bits
            t = p & 63
            if a == b:
                words[a] = item(a) & ~(((1 << k) - 1) << t)
            else:
                words[a] = item(a) & ((1 << t) - 1)
                words[a + 1:b].fill(0)
                e = ((p + k - 1) & 63) + 1
                words[b] = item(b) >> e << e
            found[r] = k
            iu[r] += k
            last = p + k - 1 - r * cap
            if last >= high[r]:
                high[r] = last + 1
            low[r] = last >> 6  # (the lowest free ones were taken)
        n = sum(found)
        starts = np.array([p for _, p, _, _, _ in runs], dtype=np.int64)
        lens = np.array([k for _, _, k, _, _ in runs], dtype=np.int64)
        s = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(n, dtype=np.int64)
        self._cleared(n)
        self.in_use[:], self.high[:], self.low[:] = iu, high, low
        return s, np.array(found, dtype=np.int64)

    def _take_few(self, counts: list) -> tuple[np.ndarray, np.ndarray]:
        """`take_free` of a few slots (numpy backend) in Python ints: per rank its lowest free slots (`_claim`),
        what the backend's select_first returns, and the same state after (bitmap, summary, counters). The first
        chunk of words of every rank asked is read by one gather; the counters are read and written once."""
        R, iu = self.R, self.in_use.tolist()
        if not any(counts) or min(iu) >= self.slots:  # nothing asked or nothing free
            return np.zeros(0, dtype=np.int64), np.zeros(R, dtype=np.int64)
        if self.cap < self.seg and min(max(u + k for u, k in zip(iu, counts)), self.seg) > self.cap:
            self.reserve(np.array(counts, dtype=np.int64))
        cap, high, low = self.cap, self.high.tolist(), self.low.tolist()
        words = self.free.view("<u8")
        ranks = [r for r, k in enumerate(counts) if k]
        start = [((r * cap) >> 6) + low[r] for r in ranks]
        first = words.take(np.add.outer(start, _CHUNK), mode="clip").tolist()  # each rank's words from its low
        out, found = [], [0] * R
        wpr = cap >> 6  # words per rank
        for r, a, chunk in zip(ranks, start, first):  # loop over ranks
            k, v = counts[r], chunk[0]
            if v != _FULL and k <= v.bit_count() and a < (r + 1) * wpr:  # (most takes) the lowest free word suffices
                got, base = [], a << 6
                for _ in range(k):
                    bit = v & -v
                    v ^= bit
                    got.append(base + bit.bit_length() - 1)
                words[a] = v
            else:
                got = self._claim(words, r, k, a, chunk)
            if got:
                n = len(got)
                found[r], iu[r] = n, iu[r] + n
                last = got[-1] - r * cap
                high[r] = max(high[r], last + 1)
                low[r] = last >> 6
                out += got
        self._cleared(len(out))
        self.in_use[:], self.high[:], self.low[:] = iu, high, low
        return np.array(out, dtype=np.int64), np.array(found, dtype=np.int64)

    def take_one(self, r: int) -> int:
        """`take_free` of one slot of rank r (numpy backend) as an int: its lowest free slot (storage idx), -1 when
        it has none; the same state after. A decode token's GPU slot: no per-rank lists or arrays."""
        iu = int(self.in_use[r])
        if iu >= self.slots:
            return -1
        if self.cap < self.seg and iu + 1 > self.cap:
            extra = np.zeros(self.R, dtype=np.int64)
            extra[r] = 1
            self.reserve(extra)
        wpr = self.cap >> 6
        words = self.free.view("<u8")
        a = r * wpr + int(self.low[r])
        v = words.item(a) if a < (r + 1) * wpr else 0
        if v:  # (most takes) the lowest free word holds it
            bit = v & -v
            words[a] = v ^ bit
            g = (a << 6) + bit.bit_length() - 1
        else:
            got = self._claim(words, r, 1, a, None)
            if not got:
                return -1
            g = got[0]
        last = g - r * self.cap
        self.in_use[r] = iu + 1
        if last >= self.high[r]:
            self.high[r] = last + 1
        self.low[r] = last >> 6
        self._cleared(1)
        return g

    def _claim(self, words: np.ndarray, r: int, k: int, a: int, chunk: list | None) -> list:
        """Claim (clear the free bits of) up to k lowest free slots of rank r, storage idx ascending, in Python
        ints: the set bits of its free words from word `a` (its lowest free word; `chunk`: the values of the
        first words from there when read already), read in chunks growing x4 (a take usually ends in the first
        words holding free bits, the holes below high or the fresh slots from it: all free slots have their bit
        set), up to the end of the rank's row. Each word is written once, with all its bits taken. The caller
        keeps the counters."""
        end = ((r + 1) * self.cap) >> 6
        got, need, step = [], k, _FEW_CHUNK_WORDS
        while a < end:
            b = min(a + step, end)
            if chunk is not None:  # this chunk was read already
                ws, vals, chunk = range(a, b), chunk[:b - a], None
            else:
                part = words[a:b]
                nz = part.nonzero()[0]
                ws, vals = (nz + a).tolist(), part.take(nz).tolist()
            for w, v in zip(ws, vals):
                if not v:
                    continue
                base = w << 6
                if v == _FULL and need >= 64:  # a whole free word (fresh slots)
                    got += range(base, base + 64)
                    words[w] = 0
                    need -= 64
                else:
                    left = v
                    while left and need:
                        bit = left & -left
                        left ^= bit
                        got.append(base + bit.bit_length() - 1)
                        need -= 1
                    words[w] = left
                if not need:
                    return got
            a, step = b, step * 4
        return got

    def _take_fresh(self, found: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slots [high[r], high[r] + found[r]) of each rank (all free: no holes below), claimed by clearing their free
        bits as byte ranges; what select_first would return there, without reading the bitmap."""
        cap, fb = self.cap, self.free
        start = np.arange(self.R, dtype=np.int64) * cap + self.high
        n = int(found.sum())
        s = np.repeat(start - (np.cumsum(found) - found), found) + np.arange(n, dtype=np.int64)
        for a, k in zip(start.tolist(), found.tolist()):  # loop over ranks: clear bits [a, a + k)
            if k:
                b = a + k
                lo, hi = -(-a // 8), b // 8  # whole bytes inside the range
                if lo <= hi:
                    fb[lo:hi] = 0
                    if a % 8:
                        fb[a // 8] &= (1 << (a % 8)) - 1
                    if b % 8:
                        fb[hi] &= 0xFF ^ ((1 << (b % 8)) - 1)
                else:  # inside one byte
                    fb[a // 8] &= 0xFF ^ (((1 << k) - 1) << (a % 8))
        self._cleared(n)
        self.in_use += found
        self.high += found
        took = found > 0
        self.low[took] = (self.high[took] - 1) >> 6  # no holes below high: every slot below the last taken is taken
        return s, found.astype(np.int64, copy=False)

    def give_back(self, be, idx: np.ndarray) -> None:
        """Free taken slots (owners cleared)."""
        if idx.size == 0:
            return
        self.own[idx] = -1
        self._write_free(be, idx, True)
        cap = max(self.cap, 1)
        rank = idx // cap
        counts = np.bincount(rank, minlength=self.R)
        self.in_use -= counts
        # A hole below the lowest free word known: each rank's lowest slot freed (slots grouped by rank, as a
        # request's copies in the TP local buffers are: by one reduceat; else by ufunc.at).
        if rank.size == 1 or not (rank[1:] < rank[:-1]).any():
            r = np.flatnonzero(counts)
            first = np.minimum.reduceat(idx, (np.cumsum(counts) - counts).take(r))
            self.low[r] = np.minimum(self.low.take(r), (first - r * cap) >> 6)
        else:
            np.minimum.at(self.low, rank, (idx - rank * cap) >> 6)

    def place_one(self, i: int) -> int:
        """`places` of one storage position, as an int."""
        cap, stride = self.rows.cap, self.rows.stride
        if not self.rows.identity:
            i += (i // cap) * (stride - cap)
        return i + self.base

    def touch_one(self, i: int, stamp: int) -> None:
        """`touch` of one slot (storage position i, an int)."""
        if stamp > self._stamp_max or self.log is not None:
            return self.touch(np.array([i], dtype=np.int64), stamp)
        self.stamp[i] = stamp

    def fit_stamp(self, clock: int) -> None:
        """Widen the stamps (a copy, once per width) if `clock` does not fit their dtype: callers start narrow
        (bytes per slot) and call this before a clock value reaches the stamps or is compared with them."""
        if clock > self._stamp_max:
            self.stamp = self.stamp.astype(np.int32 if clock < 2**31 else np.int64)
            self._stamp_max = int(np.iinfo(self.stamp.dtype).max)

    def touch(self, idx: np.ndarray, stamp: int) -> None:
        """Set the recency stamp of slots (and log it when the pool keeps an exact LRU order)."""
        if stamp > self._stamp_max:
            self.fit_stamp(stamp)
        if idx.size:  # (a warm batch's hits mostly carry the stamp already: no scatter of nothing)
            self.stamp[idx] = stamp
        if self.log is not None:
            self.log.touch(idx, stamp)

    def lru_select(self, be, counts: np.ndarray, protected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per rank, the counts[r] occupied slots (not in `protected`) with the smallest (stamp, slot), as idx:
        from the stamp log when kept (work follows the slots taken), else the backend's scan of the pool."""
        if self.log is not None and self.log.use_log(counts):
            return self.log.select(counts, protected)
        eligible = self.own >= 0
        eligible[protected] = False
        s, f = be.lru_select(be.asarray(self.stamp), be.asarray(eligible), max(self.cap, 64), be.asarray(counts))
        return be.to_numpy(s), be.to_numpy(f)

    def select_free_then_lru(self, be, counts: np.ndarray, protected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Replacement slots (idx) grouped by rank: free slots (lowest first), then exact LRU among occupied slots
        not protected. Free slots are claimed now; returns (idx, found per rank)."""
        s0, f0 = self.take_free(be, counts)
        rest = counts - f0
        if not rest.any():
            return s0, f0
        s1, f1 = self.lru_select(be, rest, protected)
        return merge_by_rank([s0, s1], [f0, f1]), f0 + f1

    # -- views -------------------------------------------------------------------------------------------------------
    def dense(self, arr: np.ndarray, fill, per_id: float = 1) -> np.ndarray:
        """`arr` (laid out like storage) as the full (R * seg) layout by place - base (for snapshots and checks)."""
        n, c = int(self.seg * per_id), int(self.cap * per_id)
        trail = arr.shape[1:]
        out = np.full((self.R, n, *trail), fill, dtype=arr.dtype)
        if c:
            out[:, :c] = arr.reshape(self.R, c, *trail)
        return out.reshape(self.R * n, *trail)

    @property
    def owner(self) -> np.ndarray:
        """Dense copy by place - base, sized by the budget (for UlaCache.device_state)."""
        return self.dense(self.own, -1).astype(np.int64, copy=False)

    @property
    def stamps(self) -> np.ndarray:
        """Dense int64 copy by place - base, sized by the budget (for UlaCache.device_state)."""
        return self.dense(self.stamp, 0).astype(np.int64, copy=False)

    @property
    def free_bm(self) -> np.ndarray:
        """Dense copy by place - base, sized by the budget (for UlaCache.device_state)."""
        return self.dense(self.free, 0, 1 / 8)

    def valid(self) -> np.ndarray:
        """Storage mask of real (non-padding) slots."""
        return np.tile(np.arange(self.cap) < self.slots, self.R)

    def check(self, require, what: str) -> None:
        free_bits = np.unpackbits(self.free, bitorder="little").view(bool)
        valid = self.valid()
        require(not (self.own[~valid] >= 0).any(), f"{what} padding slot used")
        require((free_bits == (valid & (self.own < 0))).all(), f"{what} free bitmap disagrees with owners")
        require(not ((self.free.view("<u8") != 0) & ~self.free_nz).any(), f"{what} free summary misses a word")
        used = np.bincount(self.rank_of_idx(np.flatnonzero(self.own >= 0)), minlength=self.R)
        require((used == self.in_use).all(), f"{what} in-use count drifted")
        words = self.free.view("<u8").reshape(self.R, -1)
        below = np.arange(words.shape[1]) < self.low[:, None]
        require(not (words.astype(bool) & below).any(), f"{what} free slot below its rank's lowest free word")


class CpuPools:
    """All ranks' CPU pools; rank r's slot c is place base + r * slots + c; free lists per rank (no per-slot
    metadata: memory follows the slots freed)."""

    def __init__(self, num_ranks: int, slots: int, base: int):
        self.num_ranks, self.slots, self.base = num_ranks, slots, base
        self.num_places = num_ranks * slots
        self.free = [IdStack(base + r * slots, base + (r + 1) * slots) for r in range(num_ranks)]

    def num_free(self) -> np.ndarray:
        return np.array([len(f) for f in self.free], dtype=np.int64)

    def rank_of(self, places: np.ndarray) -> np.ndarray:
        return (places - self.base) // max(self.slots, 1)

    def release(self, places: np.ndarray) -> None:
        if self.num_ranks == 1:
            self.free[0].push(places)
            return
        if not places.size:
            return
        ranks = self.rank_of(places)
        for r in np.flatnonzero(np.bincount(ranks, minlength=self.num_ranks)).tolist():  # loop over ranks
            self.free[r].push(places[ranks == r])


__all__ = ["CpuPools", "Pool", "merge_by_rank", "pack_summary"]
