"""Synthetic decode batches for the hardware runs: requests with long histories in a pb-lru UlaCache, and per-step
top-k selections with step-to-step locality and speculative query tokens that overlap (CPU only, numpy)."""
from __future__ import annotations

import numpy as np

from ulacache import CacheConfig, UlaCache


def build_cache(num_requests: int, history: int, gpu_slots: int, cpu_slots: int, *, num_ranks: int = 1,
                mode: str = "dp", payload_bytes: int = 0, local_buffer_slots: int = 0,
                num_recent_buckets: int = 32) -> tuple[UlaCache, list]:
    """A numpy-backed pb-lru cache holding `num_requests` histories of `history` tokens (GPU first, then CPU)."""
    cfg = CacheConfig(mode=mode, num_ranks=num_ranks, gpu_slots=gpu_slots, cpu_slots=cpu_slots, policy="pb-lru",
                      backend="numpy", payload_bytes=payload_bytes, local_buffer_slots=local_buffer_slots,
                      num_recent_buckets=num_recent_buckets)
    cache = UlaCache(cfg)
    ids = list(range(num_requests))
    ranks = [i % num_ranks for i in ids] if mode == "dp" else None
    cache.alloc_many(ids, [history] * num_requests, ranks)
    addrs = [cache.request_addresses(i) for i in ids]
    return cache, addrs


class Selector:
    """Per request a current top-k set that keeps `keep` of its positions each step; each of `q` query tokens takes
    the set with a fraction `token_overlap` shared and the rest drawn fresh (their union drives the transfers)."""

    def __init__(self, num_requests: int, history: int, top_k: int, q: int, *, keep: float = 0.44,
                 token_overlap: float = 0.8, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.n, self.h, self.k, self.q = num_requests, history, top_k, q
        self.keep, self.overlap = keep, token_overlap
        self.base = np.stack([self.rng.choice(history, size=top_k, replace=False) for _ in range(num_requests)])

    def step(self) -> np.ndarray:
        """int64[num_requests, q, top_k] history positions (duplicates inside a token are allowed; dedup removes)."""
        rng, n, k = self.rng, self.n, self.k
        new = rng.integers(0, self.h, size=(n, k))
        keep = rng.random((n, k)) < self.keep
        self.base = np.where(keep, self.base, new)
        out = np.empty((n, self.q, k), dtype=np.int64)
        for t in range(self.q):  # loop over query tokens (q <= 4)
            fresh = rng.integers(0, self.h, size=(n, k))
            share = rng.random((n, k)) < (1.0 if t == 0 else self.overlap)
            out[:, t] = np.where(share, self.base, fresh)
        return out


def to_addresses(addrs: list, positions: np.ndarray) -> np.ndarray:
    """Map per-request history positions to the requests' logical addresses (same shape)."""
    table = np.stack(addrs)  # [num_requests, history]
    return np.take_along_axis(table, positions.reshape(positions.shape[0], -1), axis=1).reshape(positions.shape)
