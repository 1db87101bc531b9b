"""The simulated groups' address tables, one shared while the groups' caches hand out the same addresses.

Every group's cache is built from one configuration and given the same allocations and frees in the same order, so
its addresses are the same whenever they depend on nothing else (DP: the request's rank; hisparse). A TP cache
places a request's tokens by its ranks' free GPU slots, which after frees depend on what the group's accesses moved,
so its addresses may differ. One table serves every group until a group's cache hands out other addresses: that
group then gets its own copy (copy on write), so a pilot of 78 groups holds one table, not 78, and no lookup changes.
"""
from __future__ import annotations

import copy

import numpy as np


class GroupTables:
    """`tables[g]`: group g's AddressTable (sim/policy.py). Writes go through `add` / `append` / `remove`, called for
    every group in turn with what that group's cache handed out; `next_round()` before each allocation round."""

    def __init__(self, groups, make_table):
        self.shared = make_table()
        self.own: dict[int, object] = {}  # groups whose addresses differ from the shared table's
        self.groups = set(groups)
        self._start: dict[int, int] = {}  # request -> its length in the shared table before this round (-1: added)
        self._seen: dict[int, set] = {}  # group -> requests it has written this round (all matched the shared)

    def __getitem__(self, g: int):
        if g not in self.groups:
            raise KeyError(g)
        return self.own.get(g, self.shared)

    def drop(self, g: int) -> None:
        self.groups.discard(g)
        self.own.pop(g, None)

    def next_round(self) -> None:
        self._start.clear()
        self._seen.clear()

    def add(self, g: int, rid: int, addrs: np.ndarray) -> None:
        if g in self.own:
            self.own[g].add(rid, addrs)
        elif rid not in self.shared.row_of:
            self.shared.add(rid, addrs)
            self._start[rid] = -1
            self._seen.setdefault(g, set()).add(rid)
        elif self._same(rid, 0, addrs):
            self._seen.setdefault(g, set()).add(rid)
        else:
            self._fork(g).add(rid, addrs)

    def append(self, g: int, rid: int, addrs: np.ndarray) -> None:
        if g in self.own:
            self.own[g].append(rid, addrs)
        elif rid not in self._start:
            self._start[rid] = self.shared.length[rid]
            self.shared.append(rid, addrs)
            self._seen.setdefault(g, set()).add(rid)
        elif self._same(rid, self._start[rid], addrs):
            self._seen.setdefault(g, set()).add(rid)
        else:
            self._fork(g).append(rid, addrs)

    def remove(self, g: int, rid: int) -> None:
        if g in self.own:
            self.own[g].remove(rid)
        elif rid in self.shared.row_of:
            self.shared.remove(rid)

    def _same(self, rid: int, start: int, addrs: np.ndarray) -> bool:
        t = self.shared
        if addrs.size == 1:  # a decode token (batch size 1): one element, no array comparison
            return int(t.table[t.row_of[rid], max(start, 0)]) == int(addrs[0])
        return bool(np.array_equal(t.table[t.row_of[rid], max(start, 0):max(start, 0) + addrs.size], addrs))

    def _fork(self, g: int):
        """Group g's own copy of the shared table, without what this round wrote there that g has not written."""
        t = copy.deepcopy(self.shared)
        seen = self._seen.pop(g, set())
        for rid, start in self._start.items():
            if rid in seen:
                continue
            if start < 0:
                t.remove(rid)
            else:
                t.table[t.row_of[rid], start:t.length[rid]] = -1
                t.length[rid] = start
        self.own[g] = t
        return t
