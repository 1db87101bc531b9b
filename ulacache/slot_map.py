"""Address -> slot maps for the TP local buffers: a dense table when it is small, else an open-addressing hash table.

A dense table over the addresses in use (it follows the address space's storage rows, grown as addresses are
handed out; address-major, so a batch look-up for every rank reads one cache line per address) is the fastest lookup, but costs 2 bytes (uint16, buffers below 65,535 slots; else 4) x addresses x
ranks (8 ranks over 56M addresses: 0.9 GB). It holds slot + 1 (0: no copy), so a fresh table is zero pages the
kernel maps lazily. The hash table costs ~24 bytes per copy held instead (it starts small and doubles). Both hold at most
`capacity` entries and answer vectorized batches (no Python loop over keys: the hash probes all pending keys of a
batch together, one linear-probing step per iteration).
"""
from __future__ import annotations

import numpy as np

from . import threads

# Per cache, all ranks together; above it the local buffers use hash maps. The binding bound is usually
# DENSE_OVER_HASH (below); this one caps a table whose buffers are huge. At 256 MiB it sent paper-scale TP full
# fidelity to hash maps at ~8.8M addresses (int32 cells: 32 B per address at 8 ranks) although hash maps sized by
# that buffer (552,650 slots a rank) take ~400 MB; dense, one group's steps 8-300 took 0.25 s against 0.87 s, its
# whole run (2,146 steps, up to 16.4M addresses) 201 s, at the same peak RSS (bench/results/dense_slot_maps_ab.json).
DENSE_LIMIT_BYTES = 1 << 30
_EMPTY, _TOMB = -1, -2
_WINDOW = 8  # probe steps per round of a vectorized lookup
_SCALAR_TAIL = 32  # probe rounds with at most this many keys pending run in plain Python (no per-round array calls)
_FEW_MISSES = 64  # `remote` splits this many misses by rank in one divmod (more: by slices, one pass)
_MUL = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing


class DenseSlotMaps:
    """Every rank's address -> slot table in one array, address-major: row a holds the R ranks' slot + 1 of address a
    (keys are allocated addresses of `space`, an AddressSpace; the rows follow its storage), so one batch look-up
    for all ranks reads one cache line per address, not one per rank and address."""

    def __init__(self, num_ranks: int, space, capacity: int | None = None, dense_limit: int | None = None,
                 over_hash: float | None = None):
        self.R, self.space = num_ranks, space
        self._dt = np.dtype([("s", _dense_dtype(capacity), (num_ranks,))])
        self._rows = np.zeros(space.table.size, dtype=self._dt)  # slot + 1, 0 = none
        # With the owner's limits (make_slot_maps), a growth past `_dense_ok` converts straight to hash maps from
        # the old layout (`fits` hands them over) instead of re-laying a table that is dropped right after.
        self._limits = (capacity, dense_limit, over_hash)
        self.outgrown: HashSlotMaps | None = None
        space.listeners.append(self._grow)

    @property
    def table(self) -> np.ndarray:
        """(addresses in storage, R) view: slot + 1, 0 = no copy."""
        return self._rows["s"]

    @property
    def num_addresses(self) -> int:
        return self._rows.size

    def _grow(self, old: tuple) -> None:
        capacity, limit, over_hash = self._limits
        if capacity is not None and not _dense_ok(self.R, self.space.table.size, capacity, limit, over_hash):
            self.outgrown = self._hash_maps(capacity, old)
            return
        self._rows = self.space.rows.relayout(self._rows, old, 0)

    def _hash_maps(self, capacity: int, layout: tuple | None = None) -> HashSlotMaps:
        """The same maps as hash maps; `layout`: the address layout the table has (default: the space's)."""
        out = HashSlotMaps(self.R, capacity)
        for r in range(self.R):  # loop over ranks
            keys, vals = self.items(r, layout)
            out.maps[r].set(keys, vals)
        return out

    def to_hash(self, capacity: int) -> HashSlotMaps:
        """The same maps as hash maps (this table stops following the address space)."""
        self.space.listeners.remove(self._grow)
        return self.outgrown if self.outgrown is not None else self._hash_maps(capacity)

    def get_all(self, addrs: np.ndarray) -> np.ndarray:
        """(R, len(addrs)) slots, -1 where a rank holds no copy."""
        out = self.table.take(self.space.index(addrs), axis=0).T.astype(np.int64)
        out -= 1
        return out

    def get(self, r: int, addrs: np.ndarray) -> np.ndarray:
        out = self.table[:, r].take(self.space.index(addrs)).astype(np.int64)
        out -= 1
        return out

    @property
    def _flat(self) -> np.ndarray:
        """The table as one flat array: (address storage position) * R + rank (a 1-D index: ~2x faster scatters
        than a 2-D one)."""
        return self._rows.view(self._dt["s"].base)

    def rank_major(self, addrs: np.ndarray, ix: np.ndarray) -> np.ndarray:
        """(R, len(addrs)) slot + 1 of every rank, 0 where it holds no copy (`ix`: the storage positions)."""
        return np.ascontiguousarray(self.cells(self.rows(ix)).T)

    def rows(self, ix: np.ndarray) -> np.ndarray:
        """The rows at storage positions `ix`, one item per address (its R cells as raw bytes: `cells` reads them,
        `write` takes them back)."""
        return threads.take(self._row_items, ix)

    def cells(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), R) slot + 1 of `rows` (address-major, a view)."""
        return rows.view(self._dt["s"].base).reshape(rows.size, self.R)

    by_index = True  # looks up by storage position (`rank_major`, `rows` need no addresses)

    @property
    def _row_items(self) -> np.ndarray:
        """The table as one item per address (its R slots as raw bytes): whole rows gathered and written at once."""
        return self._rows.view(np.dtype((np.void, self._dt.itemsize)))

    def remote(self, addrs: np.ndarray, ix: np.ndarray, bounds: list[int]):
        """Every rank's look-up of the ascending batch `addrs` (storage positions `ix`) but its own homes
        (addrs[bounds[r]:bounds[r + 1]]): (hits per rank, miss indices into addrs grouped by rank, ascending address
        within a rank, misses per rank, the batch's rows as read). All ranks at once: one gather of
        whole rows, made rank-major once."""
        R, U = self.R, ix.size
        rows = threads.take(self._row_items, ix)
        absent = np.ascontiguousarray((rows.view(self._dt["s"].base).reshape(U, R) == 0).T)  # (R, U) as bytes
        return (*misses_by_rank(absent, bounds), rows)

    def drop_rows(self, ix: np.ndarray, rows: np.ndarray, lim: np.ndarray):
        """The write (for `write`) that removes the copies a selection took (lru_log.StampLog.select) from `rows`
        (at storage positions `ix`, as read; the caller's copy, changed in place): rank r's cells above lim[r] kept,
        the others 0 (one flat pass against lim tiled (`_tile`): no transposes); and the kept rows (`rows`)."""
        flat = self.cells(rows).reshape(-1)
        np.multiply(flat, flat > _tile(lim, rows.size), out=flat)  # (in place: `rows` is the caller's copy)
        return (ix, rows), rows

    def write(self, change) -> None:
        """Apply a `drop_rows` made from rows unchanged since they were read: each row written back whole (one
        write per address instead of one per rank and key)."""
        ix, rows = change
        # One logged batch's rows: distinct positions (np.put measured faster than item assignment here).
        threads.scatter(self._row_items, ix, rows, put=True)

    def set(self, ranks: np.ndarray, addrs: np.ndarray, slots: np.ndarray, ix: np.ndarray | None = None) -> None:
        """Insert absent keys (rank, address) -> slot (`ix`: the addresses' storage positions, if known)."""
        at = np.multiply(self.space.index(addrs) if ix is None else ix, self.R, dtype=np.int64)
        at += ranks
        flat = self._flat
        vals = slots.astype(flat.dtype)  # (cast first: a casting scatter is ~1.5x slower)
        vals += 1
        flat[at] = vals

    def insert_grouped(self, ix: np.ndarray, counts: np.ndarray, addrs, places: np.ndarray, seg: int) -> None:
        """Insert absent keys grouped by rank: counts[r] of them for rank r, at storage positions `ix` (`addrs`: the
        addresses, unused here), slot places[i] - r * seg (no per-key rank array; a large insert on the threads of
        threads.py, each its own range of keys: distinct cells)."""
        flat, R = self._flat, self.R
        ends = np.cumsum(counts).tolist()

        def part(lo: int, hi: int) -> None:
            start = 0
            for r, end in enumerate(ends):  # loop over ranks: their keys within [lo, hi)
                a, b = max(start, lo), min(end, hi)
                start = end
                if a < b:
                    at = np.multiply(ix[a:b], R, dtype=np.int64)
                    at += r
                    vals = np.subtract(places[a:b], r * seg - 1).astype(flat.dtype)  # slot + 1
                    flat[at] = vals
        threads.over(ix.size, part)

    def delete(self, ranks: np.ndarray, addrs: np.ndarray) -> None:
        at = np.multiply(self.space.index(addrs), self.R, dtype=np.int64)
        at += ranks
        self._flat[at] = 0

    def items(self, r: int, layout: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rank r's (addresses ascending, slots); `layout`: the address layout the table has, if not the space's
        current one (a table not yet re-laid after a growth)."""
        col = self.table[:, r]
        at = np.flatnonzero(col)
        return self.space.rows.ids(at, layout), col[at].astype(np.int64) - 1


def _tile(a: np.ndarray, n: int) -> np.ndarray:
    """np.tile(a, n) of a short `a` by doubling copies (np.tile copies `a` n times: one memcpy call each)."""
    out = np.empty(a.size * n, dtype=a.dtype)
    k = min(a.size, out.size)
    out[:k] = a[:k]
    while k < out.size:
        m = min(k, out.size - k)
        out[k:k + m] = out[:m]
        k += m
    return out


def misses_by_rank(absent: np.ndarray, bounds: list[int]):
    """(hits per rank, miss indices grouped by rank, ascending within a rank, misses per rank) of a batch's (R, U)
    no-copy mask; rank r's own homes (columns bounds[r]:bounds[r + 1], never held there) are neither (cleared here)."""
    R, U = absent.shape
    for r in range(R):  # loop over ranks: the own homes
        absent[r, bounds[r]:bounds[r + 1]] = False
    miss = np.flatnonzero(absent)  # r * U + column, ascending
    if miss.size <= _FEW_MISSES:  # (a decode step at batch size 1: a few; three array calls, no rank loop)
        rank, miss = np.divmod(miss, U)
        m_counts = np.bincount(rank, minlength=R)
    else:
        cut = miss.searchsorted(np.arange(R + 1, dtype=np.int64) * U).tolist()
        for r in range(1, R):  # loop over ranks: columns
            miss[cut[r]:cut[r + 1]] -= r * U
        m_counts = np.diff(cut)
    return U - np.diff(bounds) - m_counts, miss, m_counts


class HashSlotMap:
    """Linear probing over a power-of-two table at most half full (deleted keys leave tombstones; the table is
    rebuilt when live keys plus tombstones pass 3/4). Keys are distinct non-negative addresses."""

    def __init__(self, capacity: int = 0):
        self.bits = max(6, int(np.ceil(np.log2(max(2 * capacity, 2)))))  # sized by the buffer: no rebuilds
        self._alloc()

    def _alloc(self) -> None:
        size = 1 << self.bits
        self.keys = np.full(size, _EMPTY, dtype=np.int64)
        self.vals = np.full(size, -1, dtype=np.int64)
        self._claim = np.zeros(size, dtype=np.int64)  # scratch: which pending key claims a free position
        self.live = self.tombs = 0

    def _home(self, addrs: np.ndarray) -> np.ndarray:
        h = addrs.astype(np.uint64) * _MUL
        return (h >> np.uint64(64 - self.bits)).astype(np.int64)

    def _find(self, addrs: np.ndarray) -> np.ndarray:
        """Table position of each key, -1 where absent."""
        mask = (1 << self.bits) - 1
        pos = self._home(addrs)
        out = np.full(addrs.size, -1, dtype=np.int64)
        # First probe of every key (most end there), then _WINDOW probe steps per round for the keys left.
        k = self.keys.take(pos)
        found = k == addrs
        out[found] = pos[found]
        pending = np.flatnonzero(~found & (k != _EMPTY))
        pos[pending] = (pos.take(pending) + 1) & mask
        win = np.arange(_WINDOW)
        while pending.size > _SCALAR_TAIL:
            # _WINDOW probe steps per round: the chain ends at the key or at the first empty position, whichever
            # comes first (keys are distinct; the same answer as one step per round, in fewer array calls).
            p = (pos.take(pending)[:, None] + win) & mask
            k = self.keys.take(p)
            a = addrs.take(pending)
            found = k == a[:, None]
            stop = found | (k == _EMPTY)
            first = stop.argmax(axis=1)
            ended = stop[np.arange(first.size), first]
            hit = np.flatnonzero(found[np.arange(first.size), first] & ended)
            out[pending.take(hit)] = p[hit, first.take(hit)]
            go = np.flatnonzero(~ended)
            pending = pending.take(go)
            pos[pending] = (p[go, -1] + 1) & mask
        if pending.size:  # the few keys on long probe chains: probe one by one (a round costs ~10 array calls)
            keys = self.keys
            for i, p, a in zip(pending.tolist(), pos.take(pending).tolist(), addrs.take(pending).tolist()):
                k = int(keys[p])
                while k != a and k != _EMPTY:
                    p = (p + 1) & mask
                    k = int(keys[p])
                if k == a:
                    out[i] = p
        return out

    def get(self, addrs: np.ndarray) -> np.ndarray:
        pos = self._find(addrs)
        return np.where(pos >= 0, self.vals.take(np.maximum(pos, 0)), -1)

    def set(self, addrs: np.ndarray, slots: np.ndarray) -> None:
        """Insert keys that are absent."""
        if (self.live + self.tombs + addrs.size) * 4 > 3 << self.bits:
            self._rebuild(addrs.size)
        mask = (1 << self.bits) - 1
        pos = self._home(addrs)
        pending = np.arange(addrs.size)
        while pending.size > _SCALAR_TAIL:
            p = pos.take(pending)
            k = self.keys.take(p)
            free = np.flatnonzero(k < 0)
            # Among pending keys probing the same free position, one wins this round: scatter the candidates'
            # indices in reverse, so the lowest index is written last and wins (deterministic, no sort).
            pf = p.take(free)
            self._claim[pf[::-1]] = free[::-1]
            win = free.take(np.flatnonzero(self._claim.take(pf) == free))
            wp, pw = p.take(win), pending.take(win)
            self.tombs -= int((k.take(win) == _TOMB).sum())  # k: the keys there, read this round
            self.keys[wp] = addrs.take(pw)
            self.vals[wp] = slots.take(pw)
            self.live += win.size
            lose = np.ones(pending.size, dtype=bool)
            lose[win] = False
            go = np.flatnonzero(lose)
            pending = pending.take(go)
            pos[pending] = (p.take(go) + 1) & mask
        if pending.size:  # the few keys left: the same rounds, one key at a time (lowest index first wins)
            self._set_scalar(pending.tolist(), pos.take(pending).tolist(), addrs, slots, mask)

    def _set_scalar(self, pending: list, pos: list, addrs: np.ndarray, slots: np.ndarray, mask: int) -> None:
        """`set`'s probing rounds for a few pending keys in plain Python: each round, every pending key looks at
        its position; of the keys finding the same free position the lowest index claims it, the rest move on."""
        keys, vals = self.keys, self.vals
        while pending:
            claimed: dict[int, int] = {}
            nxt_i, nxt_p = [], []
            for i, p in zip(pending, pos):
                if keys[p] < 0 and p not in claimed:
                    claimed[p] = i
                else:
                    nxt_i.append(i)
                    nxt_p.append((p + 1) & mask)
            for p, i in claimed.items():
                if keys[p] == _TOMB:
                    self.tombs -= 1
                keys[p] = addrs[i]
                vals[p] = slots[i]
            self.live += len(claimed)
            pending, pos = nxt_i, nxt_p

    def delete(self, addrs: np.ndarray) -> None:
        pos = self._find(addrs)
        pos = pos[pos >= 0]
        self.keys[pos] = _TOMB
        self.vals[pos] = -1
        self.live -= pos.size
        self.tombs += pos.size

    def _rebuild(self, incoming: int) -> None:
        keys, vals = self.items()
        while (keys.size + incoming) * 2 > 1 << self.bits:
            self.bits += 1
        self._alloc()
        if keys.size:
            self.set(keys, vals)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        at = np.flatnonzero(self.keys >= 0)
        order = np.argsort(self.keys[at])
        return self.keys[at][order], self.vals[at][order]


class HashSlotMaps:
    """Every rank's map as a hash map (same interface as DenseSlotMaps)."""

    def __init__(self, num_ranks: int, capacity: int):
        self.R = num_ranks
        self.maps = [HashSlotMap(capacity) for _ in range(num_ranks)]

    def get_all(self, addrs: np.ndarray) -> np.ndarray:
        return np.stack([m.get(addrs) for m in self.maps]) if self.R else np.zeros((0, addrs.size), np.int64)

    def get(self, r: int, addrs: np.ndarray) -> np.ndarray:
        return self.maps[r].get(addrs)

    def _by_rank(self, ranks: np.ndarray):
        for r in np.unique(ranks).tolist():  # loop over ranks
            yield r, np.flatnonzero(ranks == r)

    def rank_major(self, addrs: np.ndarray, ix: np.ndarray) -> np.ndarray:
        """DenseSlotMaps.rank_major."""
        out = self.get_all(addrs)
        out += 1
        return out

    by_index = False  # keyed by address: `rank_major` and `drop` need the addresses

    def remote(self, addrs: np.ndarray, ix: np.ndarray, bounds: list[int]):
        """DenseSlotMaps.remote (no rows): each rank looks up the two slices of
        the batch homed elsewhere in one probe run."""
        hits, miss, m_counts = np.zeros(self.R, np.int64), [], np.zeros(self.R, np.int64)
        for r in range(self.R):  # loop over ranks
            rem = np.concatenate([np.arange(bounds[r]), np.arange(bounds[r + 1], addrs.size)])
            held = self.maps[r].get(addrs.take(rem)) >= 0
            m = rem[~held]
            miss.append(m)
            hits[r], m_counts[r] = rem.size - m.size, m.size
        return hits, np.concatenate(miss), m_counts, None

    def drop(self, ix: np.ndarray, addrs: np.ndarray, held: np.ndarray, kept: np.ndarray):
        """The write (for `write`) that removes the copies a selection took: rank-major `held` (slot + 1 of
        `addrs`) become `kept`; the keys to delete per rank."""
        taken = held != kept
        return [(r, addrs[taken[r]]) for r in np.flatnonzero(taken.any(axis=1)).tolist()]  # loop over ranks

    def write(self, change) -> None:
        """DenseSlotMaps.write of a `drop`, key by key."""
        for r, keys in change:  # loop over ranks
            self.maps[r].delete(keys)

    def set(self, ranks: np.ndarray, addrs: np.ndarray, slots: np.ndarray, ix: np.ndarray | None = None) -> None:
        for r, i in self._by_rank(ranks):
            self.maps[r].set(addrs.take(i), slots.take(i))

    def insert_grouped(self, ix: np.ndarray, counts: np.ndarray, addrs: np.ndarray, places: np.ndarray,
                       seg: int) -> None:
        """DenseSlotMaps.insert_grouped."""
        lo = 0
        for r, c in enumerate(counts.tolist()):  # loop over ranks
            if c:
                self.maps[r].set(addrs[lo:lo + c], places[lo:lo + c] - r * seg)
                lo += c

    def delete(self, ranks: np.ndarray, addrs: np.ndarray) -> None:
        for r, i in self._by_rank(ranks):
            self.maps[r].delete(addrs.take(i))

    def items(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        return self.maps[r].items()


DENSE_FREE_BYTES = 1 << 20  # a dense table this small is always fine
HASH_BYTES_PER_KEY = 48  # keys + values (int64) + claim scratch at the hash table's <= 1/2 load
DENSE_OVER_HASH = 4  # dense while within this many times full hash maps' bytes: a hash lookup or insert costs ~10x


def _dense_dtype(capacity: int | None):
    """uint16 holds slot + 1 for buffers below 65,535 slots."""
    return np.uint16 if capacity is not None and capacity < 65535 else np.int32


def _dense_ok(num_ranks: int, addresses: int, capacity: int, dense_limit: int, over_hash: float | None) -> bool:
    """Dense while its bytes stay under dense_limit and within `over_hash` x what full hash maps would take (or
    under DENSE_FREE_BYTES; `over_hash` None: dense_limit alone, a caller's own budget, see `dense_rule`): speed
    where it costs little, memory by the copies held where addresses far outnumber them (the pinned-keys TP replay:
    8 ranks x 4.2M addresses x 2 B = 67 MB dense vs 19 MB hashed, measured ~800 of 1160 profiled seconds in the hash
    maps)."""
    dense = num_ranks * max(addresses, 1) * np.dtype(_dense_dtype(capacity)).itemsize
    if over_hash is None:
        return dense <= dense_limit
    return dense <= min(dense_limit, max(over_hash * HASH_BYTES_PER_KEY * num_ranks * capacity, DENSE_FREE_BYTES))


def dense_rule(dense_map_bytes: int = 0) -> tuple[int, float | None]:
    """(dense_limit, over_hash) of `_dense_ok`: the library's rule (0: DENSE_LIMIT_BYTES, DENSE_OVER_HASH, read now so
    that tests may patch them), or a caller's own budget in bytes per cache (CacheConfig.dense_map_bytes): a process
    holding one indexer group's caches, not 21, can keep them dense far past the rule (paper-h200-tp-specoff group 0:
    323 s dense against ~543 s for its first 600 of 6,000 steps hashed; docs/gpu.md)."""
    return (DENSE_LIMIT_BYTES, DENSE_OVER_HASH) if dense_map_bytes <= 0 else (dense_map_bytes, None)


def make_slot_maps(num_ranks: int, space, capacity: int, dense_limit: int,
                   over_hash: float | None) -> DenseSlotMaps | HashSlotMaps:
    """All ranks' maps: dense or hash (`_dense_ok` on the addresses in storage, under `dense_rule`'s bounds); the
    owner switches a dense map to hash maps when address storage outgrows that (see `fits`)."""
    if _dense_ok(num_ranks, space.table.size, capacity, dense_limit, over_hash):
        return DenseSlotMaps(num_ranks, space, capacity, dense_limit, over_hash)
    return HashSlotMaps(num_ranks, capacity)


def fits(maps, capacity: int, dense_limit: int, over_hash: float | None):
    """`maps`, or the same maps as hash maps once a dense table has outgrown `_dense_ok`."""
    if isinstance(maps, DenseSlotMaps) and (
            maps.outgrown is not None or not _dense_ok(maps.R, maps.num_addresses, capacity, dense_limit, over_hash)):
        return maps.to_hash(capacity)
    return maps


__all__ = ["DENSE_LIMIT_BYTES", "DenseSlotMaps", "dense_rule", "HashSlotMap", "HashSlotMaps", "fits", "make_slot_maps", "misses_by_rank"]
