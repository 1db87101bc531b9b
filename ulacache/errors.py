"""Exceptions of the policy library."""
from __future__ import annotations


class CapacityError(RuntimeError):
    """The request cannot be served with the capacity present (pools full, working set larger than the GPU pool).

    A capacity condition, not bad input: admission control is expected to prevent it. The cache is unchanged.
    """



def require(condition, message: str) -> None:
    """An invariant check that also holds under `python -O` (unlike `assert`): AssertionError naming the invariant."""
    if not condition:
        raise AssertionError(message)


__all__ = ["CapacityError", "require"]
