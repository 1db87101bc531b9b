"""A small synthetic selection workload with locality, for the library's tests and benchmark (not a trace format).

Each request keeps a candidate set of history positions. Every step a fraction `keep` of the set carries over (the
step-to-step top-k overlap, ~44% measured on DeepSeek-V3.2, docs/architecture.md); the rest is redrawn, with probability
`hot` from a per-request hot set (positions selected again and again, e.g. attention sinks and key facts) and
otherwise uniformly from the history. Each of `num_query` query tokens selects `top_k` positions of the candidate
set, so their union has duplicates like speculative verify tokens. Deterministic given the seed.
"""
from __future__ import annotations

import numpy as np


class LocalityWorkload:
    def __init__(self, num_requests: int, history: int, top_k: int, candidates: int, num_query: int = 1,
                 keep: float = 0.5, hot: float = 0.5, hot_size: int | None = None, seed: int = 0):
        if not 0 < top_k <= candidates <= history:
            raise ValueError(f"need 0 < top_k ({top_k}) <= candidates ({candidates}) <= history ({history})")
        self.rng = np.random.default_rng(seed)
        self.R, self.H, self.k, self.C, self.q = num_requests, history, top_k, candidates, num_query
        self.keep, self.hot = keep, hot
        hot_size = hot_size or candidates
        self.hot_set = self._distinct(hot_size)
        self.cands = self._distinct(candidates)

    def _distinct(self, n: int) -> np.ndarray:
        return self.rng.random((self.R, self.H)).argsort(axis=1)[:, :n]

    def step(self) -> np.ndarray:
        """(num_requests, num_query, top_k) history positions for this step, then evolve the candidate sets."""
        pick = self.rng.random((self.R, self.q, self.C)).argsort(axis=2)[:, :, : self.k]
        out = np.take_along_axis(np.broadcast_to(self.cands[:, None, :], (self.R, self.q, self.C)), pick, axis=2)
        self._evolve()
        return out

    def _evolve(self) -> None:
        n_new = self.C - int(round(self.C * self.keep))
        if n_new <= 0:
            return
        # Proposals: hot-set members or uniform positions; keep distinct ones not already kept.
        kept = self.cands[:, : self.C - n_new]
        hot_pick = np.take_along_axis(self.hot_set, self.rng.integers(0, self.hot_set.shape[1], (self.R, 4 * n_new)),
                                      axis=1)
        uni_pick = self.rng.integers(0, self.H, (self.R, 4 * n_new))
        prop = np.where(self.rng.random((self.R, 4 * n_new)) < self.hot, hot_pick, uni_pick)
        new = np.empty_like(self.cands)
        for r in range(self.R):  # test/bench workload generator, not a hot path
            seen = np.zeros(self.H, dtype=bool)
            seen[kept[r]] = True
            p = prop[r]
            _, first = np.unique(p, return_index=True)
            p = p[np.sort(first)]
            p = p[~seen[p]][:n_new]
            if p.size < n_new:  # fall back to uniform fresh positions
                seen[p] = True
                p = np.concatenate([p, np.flatnonzero(~seen)[: n_new - p.size]])
            new[r] = np.concatenate([kept[r], p])
        self.cands = self.rng.permuted(new, axis=1)


__all__ = ["LocalityWorkload"]
