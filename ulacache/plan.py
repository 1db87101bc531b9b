"""Plan: the outcome of one sparse access batch, applied by `UlaCache.commit` and re-applied by `replay`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _empty() -> np.ndarray:
    """The shared read-only int64[0] a field holds until the policy sets it (no allocation per plan)."""
    return _EMPTY


_EMPTY = np.zeros(0, np.int64)
_EMPTY.setflags(write=False)


@dataclass
class Plan:
    """Counts are per whole plan (unique references, rows = token rows of one layer); per-rank arrays are
    int64[num_ranks]. Rows on a link: h2d = CPU -> GPU promotions, d2h = GPU -> CPU (victims written out, plus KV
    of tokens allocated into / backed up to the CPU tier since the previous access), peer = GPU -> GPU fetches into
    TP local buffers, counted at the receiving rank. Byte counts are rows x row bytes."""

    version: int
    now: int
    addrs: np.ndarray  # the batch's distinct addresses, ascending
    num_refs: int = 0
    num_unique: int = 0
    num_hits: int = 0
    num_misses: int = 0
    num_exchanges: int = 0
    num_local_hits: int = 0
    num_peer_fetches: int = 0
    h2d_rows_per_rank: np.ndarray = field(default_factory=_empty)
    d2h_rows_per_rank: np.ndarray = field(default_factory=_empty)
    peer_rows_per_rank: np.ndarray = field(default_factory=_empty)
    # Row moves over unified places (GPU, CPU, TP local-buffer places); every source is read before any write.
    move_src: np.ndarray = field(default_factory=_empty)
    move_dst: np.ndarray = field(default_factory=_empty)
    policy_state: Any = None  # private: what the policy applies at commit (executors read `exchanges`)
    buffer_state: Any = None  # private: what the TP local buffers apply at commit
    committed: bool = False
    layers_done: set = field(default_factory=set)
    # Exchanges, or a callable of the plan building them on first use. It takes the plan as its argument rather than
    # holding it: a plan referring to itself would be a reference cycle, freed only by the cyclic GC, and the plans
    # of a replay (MBs each) piled up between collections (pinned-keys TP replay: ~0.8 GB of its 1.39 GB peak).
    _exchanges: Any = field(default=None, repr=False)

    @property
    def exchanges(self):
        """The plan's transfers as a typed, read-only `layout.Exchanges` (built on first use)."""
        if callable(self._exchanges):
            self._exchanges = self._exchanges(self)
        return self._exchanges

    @property
    def h2d_rows(self) -> int:
        return int(self.h2d_rows_per_rank.sum())

    @property
    def d2h_rows(self) -> int:
        return int(self.d2h_rows_per_rank.sum())

    @property
    def peer_rows(self) -> int:
        return int(self.peer_rows_per_rank.sum())

    def counts(self) -> dict[str, int]:
        """The plan's counts as a plain dict (for logs and the simulator)."""
        keys = ("num_refs", "num_unique", "num_hits", "num_misses", "num_exchanges", "num_local_hits",
                "num_peer_fetches", "h2d_rows", "d2h_rows", "peer_rows")
        return {k: int(getattr(self, k)) for k in keys}

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.counts().items())
        return f"Plan(now={self.now}, {inner}, committed={self.committed})"


__all__ = ["Plan"]
