"""SyntheticSelections: the synthetic generator as a SelectionSource (`select`, `select_groups`), with the caches
that make a decode step cheap: group plans, strata tables per domain, per-request row keys and per-request
history-length terms (see traces.synthetic for the model)."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from traces.errors import TraceError
from traces.hashing import GOLDEN32, MIX32, mix32, row_keys32
from traces.synthetic.draws import QKEYS, TS_MIX32, arange, draw, qkeys, recent_offsets, step_keys
from traces.synthetic.geometry import batch_terms, domain, domains, group_tables, hist_interval
from traces.synthetic.plan import GroupPlan, make_plan, seed_key
from traces.synthetic.spec import MAX_HISTORY_TOKENS, SelectionSpec

_CHUNK_ELEMS = 1 << 19  # per-element work is done in row chunks of about this many outputs (cache-sized)
_ROW_CACHE_ELEMS = 1 << 22  # per-(request, stratum) keys kept for the next steps (16 MiB)
_ROW_TERMS_ROWS = 32  # batches of up to this many rows keep their history-length terms per row (`_row_terms`)
_HIST_CACHE_ELEMS = 1 << 22  # elements of those terms kept (16 MiB)


class SyntheticSelections:
    """SelectionSource of synthetic top-k selections (the model: traces.synthetic's docstring).

    `select(...)` is pure in (seed, request_id, step, group, query index, history_len); plans per group are cached.
    """

    kind = "synthetic"
    draws_on = "host"  # (DeviceSelections: "device")
    positions_checked = True  # every selected position is in [-1, history_len) by construction (no scan needed)

    def __init__(self, spec: SelectionSpec | dict | None = None, seed: int = 0, num_threads: int | None = None):
        if spec is None or isinstance(spec, dict):
            spec = SelectionSpec.from_dict(spec)
        else:
            spec.validate()
        self.spec = spec
        self.seed = int(seed)
        self.num_groups = int(spec.num_groups)
        self.top_k = int(spec.top_k)
        self._seed_key = seed_key(self.seed)
        self._plans: dict[int, GroupPlan] = {}
        self._tables_cache: dict[tuple[tuple[int, ...], int], dict[str, np.ndarray]] = {}
        self._row_cache: dict[tuple[tuple[int, ...], bytes], np.ndarray] = {}  # (groups, request ids) -> `_row_keys`
        self._hist_cache: dict[tuple[tuple[int, ...], int, int], tuple] = {}  # (groups, domain, request) -> `hist_interval`
        self._row_cache_elems = 0
        self._hist_cache_elems = 0
        # one thread unless asked: on the 2-core box a second thread made large batches slower (wall and CPU +13-17%,
        # bench/results/selection_threads.json), and replays of <= 32 rows never chunk
        self._threads = max(1, int(num_threads if num_threads is not None else 1))
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ group plans
    def plan(self, group: int) -> GroupPlan:
        """The group's solved mixture and per-stratum constants (cached)."""
        g = self._check_group(group)
        if g not in self._plans:
            self._plans[g] = make_plan(self.spec, self.seed, g)
        return self._plans[g]

    def _check_group(self, group) -> int:
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)):
            raise TraceError(f"group must be an integer, got {group!r}")
        if not 0 <= int(group) < self.num_groups:
            raise TraceError(f"group {int(group)} out of range [0, {self.num_groups})")
        return int(group)

    # ------------------------------------------------------------------ selection
    def select(self, request_ids, history_lens, steps, group: int, num_query_tokens: int) -> np.ndarray:
        """int64[R, num_query_tokens, top_k] history positions in [0, history_len); -1 pads short histories."""
        rid, hist, step, q = check_select_args(request_ids, history_lens, steps, num_query_tokens)
        plan = self.plan(group)
        k = self.top_k
        out = np.empty((rid.size, q, k), dtype=np.int64)
        if rid.size == 0:
            return out
        if int(hist.max()) > MAX_HISTORY_TOKENS:
            raise TraceError(f"history_len {int(hist.max())} exceeds the generator's limit {MAX_HISTORY_TOKENS}")
        short = hist <= k
        kp = plan.num_strata
        dom = domains(np.maximum(hist - plan.num_sink - plan.num_recent, 1), kp)
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
        rid, hist, step, q = check_select_args(request_ids, history_lens, steps, num_query_tokens)
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
                dom = [domain(h - mid, kp) for h in hl]
                lo_dom, hi_dom = min(dom), max(dom)
            else:
                dom = domains(hist - mid, kp)
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
            rows = [group_tables(p, dom) for p in plans]
            tab = {name: np.stack([r[name] for r in rows])[:, None, :] for name in rows[0]}
            if len(self._tables_cache) > 1024:
                self._tables_cache.clear()
            self._tables_cache[key] = tab
        return tab

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
        plan = plans[0]
        r, k = rid.size, self.spec.top_k
        s, w = plan.num_sink, plan.num_recent
        if out is None:
            out = np.empty((len(plans), r, q, k), dtype=np.int64)
        if s:
            out[..., :s] = arange(s)
        if w:
            out[..., k - w:] = (hist[:, None] + recent_offsets(w))[None, :, None, :]
        step32 = step.astype(np.uint32)
        if r <= _ROW_TERMS_ROWS:
            tb, lo, mult = self._row_terms(plans, rid, hist, step, dom)
        else:
            tb = self._tables(plans, int(dom))
            lo, mult = batch_terms(tb, (hist - s - w).astype(np.int32)[None, :, None], step32[None, :, None],
                                    plan.early)
        t = self._row_keys(plans, rid)
        self._add_window_offsets(plans, tb, t, step32, lo)
        ts = t ^ step_keys(step32)[None, :, None]
        if q == 1:  # query 0's draw: the two multiplies of ts and of d as one (the same bits mod 2**32)
            ts *= TS_MIX32
            draw(ts, tb, mult, plan.early)
            lo += ts.view(np.int32)  # (int32 arithmetic, then widened: cheaper than one add into the int64 slice)
            out[:, :, 0, s:s + plan.num_strata] = lo
            return out
        self._draw_tokens(plan, ts, tb, mult, lo, q, out)
        return out

    def _add_window_offsets(self, plans: tuple[GroupPlan, ...], tb: dict, t, step32, lo) -> None:
        """Stable and recurring strata (each group's first columns): add the candidate window's offset in this
        drift epoch to the base position in `lo` (fresh strata have none: their columns' offset would be 0)."""
        c = max(p.stable.index.size + p.recurring.index.size for p in plans)
        if not c:
            return
        u16 = np.uint32(16)
        ck = step32[None, :, None] + tb["phase"][..., :c]
        ck >>= np.uint32(int(self.spec.drift_steps).bit_length() - 1)
        ck *= np.uint32(0xC2B2AE35)
        ck ^= t[..., :c]
        ck *= np.uint32(0x9E3779B1)
        ck >>= u16
        ck *= tb["ck_mult"][..., :c]
        ck >>= u16
        lo[..., :c] += ck.view(np.int32)

    def _draw_tokens(self, plan: GroupPlan, ts, tb: dict, mult, lo, q: int, out: np.ndarray) -> None:
        """The strata columns of every query token (q > 1) into `out`: query 0's draw, and tokens > 0 redraw where
        the top bits of `ts` reach spec_share (the rest select as query 0)."""
        s, kp = plan.num_sink, plan.num_strata
        u16 = np.uint32(16)
        ts *= np.uint32(0x846CA68B)
        thr1 = np.uint32(max(int(round(self.spec.spec_share * 65536)) - 1, 0))
        diverge = thr1 - (ts >> u16)
        diverge >>= np.uint32(31)
        keys_q = QKEYS[:q] if q <= QKEYS.size else qkeys(q)
        d = np.empty(ts.shape, np.uint32)
        for qi in range(q):
            if qi == 0:
                np.multiply(ts, MIX32, out=d)
            else:
                np.multiply(diverge, keys_q[qi], out=d)
                d ^= ts
                d *= MIX32
            draw(d, tb, mult, plan.early)
            di = d.view(np.int32)
            di += lo  # (int32 arithmetic as above; d is rewritten for the next token)
            out[:, :, qi, s:s + kp] = di

    def _row_terms(self, plans: tuple[GroupPlan, ...], rid, hist, step, dom) -> tuple[dict, np.ndarray, np.ndarray]:
        """(tables, lo, mult) of `_select_main` for a few rows: lo (int32[G, R, k'], the caller's own), the draw's
        base position before the epoch's offset, and mult (uint32, read-only), the draw's multiplier, both after
        the step's parity in early groups. They depend on the history length only through comparisons that hold
        over intervals (`hist_interval`), so they are kept per (groups, domain, request) for the interval and
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
                e = hist_interval(tb, hm, early)
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
                if early:  # fresh picks alternate position parity (as in `batch_terms`)
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


def check_select_args(request_ids, history_lens, steps, num_query_tokens):
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
