"""The policy protocol: what the cache facade calls. A policy owns its pools and the address space."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ..address_space import AddressSpace
from ..plan import Plan


class Policy(Protocol):
    name: str
    exclusive: bool  # GPU and CPU tiers hold disjoint entries (pb-lru, lru); False: GPU holds copies (hisparse)
    space: AddressSpace
    step: int  # committed access batches (the recency clock; never the wall clock)
    num_gpu_places: int
    gpu_seg: int  # GPU places per rank (padded to 64)
    num_places: int  # GPU + CPU places
    alloc_moves: tuple[np.ndarray, np.ndarray] | None  # GPU-internal byte moves done by the last alloc

    exact_lru: bool  # the GPU pool keeps an exact LRU order (lru)

    # Class-level facts of a configuration (classmethods: callers sizing a cache ask before building one)
    @classmethod
    def check_config(cls, cfg) -> None:
        """ValueError (one line) when `cfg`'s sizes cannot hold this policy's layout."""

    @classmethod
    def address_slots_per_rank(cls, cfg) -> int:
        """Addresses (history entries) one rank can hold."""

    @classmethod
    def gpu_history_slots(cls, cfg) -> float:
        """History entries one rank's GPU tier holds before the rest goes to its CPU tier (inf: the tiers do not
        split the history)."""

    @classmethod
    def local_buffer_slots(cls, cfg) -> int:
        """Per-rank TP local buffer of copies of other ranks' entries (0: none)."""

    @classmethod
    def gpu_copy_slots(cls, cfg) -> int:
        """GPU copies of entries (buffers, not history of their own) a cache holds at most over all ranks."""

    @classmethod
    def ranks_per_request(cls, cfg) -> int:
        """Ranks over which one request's entries are spread."""

    def alloc_many(self, request_ids: list[int], counts: np.ndarray, ranks: np.ndarray, tp: bool) -> np.ndarray:
        """Addresses for counts[i] new tokens of request_ids[i]; CapacityError (nothing changed) when full."""

    def alloc_one(self, request_id: int, count: int, rank: int, tp: bool) -> np.ndarray:
        """`alloc_many([request_id], [count], [rank], tp)` with scalars (a decode step's growth)."""

    def access(self, plan: Plan, places: np.ndarray, ix: np.ndarray | None = None) -> None:
        """Fill `plan` for its unique addresses (places = their current places, ix = their positions in the address
        space's storage when the caller has them); CapacityError if it cannot fit."""

    def commit(self, plan: Plan) -> None:
        """Apply the plan's mapping and policy-state changes (the facade has moved the bytes)."""

    def free(self, request_id: int) -> np.ndarray:
        """Release the request; returns its addresses."""

    def free_slots(self) -> tuple[np.ndarray, np.ndarray]:
        """(GPU, CPU) free token slots per rank."""

    def capacity(self) -> tuple[np.ndarray, np.ndarray]:
        """(GPU, CPU) token slots per rank."""

    def held_rows(self) -> tuple[int, int]:
        """(GPU, CPU) token rows held now over all ranks, copies and replicas included."""

    def check_invariants(self) -> None:
        """AssertionError naming the first broken invariant."""


__all__ = ["Policy"]
