"""A group's plan: the solved mixture of stable / recurring / fresh strata and the per-stratum constants that do
not depend on the request (see traces.synthetic for the model)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from traces.hashing import GOLDEN32, fold32, key64, mix32
from traces.synthetic.spec import SelectionSpec


def seed_key(seed: int) -> int:
    """The generator's 64-bit key of a seed (row keys and dense draws hash under it)."""
    return key64(seed, 0x5E1EC7)


def seed_key32(seed: int) -> int:
    """`seed_key` folded to 32 bits (the per-stratum keys hash under it)."""
    return int(fold32(np.uint64(seed_key(seed))))


@dataclass(frozen=True)
class StrataBlock:
    """The strata of one kind in one group: stratum index, hash key and per-stratum constants."""

    index: np.ndarray  # int64 stratum index i in [0, k')
    key: np.ndarray  # uint32 column key (band, stratum, seed)
    phase: np.ndarray  # uint32 drift phase in [0, drift_steps)
    cands: np.ndarray  # int64 number of candidate keys (1 for stable, 0 for fresh)


@dataclass(frozen=True)
class GroupPlan:
    """Everything about one indexer group that does not depend on the request: the solved mixture."""

    group: int
    early: bool
    num_sink: int
    num_recent: int
    num_strata: int
    target_overlap: float
    frac_stable: float
    frac_recurring: float
    frac_fresh: float
    stable: StrataBlock
    recurring: StrataBlock
    fresh: StrataBlock


def solve_mixture(target: float, spec: SelectionSpec, early: bool, s: int, w: int, kp: int,
                   inv_cands: float) -> tuple[float, float, float]:
    """Mixture weights (stable, recurring, fresh) whose expected step-to-step overlap is `target`.

    Retention per kind between consecutive steps (history growing ~1 token a step): stable 1 - 1/T, recurring
    (1 - 1/T) E[1/cands], fresh ~1/stratum length (0 with the early parity alternation); sink 1, recent (w-1)/w.
    """
    k = spec.top_k
    t = spec.drift_steps
    r_s = 1.0 - 1.0 / t
    r_r = r_s * inv_cands
    r_f = 0.0 if early else kp / max(spec.calib_history_tokens - s - w, kp)
    m = (target * k - s - max(w - 1, 0)) / kp  # retention needed from the strata
    if early:
        fs = min(max((m - r_f) / (r_s - r_f), 0.0), 1.0)
        return fs, 0.0, 1.0 - fs
    ff = spec.fresh_frac
    fs = (m - (1.0 - ff) * r_r - ff * r_f) / (r_s - r_r) if r_s > r_r else 0.0
    if fs >= 0.0:
        fs = min(fs, 1.0 - ff)
        return fs, 1.0 - ff - fs, ff
    fr = min(max((m - r_f) / (r_r - r_f), 0.0), 1.0) if r_r > r_f else 0.0
    return 0.0, fr, 1.0 - fr


def make_plan(spec: SelectionSpec, seed: int, g: int) -> GroupPlan:
    """Group g's plan: its target overlap (early, ramp or deep; deep targets spread per group by a hash),
    per-stratum keys (shared across a band of adjacent groups), drift phases, candidate counts and kinds
    drawn from the solved mixture."""
    sp = spec
    n = sp.num_groups
    n_early = min(sp.early_groups, max(n - 1, 0))
    early = g < n_early
    s, w = (sp.early_num_sink, sp.early_num_recent) if early else (sp.num_sink, sp.num_recent)
    kp = sp.top_k - s - w
    g_deep = max(n_early, math.ceil(sp.deep_start_frac * n))
    if early:
        target = sp.early_overlap
    elif g >= g_deep:
        u = (key64(seed, 0x6E0, g) >> 11) / float(1 << 53)
        target = sp.deep_overlap + sp.deep_overlap_spread * (2.0 * u - 1.0)
    else:  # ramp between the early and the deep groups
        frac = (g - n_early + 1) / (g_deep - n_early + 1)
        target = sp.early_overlap + (sp.deep_overlap - sp.early_overlap) * frac
    i = np.arange(kp, dtype=np.uint32)
    seed32 = np.uint32(seed_key32(seed))
    with np.errstate(over="ignore"):
        if early:  # early groups are their own band
            band_key = np.full(kp, mix32(np.uint32(key64(seed, 0xEA, g) & 0xFFFFFFFF)), np.uint32)
        else:
            offset = mix32(i ^ seed32 ^ np.uint32(0x0FF5E7)) % np.uint32(sp.band_groups)
            band = (np.uint32(g) + offset) // np.uint32(sp.band_groups)
            band_key = mix32(band * GOLDEN32 ^ seed32 ^ np.uint32(0xBA4D))
        key = mix32(band_key ^ mix32(i * np.uint32(0x85EBCA77) ^ seed32))
        u_type = (mix32(key ^ np.uint32(0x7E9E)) >> np.uint32(8)).astype(np.float64) / float(1 << 24)
        phase = mix32(key ^ np.uint32(0x9A5E)) & np.uint32(sp.drift_steps - 1)
        lo_log, hi_log = sp.min_candidates.bit_length() - 1, sp.max_candidates.bit_length() - 1
        span = hi_log - lo_log + 1  # candidate counts: powers of two, uniform in log2
        cands = np.left_shift(1, lo_log + (mix32(key ^ np.uint32(0xCA4D)) % np.uint32(span)).astype(np.int64))
    inv_cands = float(np.mean([2.0 ** -e for e in range(lo_log, hi_log + 1)]))
    fs, fr, ff = solve_mixture(target, sp, early, s, w, kp, inv_cands)
    kind = np.where(u_type < fs, 0, np.where(u_type < fs + fr, 1, 2))

    def block(k: int, ncand) -> StrataBlock:
        idx = np.flatnonzero(kind == k)
        c = ncand[idx] if isinstance(ncand, np.ndarray) else np.full(idx.size, ncand, np.int64)
        return StrataBlock(idx.astype(np.int64), key[idx], phase[idx], c)

    return GroupPlan(g, early, s, w, kp, float(target), fs, fr, ff,
                     block(0, 1), block(1, cands), block(2, 0))
