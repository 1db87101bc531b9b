"""UlaCache policy library: one logical address space over GPU and CPU KV pools (DESIGN §2-§5, §8).

    from ulacache import UlaCache, CacheConfig, CapacityError, Plan
"""
from .cache import UlaCache
from .config import CacheConfig
from .errors import CapacityError
from .plan import Plan

__all__ = ["CacheConfig", "CapacityError", "Plan", "UlaCache"]
