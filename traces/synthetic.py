"""Synthetic sparse-attention selections: a sampled model of a lightning indexer's top-k, fast and stateless.

Model (what a drifting query scored against clustered keys looks like from the cache's side):
- **sink**: the first `num_sink` positions are always selected; **recency**: the newest `num_recent` positions are
  always selected (so freshly decoded tokens are read at once).
- The rest of the history is cut into k' = top_k - sink - recent **strata** (runs of ~history/k' positions) and each
  stratum contributes exactly one position, so a set never holds a duplicate and needs no sort or dedupe. A stratum
  is one of three kinds (per group, drawn from a hash):
  * **stable** (heavy hitters): one salient key, the same every step; it drifts to another key every `drift_steps`.
  * **recurring** (a key cluster): 2..6 salient keys; each step the query picks one of them at random, so the
    position recurs often but not every step (the cluster's keys drift too).
  * **fresh** (noise): any position of the stratum, drawn anew each step.
  The mixture weights are solved per group from the target step-to-step overlap (DESIGN §7: ~44% in deep groups,
  spread 35-50%; ~1.5% in the first two, below the ~3% of random sets: there, fresh picks alternate position
  parity from step to step, a positional/RoPE-like pattern that makes consecutive sets nearly disjoint).
- **Adjacent groups** share each stratum's whole random process unless a band boundary (every `band_groups` groups,
  staggered per stratum) separates them: high similarity between neighbouring indexer groups.
- **Speculative query tokens** of one step reuse query 0's draw for a stratum with probability `spec_share`, else draw
  independently: high overlap between the query tokens of one step.
Strata live on a fixed power-of-two domain (chosen from the history length with slack) so that a growing history
does not move them; strata beyond the history fold onto the upper half of their mirror stratum. The result is a
pure function of (seed, request_id, step, group, query index, history_len): nothing depends on call order.
Spatial clustering of selected positions is not modeled: the caches that replay these traces are token-granular.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields

import numpy as np

from traces.errors import TraceError
from traces.hashing import GOLDEN32, MIX32, fold32, key64, mix32, row_keys32

GENERATOR = "stratified-mixture-v1"
MODEL_GROUPS = {"glm-5.2": 21, "glm-5": 78, "deepseek-v3.2": 61}
MAX_HISTORY_TOKENS = 1 << 26  # strata stay < 2**16 positions long (16-bit draws)
_CHUNK_ELEMS = 1 << 19  # per-element work is done in row chunks of about this many outputs (cache-sized)
_ROW_CACHE_ELEMS = 1 << 22  # per-(request, stratum) keys kept for the next steps (16 MiB)
_ROW_TERMS_ROWS = 32  # batches of up to this many rows keep their history-length terms per row (`_row_terms`)
_HIST_CACHE_ELEMS = 1 << 22  # elements of those terms kept (16 MiB)
_TS_MIX32 = np.uint32((0x846CA68B * int(MIX32)) & 0xFFFFFFFF)  # the step key's multiplier times MIX32


@dataclass(frozen=True)
class SelectionSpec:
    """Parameters of the synthetic selection generator (all of them are stored in trace.yaml)."""

    num_groups: int = 21
    top_k: int = 2048
    generator: str = GENERATOR
    num_sink: int = 16
    num_recent: int = 64
    early_groups: int = 2
    early_num_sink: int = 0
    early_num_recent: int = 16
    early_overlap: float = 0.015
    deep_start_frac: float = 0.33
    deep_overlap: float = 0.44
    deep_overlap_spread: float = 0.05
    fresh_frac: float = 0.30
    min_candidates: int = 2
    max_candidates: int = 8
    drift_steps: int = 256
    band_groups: int = 4
    spec_share: float = 0.6
    calib_history_tokens: int = 98304

    @classmethod
    def from_dict(cls, data: dict | None, source: str = "selection spec") -> SelectionSpec:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise TraceError(f"{source}: unknown key '{key}' (known: {', '.join(sorted(known))})")
        try:
            spec = cls(**data)
        except TypeError as exc:
            raise TraceError(f"{source}: {exc}") from None
        spec.validate(source)
        return spec

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self, source: str = "selection spec") -> None:
        def bad(msg: str) -> TraceError:
            return TraceError(f"{source}: {msg}")

        for name in ("num_groups", "top_k", "num_sink", "num_recent", "early_groups", "early_num_sink",
                     "early_num_recent", "min_candidates", "max_candidates", "drift_steps", "band_groups",
                     "calib_history_tokens"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise bad(f"{name} must be a non-negative integer, got {v!r}")
        for name in ("early_overlap", "deep_start_frac", "deep_overlap", "deep_overlap_spread", "fresh_frac",
                     "spec_share"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= float(v) <= 1.0:
                raise bad(f"{name} must be a number in [0, 1], got {v!r}")
        if self.generator != GENERATOR:
            raise bad(f"unknown generator '{self.generator}' (known: {GENERATOR})")
        if self.num_groups < 1 or self.top_k < 1:
            raise bad("num_groups and top_k must be >= 1")
        for s, w, what in ((self.num_sink, self.num_recent, ""), (self.early_num_sink, self.early_num_recent, "early_")):
            if s + w >= self.top_k:
                raise bad(f"{what}num_sink + {what}num_recent must be < top_k ({self.top_k})")
        if not 1 <= self.min_candidates <= self.max_candidates <= 1024:
            raise bad("need 1 <= min_candidates <= max_candidates <= 1024")
        for name in ("min_candidates", "max_candidates"):
            v = getattr(self, name)
            if v & (v - 1):
                raise bad(f"{name} must be a power of two, got {v}")
        if self.drift_steps < 1 or self.drift_steps & (self.drift_steps - 1):
            raise bad(f"drift_steps must be a power of two, got {self.drift_steps}")
        if self.band_groups < 1:
            raise bad("band_groups must be >= 1")


@dataclass(frozen=True)
class _Block:
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
    stable: _Block
    recurring: _Block
    fresh: _Block


def _solve_mixture(target: float, spec: SelectionSpec, early: bool, s: int, w: int, kp: int,
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


class SyntheticSelections:
    """SelectionSource of synthetic top-k selections (see the module docstring for the model).

    `select(...)` is pure in (seed, request_id, step, group, query index, history_len); plans per group are cached.
    """

    kind = "synthetic"

    def __init__(self, spec: SelectionSpec | dict | None = None, seed: int = 0, num_threads: int | None = None):
        if spec is None or isinstance(spec, dict):
            spec = SelectionSpec.from_dict(spec)
        else:
            spec.validate()
        self.spec = spec
        self.seed = int(seed)
        self.num_groups = int(spec.num_groups)
        self.top_k = int(spec.top_k)
        self._seed_key = key64(self.seed, 0x5E1EC7)
        self._seed32 = int(fold32(np.uint64(self._seed_key)))
        self._plans: dict[int, GroupPlan] = {}
        self._tables_cache: dict[tuple[tuple[int, ...], int], dict[str, np.ndarray]] = {}
        self._row_cache: dict[tuple[tuple[int, ...], bytes], np.ndarray] = {}  # (groups, request ids) -> `_row_keys`
        self._hist_cache: dict[tuple[tuple[int, ...], int, int], tuple] = {}  # (groups, domain, request) -> `_hist_interval`
        self._row_cache_elems = 0
        self._hist_cache_elems = 0
        self._threads = max(1, int(num_threads if num_threads is not None else min(2, os.cpu_count() or 1)))
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ group plans
    def plan(self, group: int) -> GroupPlan:
        """The group's solved mixture and per-stratum constants (cached)."""
        g = self._check_group(group)
        if g not in self._plans:
            self._plans[g] = self._make_plan(g)
        return self._plans[g]

    def _make_plan(self, g: int) -> GroupPlan:
        sp = self.spec
        n = sp.num_groups
        n_early = min(sp.early_groups, max(n - 1, 0))
        early = g < n_early
        s, w = (sp.early_num_sink, sp.early_num_recent) if early else (sp.num_sink, sp.num_recent)
        kp = sp.top_k - s - w
        g_deep = max(n_early, math.ceil(sp.deep_start_frac * n))
        if early:
            target = sp.early_overlap
        elif g >= g_deep:
            u = (key64(self.seed, 0x6E0, g) >> 11) / float(1 << 53)
            target = sp.deep_overlap + sp.deep_overlap_spread * (2.0 * u - 1.0)
        else:  # ramp between the early and the deep groups
            frac = (g - n_early + 1) / (g_deep - n_early + 1)
            target = sp.early_overlap + (sp.deep_overlap - sp.early_overlap) * frac
        i = np.arange(kp, dtype=np.uint32)
        seed32 = np.uint32(self._seed32)
        with np.errstate(over="ignore"):
            if early:  # early groups are their own band
                band_key = np.full(kp, mix32(np.uint32(key64(self.seed, 0xEA, g) & 0xFFFFFFFF)), np.uint32)
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
        fs, fr, ff = _solve_mixture(target, sp, early, s, w, kp, inv_cands)
        kind = np.where(u_type < fs, 0, np.where(u_type < fs + fr, 1, 2))

        def block(k: int, ncand) -> _Block:
            idx = np.flatnonzero(kind == k)
            c = ncand[idx] if isinstance(ncand, np.ndarray) else np.full(idx.size, ncand, np.int64)
            return _Block(idx.astype(np.int64), key[idx], phase[idx], c)

        return GroupPlan(g, early, s, w, kp, float(target), fs, fr, ff,
                         block(0, 1), block(1, cands), block(2, 0))

    def _check_group(self, group) -> int:
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)):
            raise TraceError(f"group must be an integer, got {group!r}")
        if not 0 <= int(group) < self.num_groups:
            raise TraceError(f"group {int(group)} out of range [0, {self.num_groups})")
        return int(group)

    # ------------------------------------------------------------------ selection
    def select(self, request_ids, history_lens, steps, group: int, num_query_tokens: int) -> np.ndarray:
        """int64[R, num_query_tokens, top_k] history positions in [0, history_len); -1 pads short histories."""
        rid, hist, step, q = _check_select_args(request_ids, history_lens, steps, num_query_tokens)
        plan = self.plan(group)
        k = self.top_k
        out = np.empty((rid.size, q, k), dtype=np.int64)
        if rid.size == 0:
            return out
        if int(hist.max()) > MAX_HISTORY_TOKENS:
            raise TraceError(f"history_len {int(hist.max())} exceeds the generator's limit {MAX_HISTORY_TOKENS}")
        short = hist <= k
        kp = plan.num_strata
        dom = _domains(np.maximum(hist - plan.num_sink - plan.num_recent, 1), kp)
        stratified = ~short & (dom >= 2 * kp)  # strata need >= 2 positions; short ones are dense
        if stratified.all():  # the usual case (decode histories): no padding, no dense rows
            self._run_main(plan, rid, hist, step, q, np.arange(rid.size), dom, out)
            return out
        if short.any():
            rows = np.flatnonzero(short)
            ar = np.arange(k, dtype=np.int64)
            out[rows] = np.where(ar[None, :] < hist[rows, None], ar[None, :], -1)[:, None, :]
        dense = ~short & ~stratified
        if dense.any():
            rows = np.flatnonzero(dense)
            out[rows] = self._select_dense(plan, rid[rows], hist[rows], step[rows], q)
        main = np.flatnonzero(stratified)
        if main.size:
            self._run_main(plan, rid, hist, step, q, main, dom[main], out)
        return out

    def select_groups(self, request_ids, history_lens, steps, groups, num_query_tokens: int) -> list[np.ndarray]:
        """[select(request_ids, history_lens, steps, g, num_query_tokens) for g in groups], the same arrays, with
        groups that share their strata geometry computed together (a step's simulated groups at small batches)."""
        rid, hist, step, q = _check_select_args(request_ids, history_lens, steps, num_query_tokens)
        plans = [self.plan(g) for g in groups]
        k, r = self.top_k, rid.size
        few = r <= _ROW_TERMS_ROWS  # a few rows: Python integers, and they may differ in domain (`_row_terms`)
        hl = hist.tolist() if few else None
        if not r or r * q * k > _CHUNK_ELEMS or (max(hl) if few else int(hist.max())) > MAX_HISTORY_TOKENS \
                or (min(hl) if few else int(hist.min())) <= k:
            return [self.select(rid, hist, step, g, q) for g in groups]
        alike: dict[tuple, list[int]] = {}
        for n, p in enumerate(plans):
            alike.setdefault((p.num_sink, p.num_recent, p.early), []).append(n)
        out: list = [None] * len(plans)
        per = max(1, _CHUNK_ELEMS // (r * q * k))  # groups computed together (cache-sized)
        for ns in alike.values():
            p0 = plans[ns[0]]
            kp, mid = p0.num_strata, p0.num_sink + p0.num_recent
            if few:
                dom = [_domain(h - mid, kp) for h in hl]
                lo_dom, hi_dom = min(dom), max(dom)
            else:
                dom = _domains(hist - mid, kp)
                lo_dom, hi_dom = int(dom.min()), int(dom.max())
                dom = lo_dom
            if lo_dom < 2 * kp or (not few and lo_dom != hi_dom):
                for n in ns:  # several domains in a large batch, or dense rows: one group at a time
                    out[n] = self.select(rid, hist, step, groups[n], q)
                continue
            for a in range(0, len(ns), per):
                part = ns[a:a + per]
                arr = self._select_main(tuple(plans[n] for n in part), rid, hist, step, q, dom, None)
                for j, n in enumerate(part):
                    out[n] = arr[j]
        return out

    def _run_main(self, plan: GroupPlan, rid, hist, step, q: int, main: np.ndarray, dom: np.ndarray,
                  out: np.ndarray) -> None:
        """Split the stratified rows (`main`, strata domain `dom` each) into single-domain, cache-sized chunks and
        run them (threads if > 1)."""
        rows_per_chunk = max(1, _CHUNK_ELEMS // (q * self.top_k))
        if main.size == rid.size and main.size <= rows_per_chunk:  # small batch: no chunking
            if main.size <= _ROW_TERMS_ROWS:
                self._select_main((plan,), rid, hist, step, q, dom, out[None])
                return
            if dom.min() == dom.max():
                self._select_main((plan,), rid, hist, step, q, int(dom[0]), out[None])
                return
        order = np.argsort(dom, kind="stable")
        main, dom = main[order], dom[order]
        cut = np.flatnonzero(np.diff(dom)) + 1
        chunks = []
        for seg_rows, seg_dom in zip(np.split(main, cut), np.split(dom, cut)):
            for a in range(0, seg_rows.size, rows_per_chunk):
                chunks.append((seg_rows[a:a + rows_per_chunk], int(seg_dom[0])))

        def work(chunk) -> None:
            rows, d = chunk
            lo, n = int(rows[0]), rows.size
            if int(rows[-1]) - lo + 1 == n and (n == 1 or bool(np.all(np.diff(rows) == 1))):
                sl = slice(lo, lo + n)  # contiguous rows: write straight into the output
                self._select_main((plan,), rid[sl], hist[sl], step[sl], q, d, out[None, sl])
            else:
                out[rows] = self._select_main((plan,), rid[rows], hist[rows], step[rows], q, d, None)[0]

        if self._threads > 1 and len(chunks) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="ulacache-traces")
            list(self._pool.map(work, chunks))
        else:
            for c in chunks:
                work(c)

    def _tables(self, plans: tuple[GroupPlan, ...], dom: int) -> dict[str, np.ndarray]:
        """Per-stratum geometry of some groups' strata on one domain, one row [1, k'] per group (their strata in
        output order: stable, recurring, fresh), so that one array operation covers every kind of every group
        (cached, pure in (groups, domain); the groups share k' and earliness).

        Stratum i covers [i*d/k', (i+1)*d/k') of the domain d (0-based in the middle region). Its candidate
        window is its first `cw` positions (cw fits each case below). A stratum whose window does not fit in the
        history is folded onto the upper half of its mirror stratum k'-1-i, which then keeps its lower half; the
        domain choice guarantees that the mirror lies wholly inside the history. So ranges are disjoint.
        Per column, the draw d of a step is turned into an offset as ((d >> sh1) * mult) >> sh2 (& mask): mult is
        0 for stable strata (their offset is the epoch's window offset alone), the candidate stride for recurring
        ones (d's top bits pick the candidate), and the stratum's length for fresh ones (`fresh`: filled in per row).
        """
        key = (tuple(p.group for p in plans), dom)
        tab = self._tables_cache.get(key)
        if tab is None:
            rows = [self._group_tables(p, dom) for p in plans]
            tab = {name: np.stack([r[name] for r in rows])[:, None, :] for name in rows[0]}
            if len(self._tables_cache) > 1024:
                self._tables_cache.clear()
            self._tables_cache[key] = tab
        return tab

    @staticmethod
    def _group_tables(plan: GroupPlan, dom: int) -> dict[str, np.ndarray]:
        """One group's row of `_tables`."""
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
        cands = _floor_pow2(np.maximum(np.minimum(np.concatenate([b.cands for b in blocks]), cw), 1))
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
                "sh1": u32(np.where(kind == 1, 32 - np.maximum(_log2(cands), 1), 16)),
                "sh2": u32(np.where(fresh, 15 if plan.early else 16, 0)),
                "mask": u32(np.where(fresh, 0xFFFFFFFE, 0xFFFFFFFF)),
                "start": i32(start), "mirror_cw": i32(mstart + cw_all[j]), "ln": i32(length),
                "fold_d": i32(mlen - mlen // 2 - length), "half_d": i32(length // 2 - length),
                "par": u32((i & 1) * fresh)}

    def _row_keys(self, plans: tuple[GroupPlan, ...], rid: np.ndarray) -> np.ndarray:
        """uint32[G, R, k'] per-(group, request, stratum) keys: the odd row key times each column key. Pure in
        (groups, request ids), and the same rows come back step after step: cached on the ids (read-only)."""
        key = (tuple(p.group for p in plans), rid.tobytes())
        t = self._row_cache.get(key)
        if t is None:
            keys = np.stack([np.concatenate([p.stable.key, p.recurring.key, p.fresh.key]) for p in plans])
            with np.errstate(over="ignore"):
                t = (row_keys32(self._seed_key, rid) | np.uint32(1))[None, :, None] * keys[:, None, :]
            t.setflags(write=False)
            self._row_cache_elems += t.size
            if self._row_cache_elems > _ROW_CACHE_ELEMS:
                self._row_cache.clear()
                self._row_cache_elems = t.size
            self._row_cache[key] = t
        return t

    def _select_main(self, plans: tuple[GroupPlan, ...], rid, hist, step, q: int, dom,
                     out: np.ndarray | None) -> np.ndarray:
        """The stratified path, int64[G, R, q, top_k] for groups sharing k' and earliness, every kind of stratum
        at once (see `_tables`). `dom`: the rows' strata domain, one int, or one per row for batches of at most
        `_ROW_TERMS_ROWS` rows (their history terms come per row from `_row_terms`). Hashes are odd-constant
        multiplies whose top bits are used (inputs are already mixed keys); every draw takes 16 top bits."""
        sp = self.spec
        plan = plans[0]
        r, k = rid.size, sp.top_k
        s, w = plan.num_sink, plan.num_recent
        kp = plan.num_strata
        if out is None:
            out = np.empty((len(plans), r, q, k), dtype=np.int64)
        if s:
            out[..., :s] = _arange(s)
        if w:
            out[..., k - w:] = (hist[:, None] + _recent_offsets(w))[None, :, None, :]
        step32 = step.astype(np.uint32)
        if r <= _ROW_TERMS_ROWS:
            tb, lo, mult = self._row_terms(plans, rid, hist, step, dom)
        else:
            tb = self._tables(plans, int(dom))
            lo, mult = _batch_terms(tb, (hist - s - w).astype(np.int32)[None, :, None], step32[None, :, None],
                                    plan.early)
        t = self._row_keys(plans, rid)
        u16 = np.uint32(16)
        # stable and recurring strata (each group's first columns): the candidate window's offset in this drift
        # epoch, added to the base position (fresh strata have none: their columns' offset would be 0)
        c = max(p.stable.index.size + p.recurring.index.size for p in plans)
        if c:
            ck = step32[None, :, None] + tb["phase"][..., :c]
            ck >>= np.uint32(int(sp.drift_steps).bit_length() - 1)
            ck *= np.uint32(0xC2B2AE35)
            ck ^= t[..., :c]
            ck *= np.uint32(0x9E3779B1)
            ck >>= u16
            ck *= tb["ck_mult"][..., :c]
            ck >>= u16
            lo[..., :c] += ck.view(np.int32)
        ts = t ^ _step_keys(step32)[None, :, None]
        if q == 1:  # query 0's draw: the two multiplies of ts and of d as one (the same bits mod 2**32)
            ts *= _TS_MIX32
            _draw(ts, tb, mult, plan.early)
            np.add(ts.view(np.int32), lo, out=out[:, :, 0, s:s + kp], casting="unsafe")
            return out
        ts *= np.uint32(0x846CA68B)
        # query tokens > 0 redraw where the top bits reach spec_share (query 0 never reads this)
        thr1 = np.uint32(max(int(round(sp.spec_share * 65536)) - 1, 0))
        diverge = thr1 - (ts >> u16)
        diverge >>= np.uint32(31)
        qkeys = _QKEYS[:q] if q <= _QKEYS.size else _qkeys(q)
        d = np.empty(ts.shape, np.uint32)
        for qi in range(q):
            if qi == 0:
                np.multiply(ts, MIX32, out=d)
            else:
                np.multiply(diverge, qkeys[qi], out=d)
                d ^= ts
                d *= MIX32
            _draw(d, tb, mult, plan.early)
            np.add(d.view(np.int32), lo, out=out[:, :, qi, s:s + kp], casting="unsafe")
        return out

    def _row_terms(self, plans: tuple[GroupPlan, ...], rid, hist, step, dom) -> tuple[dict, np.ndarray, np.ndarray]:
        """(tables, lo, mult) of `_select_main` for a few rows: lo (int32[G, R, k'], the caller's own), the draw's
        base position before the epoch's offset, and mult (uint32, read-only), the draw's multiplier, both after
        the step's parity in early groups. They depend on the history length only through comparisons that hold
        over intervals (`_hist_interval`), so they are kept per (groups, domain, request) for the interval and
        copied, only the strata cut at the end of the history redone; most decode steps compute none of them.
        Rows of several domains get their tables' domain-dependent columns per row."""
        plan = plans[0]
        gkey = tuple(p.group for p in plans)
        early = plan.early
        mid = plan.num_sink + plan.num_recent
        cache = self._hist_cache
        doms = dom if isinstance(dom, list) else dom.tolist() if isinstance(dom, np.ndarray) else [int(dom)] * rid.size
        tbs: dict[int, dict] = {}
        los, mults, fixes = [], [], []
        for i, (rq, h, st, d) in enumerate(zip(rid.tolist(), hist.tolist(), step.tolist(), doms)):
            tb = tbs.get(d)
            if tb is None:
                tb = tbs[d] = self._tables(plans, d)
            hm = h - mid
            key = (gkey, d, rq)
            e = cache.get(key)
            if e is None or not e[0] <= hm < e[1]:
                e = _hist_interval(tb, hm, early)
                self._hist_cache_elems += e[5]
                if self._hist_cache_elems > _HIST_CACHE_ELEMS:
                    cache.clear()
                    self._hist_cache_elems = e[5]
                cache[key] = e
            p = st & 1 if early else 0
            los.append(e[2][p])
            mults.append(e[3][p])
            if e[4]:
                fixes.append((i, hm, p, e[4]))
        if len(los) == 1:
            lo, mult = los[0].copy(), (mults[0].copy() if fixes else mults[0])
        else:
            lo, mult = np.concatenate(los, axis=1), np.concatenate(mults, axis=1)
        for i, hm, p, cuts in fixes:  # strata cut at the end of the history: their length follows it
            for g, col, start, lo0, par0, fresh in cuts:
                ln = hm - start
                if early:  # fresh picks alternate position parity (as in `_batch_terms`)
                    par = (par0 ^ p) if fresh and ln > 1 else 0
                    lo[g, i, col] = lo0 + par
                    ln = (ln - par + 1) >> 1
                if fresh:
                    mult[g, i, col] = ln
        if len(tbs) > 1:  # several domains: the per-step columns that depend on the domain, per row
            tb = dict(tb)
            for name in ("ck_mult", "sh1"):
                tb[name] = np.concatenate([tbs[d][name] for d in doms], axis=1)
        return tb, lo, mult

    def _select_dense(self, plan: GroupPlan, rid, hist, step, q: int) -> np.ndarray:
        """Histories of top_k..~2 top_k: score every position with a hash (sink and recent forced in), take top-k.

        Fresh draws every step, so these short histories carry no designed overlap (random sets of k out of
        fewer than 2k positions overlap by more than half anyway).
        """
        k = self.top_k
        hmax = int(hist.max())
        pos = np.arange(hmax, dtype=np.int64)
        rowkey = row_keys32(self._seed_key ^ (plan.group + 1) * 0x9E3779B97F4A7C15 % (1 << 64), rid)
        with np.errstate(over="ignore"):
            key = mix32(rowkey[:, None] ^ mix32(step.astype(np.uint32) * GOLDEN32)[:, None]
                        ^ mix32(np.arange(q, dtype=np.uint32) + np.uint32(0x3C6EF372))[None, :])  # [R, Q]
            score = mix32(pos.astype(np.uint32)[None, None, :] * GOLDEN32 ^ key[:, :, None]).astype(np.int64) + 1
        h = hist[:, None, None]
        score[np.broadcast_to(pos >= h, score.shape)] = 0
        forced = (pos < plan.num_sink) | ((pos >= h - plan.num_recent) & (pos < h))
        score[np.broadcast_to(forced, score.shape)] = 1 << 40
        return np.argpartition(-score, k - 1, axis=-1)[..., :k].astype(np.int64)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def describe(self) -> dict:
        """Per-group solved mixtures (for inspect and reports)."""
        return {g: {"target_overlap": p.target_overlap, "stable": p.frac_stable, "recurring": p.frac_recurring,
                    "fresh": p.frac_fresh, "early": p.early}
                for g in range(self.num_groups) for p in [self.plan(g)]}


def _batch_terms(tb: dict, hcol: np.ndarray, scol: np.ndarray, early: bool) -> tuple[np.ndarray, np.ndarray]:
    """(lo, mult) of `_select_main` computed for a batch of rows (one domain) from their middle lengths `hcol`
    and steps `scol`: `_hist_terms_of`, then in early groups the step's parity (fresh picks alternate position
    parity from step to step: a stratum of length ln > 1 draws from its positions of one parity), then the
    draw's multiplier: a fresh stratum's length, else the table's."""
    lo, ln = _hist_terms_of(tb, hcol)
    if early:
        par = (tb["par"] ^ (scol & np.uint32(1))) * (ln > 1)
        par &= tb["fresh"]
        lo += par.view(np.int32)
        ln -= par.view(np.int32)
        ln += 1
        ln >>= 1
    return lo, np.where(tb["fresh"], ln.view(np.uint32), tb["mult"])


def _draw(d: np.ndarray, tb: dict, mult: np.ndarray, early: bool) -> None:
    """A query's mixed bits `d` -> each stratum's offset from its base position, in place: ((d >> sh1) * mult)
    >> sh2 (& mask)."""
    d >>= tb["sh1"]
    d *= mult
    d >>= tb["sh2"]
    if early:
        d &= tb["mask"]


def _hist_terms_of(tb: dict, hcol: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _hist_interval(tb: dict, h: int, early: bool) -> tuple:
    """(a, b, lo, mult, cuts, size) for one row at middle length h: `_batch_terms` there for either parity of the
    step (lo[p], mult[p]: read-only; the same arrays for both outside early groups) and the lengths [a, b) over
    which they stay the same except in the strata cut at the end of the history, whose length is h - start:
    `cuts`, one (group row, column, start, lo without parity, parity bit, fresh) per cut stratum (Python ints).
    Every comparison behind lo and ln is `length < threshold` (a fold: start_cw; a mirror's half: mirror_cw; a
    cut: start + its uncut length, where not folded), so it holds between consecutive thresholds. `size`: the
    elements kept."""
    hcol = np.full((1, 1, 1), h, dtype=np.int32)
    lo, ln = _hist_terms_of(tb, hcol)
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
        los, mults = (list(x) for x in zip(*(_batch_terms(tb, hcol, np.uint32(p), True) for p in (0, 1))))
    else:
        los = [lo] * 2
        mults = [np.where(tb["fresh"], ln.view(np.uint32), tb["mult"])] * 2
    for x in los + mults:
        x.setflags(write=False)
    return a, b, los, mults, cuts, lo.size * (4 if early else 2)


def _domain(hm: int, kp: int) -> int:
    """`_domains` of one row (hm >= 1), in Python integers."""
    return 1 << (((hm * (2 * kp)) // (kp + 4)).bit_length() - 1)


def _domains(hm: np.ndarray, kp: int) -> np.ndarray:
    """Per row the strata domain: the largest power of two d with d/2 + 2d/k' <= hm (hm = middle length).

    It only changes when the history crosses such a bound, so strata stay put while a history grows.
    """
    x = (hm.astype(np.int64) * (2 * kp)) // (kp + 4)
    if x.size <= 8 and x.min() >= 1:  # a few rows: the same powers of two from Python integers
        return np.array([1 << (v.bit_length() - 1) for v in x.tolist()], dtype=np.int64)
    dom = np.left_shift(np.int64(1), np.floor(np.log2(x.astype(np.float64))).astype(np.int64))
    return np.where(dom * 2 <= x, dom * 2, np.where(dom > x, dom // 2, dom))  # guard float rounding


def _step_keys(step32: np.ndarray) -> np.ndarray:
    """mix32(step * GOLDEN32 ^ 0x51E9) per row (uint32): in Python integers for a few rows (a handful of numpy
    calls on one element cost more than the arithmetic), the same bits."""
    if step32.size > 8:
        with np.errstate(over="ignore"):
            return mix32(step32 * GOLDEN32 ^ np.uint32(0x51E9))
    return np.array([_mix32_int(((int(x) * 0x9E3779B1) & 0xFFFFFFFF) ^ 0x51E9) for x in step32.tolist()],
                    dtype=np.uint32)


def _mix32_int(x: int) -> int:
    """hashing.mix32 of one uint32 value as a Python int (wrapping 32-bit products)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


_RECENT: dict[int, np.ndarray] = {}
_ARANGE: dict[int, np.ndarray] = {}


def _arange(n: int) -> np.ndarray:
    """0 .. n-1 (int64, read-only, cached): the sink positions."""
    a = _ARANGE.get(n)
    if a is None:
        a = _ARANGE[n] = np.arange(n, dtype=np.int64)
        a.setflags(write=False)
    return a


def _recent_offsets(w: int) -> np.ndarray:
    """-w .. -1 (int64, read-only, cached): the recent window's positions relative to the history length."""
    a = _RECENT.get(w)
    if a is None:
        a = _RECENT[w] = np.arange(-w, 0, dtype=np.int64)
        a.setflags(write=False)
    return a


def _qkeys(q: int) -> np.ndarray:
    """Per query-token keys (query 0's key is only used where a token diverges, never for token 0 itself)."""
    with np.errstate(over="ignore"):
        return mix32(np.arange(q, dtype=np.uint32) * np.uint32(0x27D4EB2F) ^ np.uint32(0x0A11))


_QKEYS = _qkeys(16)


def _floor_pow2(x: np.ndarray) -> np.ndarray:
    """Largest power of two <= x (x >= 1), elementwise."""
    return np.left_shift(1, _log2(x)).astype(np.int64)


def _log2(x: np.ndarray) -> np.ndarray:
    """floor(log2(x)) for integers x >= 1 (exact for x < 2**52)."""
    return np.frexp(np.asarray(x, np.float64))[1].astype(np.int64) - 1


def _check_select_args(request_ids, history_lens, steps, num_query_tokens):
    try:
        rid = np.asarray(request_ids).astype(np.int64, casting="safe", copy=False).ravel()  # read, never written
        hist = np.asarray(history_lens).astype(np.int64, casting="safe", copy=False).ravel()
        step = np.asarray(steps).astype(np.int64, casting="safe", copy=False).ravel()
    except TypeError as exc:
        raise TraceError(f"select: request_ids, history_lens and steps must be integer arrays ({exc})") from None
    if not (rid.size == hist.size == step.size):
        raise TraceError(f"select: request_ids, history_lens and steps differ in length "
                         f"({rid.size}, {hist.size}, {step.size})")
    if hist.size and ((min(hist.tolist()) < 0 or min(step.tolist()) < 0) if hist.size <= 8
                      else (hist.min() < 0 or step.min() < 0)):
        raise TraceError("select: history_lens and steps must be >= 0")
    if isinstance(num_query_tokens, bool) or not isinstance(num_query_tokens, (int, np.integer)) \
            or num_query_tokens < 1:
        raise TraceError(f"select: num_query_tokens must be a positive integer, got {num_query_tokens!r}")
    return rid, hist, step, int(num_query_tokens)
