"""Replacement policies behind one protocol, chosen by `CacheConfig.policy` from this registry."""
from __future__ import annotations

from .base import Policy
from .hisparse import HiSparsePolicy
from .lru import LruPolicy
from .pblru import PbLruPolicy

POLICIES: dict[str, type] = {
    "pb-lru": PbLruPolicy,
    "lru": LruPolicy,
    "hisparse": HiSparsePolicy,
}

__all__ = ["POLICIES", "Policy", "HiSparsePolicy", "LruPolicy", "PbLruPolicy"]
