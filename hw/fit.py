"""Pure fitting helpers for `hw calibrate` (numpy only; tested on CPU)."""
from __future__ import annotations

import itertools

import numpy as np


def fit_latency_bandwidth(num_rows, times_s, row_bytes: float, link_bw_bytes_s: float) -> dict:
    """Fit t = latency + rows * row_bytes / (link_bw * efficiency) by least squares on (rows, t).

    Returns latency_s (>= 0), efficiency (clipped to (0, 1]) and the fit's median relative error."""
    x = np.asarray(num_rows, dtype=float)
    y = np.asarray(times_s, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("need at least two distinct transfer sizes to fit latency and bandwidth")
    w = 1.0 / y  # relative-error weighting: small transfers count as much as large ones
    A = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (lat, slope), *_ = np.linalg.lstsq(A, y * w, rcond=None)
    if lat < 0:  # refit through the origin
        lat, slope = 0.0, float(np.sum(x * y * w * w) / np.sum(x * x * w * w))
    eff = row_bytes / (slope * link_bw_bytes_s)
    eff = float(min(max(eff, 1e-3), 1.0))
    pred = lat + x * row_bytes / (link_bw_bytes_s * eff)
    return {"latency_s": float(lat), "efficiency": eff, "median_rel_err": float(np.median(np.abs(pred - y) / y))}


def fit_nonnegative(X, y, names: list[str]) -> dict:
    """Least squares y ~ X @ c with c >= 0 (exhaustive active sets; X has few columns), relative-error weighted."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    w = 1.0 / y
    best = None
    for k in range(1, X.shape[1] + 1):
        for cols in itertools.combinations(range(X.shape[1]), k):
            A = X[:, cols] * w[:, None]
            c, *_ = np.linalg.lstsq(A, y * w, rcond=None)
            if (c < 0).any():
                continue
            full = np.zeros(X.shape[1])
            full[list(cols)] = c
            err = float(np.sum(((X @ full - y) * w) ** 2))
            if best is None or err < best[0] - 1e-15:
                best = (err, full)
    if best is None:
        raise ValueError("no non-negative fit exists for these measurements")
    coef = best[1]
    rel = np.abs(X @ coef - y) / y
    return {**{n: float(v) for n, v in zip(names, coef)}, "median_rel_err": float(np.median(rel)),
            "max_rel_err": float(rel.max())}
