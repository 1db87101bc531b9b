"""Statistics of selection traces: set overlaps step to step, between query tokens and between adjacent groups.

Overlap of two top-k sets = |A ∩ B| / |A| (the fraction of A's positions that B selects again), as in docs/architecture.md
("exact top-2048 set overlap between consecutive steps").
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from traces.errors import TraceError


def set_overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a ∩ b| / |a| per row of two int arrays [..., K] of distinct positions (-1 = padding)."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    c = np.sort(np.concatenate([a, b], axis=-1), axis=-1)
    common = ((c[..., 1:] == c[..., :-1]) & (c[..., 1:] >= 0)).sum(-1)
    n = (a >= 0).sum(-1)
    return np.where(n > 0, common / np.maximum(n, 1), np.nan)


def group_roles(num_groups: int, num_early: int = 2, deep_start_frac: float = 0.33) -> tuple[list[int], list[int]]:
    """(early groups, deep groups) as docs/architecture.md reports them: the first two layers; layers from ~1/3 depth on."""
    n_early = min(num_early, max(num_groups - 1, 0))
    g_deep = max(n_early, math.ceil(deep_start_frac * num_groups))
    return list(range(n_early)), list(range(g_deep, num_groups))


def _sample_synthetic(requests: pd.DataFrame, num_requests: int, num_steps: int, tokens_per_step: int, seed: int):
    rng = np.random.default_rng([seed & 0xFFFFFFFF, 0x57A7])
    n = min(num_requests, len(requests))
    pick = rng.choice(len(requests), size=n, replace=False) if n < len(requests) else np.arange(n)
    req = requests.iloc[np.sort(pick)]
    rid = np.repeat(req["request_id"].to_numpy(), num_steps)
    inp = np.repeat(req["input_tokens"].to_numpy(), num_steps)
    out = np.repeat(req["output_tokens"].to_numpy(), num_steps)
    max_step = np.maximum(out // max(tokens_per_step, 1) - 1, 1)
    step = (rng.random(rid.size) * max_step).astype(np.int64)
    hist = inp + step * tokens_per_step
    return rid, step, hist, hist + tokens_per_step


def _sample_captured(source, num_requests: int, num_steps: int, seed: int):
    idx = source.index
    g0 = idx[idx["group"] == 0]
    keys = set(zip(g0["request_id"].tolist(), g0["step"].tolist()))
    has_next = np.array([(r, s + 1) in keys for r, s in zip(g0["request_id"].tolist(), g0["step"].tolist())], bool)
    cand = g0[has_next]
    if cand.empty:
        raise TraceError("captured selections hold no two consecutive steps of one request: no overlap to measure")
    rng = np.random.default_rng([seed & 0xFFFFFFFF, 0xCA97])
    take = rng.choice(len(cand), size=min(len(cand), num_requests * num_steps), replace=False)
    cand = cand.iloc[np.sort(take)]
    nxt = g0.set_index(["request_id", "step"])["history_len"]
    rid = cand["request_id"].to_numpy()
    step = cand["step"].to_numpy()
    hist = cand["history_len"].to_numpy()
    hist2 = nxt.loc[list(zip(rid.tolist(), (step + 1).tolist()))].to_numpy()
    return rid, step, hist, hist2


def selection_stats(source, requests: pd.DataFrame | None = None, num_requests: int = 16, num_steps: int = 8,
                    num_query_tokens: int = 4, tokens_per_step: int = 1, seed: int = 0,
                    groups: list[int] | None = None) -> dict:
    """Measured overlaps of a SelectionSource on sampled (request, step) pairs; per group and summarized."""
    if getattr(source, "kind", "") == "captured":
        rid, step, hist, hist2 = _sample_captured(source, num_requests, num_steps, seed)
        q = min(num_query_tokens, int(source.index["num_query_tokens"].min()))
    else:
        if requests is None or len(requests) == 0:
            raise TraceError("selection_stats needs requests to sample histories from")
        rid, step, hist, hist2 = _sample_synthetic(requests, num_requests, num_steps, tokens_per_step, seed)
        q = num_query_tokens
    ng = int(source.num_groups)
    groups = list(range(ng)) if groups is None else groups
    per_group = []
    prev = None
    for g in groups:
        a = source.select(rid, hist, step, g, q)
        b = source.select(rid, hist2, step + 1, g, 1)
        row = {"group": g, "step_overlap": float(np.nanmean(set_overlap(a[:, 0], b[:, 0])))}
        row["spec_overlap"] = (float(np.nanmean(set_overlap(a[:, :1].repeat(q - 1, 1), a[:, 1:])))
                               if q > 1 else None)
        row["adjacent_overlap"] = (float(np.nanmean(set_overlap(prev[1][:, 0], a[:, 0])))
                                   if prev is not None and prev[0] == g - 1 else None)
        per_group.append(row)
        prev = (g, a)
    early, deep = group_roles(ng)
    by_g = {r["group"]: r for r in per_group}

    def mean(key, gs):
        vals = [by_g[g][key] for g in gs if g in by_g and by_g[g][key] is not None]
        return float(np.mean(vals)) if vals else None

    deep_step = [by_g[g]["step_overlap"] for g in deep if g in by_g]
    return {
        "num_sampled_pairs": int(rid.size), "num_query_tokens": q, "tokens_per_step": tokens_per_step,
        "early_groups": early, "deep_groups": deep,
        "step_overlap_early_mean": mean("step_overlap", early),
        "step_overlap_deep_mean": mean("step_overlap", deep),
        "step_overlap_deep_min": float(min(deep_step)) if deep_step else None,
        "step_overlap_deep_max": float(max(deep_step)) if deep_step else None,
        "spec_overlap_deep_mean": mean("spec_overlap", deep),
        "adjacent_overlap_deep_mean": mean("adjacent_overlap", deep[1:] if len(deep) > 1 else deep),
        "per_group": per_group,
    }


def length_stats(requests: pd.DataFrame) -> dict:
    """Counts and percentiles of input and output lengths, and the fraction at the largest input."""
    out = {"num_requests": int(len(requests))}
    for col in ("input_tokens", "output_tokens"):
        v = requests[col].to_numpy()
        out[col] = {f"p{p}": float(np.percentile(v, p)) for p in (0, 10, 50, 90, 100)} if v.size else {}
        out[col]["mean"] = float(v.mean()) if v.size else None
    if len(requests):
        inp = requests["input_tokens"].to_numpy()
        out["input_frac_at_max"] = float(np.mean(inp == inp.max()))
        arr = requests["arrival_s"].to_numpy()
        out["arrival"] = "closed" if np.all(arr == 0) else "timed"
        out["arrival_span_s"] = float(arr.max() - arr.min())
    return out
