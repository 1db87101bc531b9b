"""Exceptions of the policy library."""
from __future__ import annotations


class CapacityError(RuntimeError):
    """The request cannot be served with the capacity present (pools full, working set larger than the GPU pool).

    A capacity condition, not bad input: admission control is expected to prevent it. The cache is unchanged.
    """


__all__ = ["CapacityError"]
