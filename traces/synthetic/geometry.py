"""Strata geometry: where each stratum of a group lies on a strata domain (`group_tables`), which domain a history
uses (`domains`), and the terms of a draw that depend on the history length alone (`batch_terms` for a batch of
rows; `hist_interval` for one row, with the interval of lengths over which they hold)."""
from __future__ import annotations

import numpy as np

from traces.synthetic.plan import GroupPlan


def group_tables(plan: GroupPlan, dom: int) -> dict[str, np.ndarray]:
    """One group's strata on domain `dom`, one column per stratum in output order (stable, recurring, fresh):
    see `SyntheticSelections._tables`."""
    blocks = (plan.stable, plan.recurring, plan.fresh)
    m0, m1 = plan.stable.index.size, plan.recurring.index.size
    kp = plan.num_strata
    every = np.arange(kp, dtype=np.int64)
    start_all = every * dom // kp
    len_all = (every + 1) * dom // kp - start_all
    cw_all = np.minimum(len_all // 2, len_all[::-1] - len_all[::-1] // 2)
    i = np.concatenate([b.index for b in blocks])
    j = kp - 1 - i
    start, length, cw = start_all[i], len_all[i], cw_all[i]
    mstart, mlen = start_all[j], len_all[j]
    cands = floor_pow2(np.maximum(np.minimum(np.concatenate([b.cands for b in blocks]), cw), 1))
    stride = np.where(cands > 1, cw // cands, 0)
    kind = np.repeat([0, 1, 2], [m0, m1, kp - m0 - m1])
    fresh = kind == 2
    i32 = lambda x: np.ascontiguousarray(x, dtype=np.int32)  # noqa: E731
    u32 = lambda x: np.ascontiguousarray(x, dtype=np.uint32)  # noqa: E731
    return {"start_cw": i32(start + cw), "lo": i32(start + plan.num_sink),
            "fold_shift": i32(mstart + mlen // 2 - start),
            "phase": u32(np.concatenate([b.phase for b in blocks[:2]] + [np.zeros(kp - m0 - m1, np.uint32)])),
            "ck_mult": u32(np.where(kind == 0, cw, np.where(fresh, 0, cw - (cands - 1) * stride))),
            "mult": u32(np.where(kind == 1, stride, 0)), "fresh": fresh,
            "sh1": u32(np.where(kind == 1, 32 - np.maximum(log2(cands), 1), 16)),
            "sh2": u32(np.where(fresh, 15 if plan.early else 16, 0)),
            "mask": u32(np.where(fresh, 0xFFFFFFFE, 0xFFFFFFFF)),
            "start": i32(start), "mirror_cw": i32(mstart + cw_all[j]), "ln": i32(length),
            "fold_d": i32(mlen - mlen // 2 - length), "half_d": i32(length // 2 - length),
            "par": u32((i & 1) * fresh)}


def batch_terms(tb: dict, hcol: np.ndarray, scol: np.ndarray, early: bool) -> tuple[np.ndarray, np.ndarray]:
    """(lo, mult) of `_select_main` computed for a batch of rows (one domain) from their middle lengths `hcol`
    and steps `scol`: `hist_terms_of`, then in early groups the step's parity (fresh picks alternate position
    parity from step to step: a stratum of length ln > 1 draws from its positions of one parity), then the
    draw's multiplier: a fresh stratum's length, else the table's."""
    lo, ln = hist_terms_of(tb, hcol)
    if early:
        par = (tb["par"] ^ (scol & np.uint32(1))) * (ln > 1)
        par &= tb["fresh"]
        lo += par.view(np.int32)
        ln -= par.view(np.int32)
        ln += 1
        ln >>= 1
    return lo, np.where(tb["fresh"], ln.view(np.uint32), tb["mult"])


def hist_terms_of(tb: dict, hcol: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column (int32, shape of `tb`'s rows x hcol's): lo, the draw's base position (a stratum whose window
    does not fit the history is folded onto its mirror); ln, a fresh stratum's length (folded, halved, cut at the
    end of the history: the one stratum that straddles it, if not folded; strata left of it end before it, an
    unfolded one starts inside it)."""
    invalid = tb["start_cw"] > hcol
    lo = np.multiply(invalid, tb["fold_shift"], dtype=np.int32)
    lo += tb["lo"]
    ln = np.multiply(invalid, tb["fold_d"], dtype=np.int32)
    ln += np.multiply(tb["mirror_cw"] > hcol, tb["half_d"], dtype=np.int32)
    ln += tb["ln"]
    np.minimum(ln, hcol - tb["start"], out=ln, where=~invalid)
    return lo, ln


def hist_interval(tb: dict, h: int, early: bool) -> tuple:
    """(a, b, lo, mult, cuts, size) for one row at middle length h: `batch_terms` there for either parity of the
    step (lo[p], mult[p]: read-only; the same arrays for both outside early groups) and the lengths [a, b) over
    which they stay the same except in the strata cut at the end of the history, whose length is h - start:
    `cuts`, one (group row, column, start, lo without parity, parity bit, fresh) per cut stratum (Python ints).
    Every comparison behind lo and ln is `length < threshold` (a fold: start_cw; a mirror's half: mirror_cw; a
    cut: start + its uncut length, where not folded), so it holds between consecutive thresholds. `size`: the
    elements kept."""
    hcol = np.full((1, 1, 1), h, dtype=np.int32)
    lo, ln = hist_terms_of(tb, hcol)
    invalid = tb["start_cw"] > hcol
    uncut = np.multiply(invalid, tb["fold_d"], dtype=np.int64)
    uncut += np.multiply(tb["mirror_cw"] > hcol, tb["half_d"], dtype=np.int64)
    uncut += tb["ln"]
    start = tb["start"].astype(np.int64)
    ends = (start + uncut)[~invalid]
    cut = np.flatnonzero(~invalid & (h - start < uncut))
    thr = np.concatenate([tb["start_cw"].reshape(-1), tb["mirror_cw"].reshape(-1), ends]).astype(np.int64)
    below, above = thr[thr <= h], thr[thr > h]
    a = int(below.max()) if below.size else -(1 << 62)
    b = int(above.min()) if above.size else 1 << 62
    kp = lo.shape[-1]
    cuts = [(c // kp, c % kp, s, l0, p0, f) for c, s, l0, p0, f in zip(
        cut.tolist(), tb["start"].reshape(-1)[cut].tolist(), lo.reshape(-1)[cut].tolist(),
        tb["par"].reshape(-1)[cut].tolist(), tb["fresh"].reshape(-1)[cut].tolist())]
    if early:
        los, mults = (list(x) for x in zip(*(batch_terms(tb, hcol, np.uint32(p), True) for p in (0, 1))))
    else:
        los = [lo] * 2
        mults = [np.where(tb["fresh"], ln.view(np.uint32), tb["mult"])] * 2
    for x in los + mults:
        x.setflags(write=False)
    return a, b, los, mults, cuts, lo.size * (4 if early else 2)


def domain(hm: int, kp: int) -> int:
    """`domains` of one row (hm >= 1), in Python integers."""
    return 1 << (((hm * (2 * kp)) // (kp + 4)).bit_length() - 1)


def domains(hm: np.ndarray, kp: int) -> np.ndarray:
    """Per row the strata domain: the largest power of two d with d/2 + 2d/k' <= hm (hm = middle length).

    It only changes when the history crosses such a bound, so strata stay put while a history grows.
    """
    x = (hm.astype(np.int64) * (2 * kp)) // (kp + 4)
    if x.size <= 8 and x.min() >= 1:  # a few rows: the same powers of two from Python integers
        return np.array([1 << (v.bit_length() - 1) for v in x.tolist()], dtype=np.int64)
    dom = np.left_shift(np.int64(1), np.floor(np.log2(x.astype(np.float64))).astype(np.int64))
    return np.where(dom * 2 <= x, dom * 2, np.where(dom > x, dom // 2, dom))  # guard float rounding


def floor_pow2(x: np.ndarray) -> np.ndarray:
    """Largest power of two <= x (x >= 1), elementwise."""
    return np.left_shift(1, log2(x)).astype(np.int64)


def log2(x: np.ndarray) -> np.ndarray:
    """floor(log2(x)) for integers x >= 1 (exact for x < 2**52)."""
    return np.frexp(np.asarray(x, np.float64))[1].astype(np.int64) - 1
