"""PayloadIO: a cache's payload bytes (payload mode: `CacheConfig.payload_bytes > 0`) and their movement.

Bytes live by unified place in a `PayloadStore`. A plan's row moves are applied to layer 0 at commit and to the
indexer group's other layers at replay; a write refreshes every cached copy of the addresses written (TP local
buffers, hisparse's GPU copies), so a copy never differs from its authoritative entry. Without payloads every
mover is a no-op and every reader or writer raises ValueError.
"""
from __future__ import annotations

import numpy as np

from .errors import require
from .inputs import check_rank, int_scalar
from .payload import PayloadStore
from .plan import Plan


class PayloadIO:
    """The byte side of one cache: `store` (None without payloads) over `num_places` unified places."""

    def __init__(self, config, be, policy, buffers, index, num_places: int):
        self.config, self.be, self.policy, self.buffers, self.index = config, be, policy, buffers, index
        self.layers, self.row_bytes = config.payload_layers, config.payload_bytes
        # bytes only for the pages of places written (payload.py), not the budget
        self.store = PayloadStore(num_places, self.layers, self.row_bytes) if self.row_bytes else None

    # -- movement (commit, replay, allocation) -------------------------------------------------------------------------
    def move(self, plan: Plan, layer: int) -> None:
        """Apply the plan's row moves to `layer`'s bytes (all reads first)."""
        if self.store is None or plan.move_src.size == 0:
            return
        be, store = self.be, self.store
        src, dst = store.rows(plan.move_src), store.rows_to_write(plan.move_dst)  # (may grow the storage)
        data = store.data[:, layer, :]
        rows = be.to_numpy(be.gather_rows(be.asarray(data), be.asarray(src)))  # all reads first
        store.data[:, layer, :] = be.to_numpy(be.scatter_rows(be.asarray(data), be.asarray(dst), be.asarray(rows)))

    def copy_alloc_moves(self) -> None:
        """The bytes the last allocation moved inside the GPU tier (hisparse's newest-token slot)."""
        moves = self.policy.alloc_moves
        if moves is not None and self.store is not None and moves[0].size:
            self.store.copy_all_layers(moves[0], moves[1])

    def check_replayed(self, last: Plan | None) -> None:
        """Before an access: ValueError unless the last plan was replayed for every payload layer."""
        if self.store is not None and last is not None and len(last.layers_done) < self.layers:
            raise ValueError(f"replay the last plan for all {self.layers} payload layers before the next access")

    def replay(self, plan: Plan, layer) -> None:
        """Move `layer`'s bytes for the committed plan (default: the next layer not yet moved)."""
        if self.store is None:
            return
        todo = [i for i in range(self.layers) if i not in plan.layers_done]
        if layer is None:
            if not todo:
                raise ValueError(f"every one of the {self.layers} payload layers was moved already")
            layer = todo[0]
        layer = int_scalar(layer, "layer")
        if layer not in todo:
            raise ValueError(f"layer {layer} is not a payload layer left to replay (left: {todo})")
        self.move(plan, layer)
        plan.layers_done.add(layer)

    # -- reads and writes by address -----------------------------------------------------------------------------------
    def _places(self, addrs, what: str) -> tuple[np.ndarray, np.ndarray]:
        if self.store is None:
            raise ValueError("payloads need payload_bytes > 0 in the CacheConfig")
        a = self.index.addresses(addrs, what)
        return a, self.index.places(a, what)

    def _layer(self, layer) -> int:
        layer = int_scalar(layer, "layer")
        if not 0 <= layer < self.layers:
            raise ValueError(f"layer {layer} out of range: payload_layers is {self.layers}")
        return layer

    def read(self, addrs, layer: int = 0) -> np.ndarray:
        """uint8 (len(addrs), payload_bytes): the bytes at each address's current (valid) place."""
        _, places = self._places(addrs, "addrs")
        return self.store.read(places, self._layer(layer)).copy()

    def write(self, addrs, payload, layer: int = 0) -> None:
        """Store bytes for addresses (and refresh every cached copy of them)."""
        a, places = self._places(addrs, "addrs")
        layer = self._layer(layer)
        p = np.asarray(payload)
        if p.dtype != np.uint8 or p.shape != (a.size, self.row_bytes):
            raise ValueError(f"payload must be uint8 of shape ({a.size}, {self.row_bytes}), got {p.dtype} {p.shape}")
        if np.unique(a).size != a.size:
            raise ValueError("addrs holds an address twice")
        self.store.write(places, layer, p)
        for idx, copies in self.copies(a):
            self.store.write(copies, layer, p[idx])

    def read_local(self, addrs, rank: int, layer: int = 0) -> np.ndarray:
        """TP: the bytes rank `rank` computes with: its own pool for entries homed there, else its local-buffer copy.
        ValueError if a remote entry has no copy in the rank's buffer."""
        if self.buffers is None:
            raise ValueError("read_local needs mode 'tp' with policy pb-lru or lru")
        a, places = self._places(addrs, "addrs")
        r = check_rank(rank, self.config.num_ranks)
        remote = self.index.space.home(a) != r
        bs = self.buffers.slots_of(a, r)
        if (remote & (bs < 0)).any():
            raise ValueError(f"address {int(a[remote & (bs < 0)][0])} has no copy in rank {r}'s local buffer")
        src = np.where(remote, self.buffers.base + r * self.buffers.seg + bs, places)
        return self.store.read(src, self._layer(layer)).copy()

    # -- cached copies -------------------------------------------------------------------------------------------------
    def copies(self, a: np.ndarray):
        """(index into a, places) of GPU copies that duplicate the authoritative entries."""
        if self.buffers is not None:
            yield self.buffers.copies(a)
        resident = getattr(self.policy, "resident_places", None)
        if resident is not None:
            g = resident(a)
            held = np.flatnonzero(g >= 0)
            yield held, g[held]

    def check_copies(self, last: Plan | None) -> None:
        """AssertionError unless every cached copy holds its entry's bytes (every layer the last plan moved)."""
        if self.store is None:
            return
        space = self.index.space
        a = space.allocated()
        for idx, copies in self.copies(a):
            for layer in sorted(last.layers_done if last else {0}):
                auth = space.places(a[idx]).astype(np.int64)
                same = (self.store.read(copies, layer) == self.store.read(auth, layer)).all()
                require(same, "a cached copy differs from its entry")


__all__ = ["PayloadIO"]
