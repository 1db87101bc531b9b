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
