"""The replay engine: continuous batching with admission control, decode steps timed on the simpy node, metrics.

Decode-only (PD-disaggregated decode node): a request arrives with its prompt's KV and is admitted when its whole
history + growth (input + output tokens) fits the system's capacity (`sim/systems.py`). Each step every running
request verifies `q` tokens (q = spec.draft_tokens, or 1 without speculative decoding) and keeps an accepted length
drawn from the configured distribution.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from sim.costs import CostModel
from sim.events import TraceRecorder
from sim.hardware import Node, make_env
from sim.policy import PolicyRunner
from sim.prefill import make_prefill
from sim.systems import System
from sim.timing import PARTS, GroupOrder, GroupWork, StepTimer


def accept_distribution(spec) -> np.ndarray:
    """P(accepted = 1..q): explicit `accept_probs`, else 1 + Binomial(q - 1, p) with mean `accept_mean`
    (default 1 + 2/3 (q - 1): 3.0 for the recipes' 4 verify tokens, docs/architecture.md's 2.2-3.5 range)."""
    q = max(1, spec.draft_tokens)
    if spec.accept_probs is not None:
        return np.asarray(spec.accept_probs, dtype=float)
    if q == 1:
        return np.ones(1)
    from math import comb

    mean = spec.accept_mean if spec.accept_mean is not None else 1.0 + (q - 1) * 2.0 / 3.0
    p = (mean - 1.0) / (q - 1)
    return np.array([comb(q - 1, j) * p ** j * (1 - p) ** (q - 1 - j) for j in range(q)])


@dataclass
class RunState:
    steps: int = 0
    tokens: float = 0.0
    busy_s: float = 0.0
    hits: float = 0.0
    unique: float = 0.0
    refs: float = 0.0
    h2d_bytes: float = 0.0
    d2h_bytes: float = 0.0
    peer_bytes: float = 0.0
    allgather_bytes: float = 0.0
    collective_bytes: float = 0.0
    max_concurrency: int = 0
    concurrency_sum: float = 0.0
    peak: dict = field(default_factory=dict)
    timeline: list = field(default_factory=list)
    rejected: int = 0
    first_finish_step: int | None = None  # the first step a request completed in (the first refill follows it)


def _num_passes(rt: dict | None) -> int:
    """Sub-batches a group's access batch was served in (1 without a policy)."""
    return max(1, round(rt.get("passes", 1.0))) if rt else 1


def _ranks_of(values, n: int) -> np.ndarray:
    """Per-rank float64[n] of a ratio (a replicated cache's single value repeated)."""
    x = np.asarray(values, float)
    return x if x.size == n and x.ndim == 1 else np.resize(x, n)


_add_reduce = np.add.reduce  # ndarray.sum's reduction without the method's dispatch
_F9 = struct.Struct("9d")  # `_links`' memo key: its nine inputs' exact float64 bits
NO_LINKS = {"mgmt_s": 0.0, "h2d_bytes": 0.0, "d2h_bytes": 0.0, "peer_bytes": 0.0, "peer_after_h2d_bytes": 0.0,
            "h2d_replay_bytes": None}


@dataclass(frozen=True)
class Batch:
    """The running batch of one step: requests, histories, references (q x min(history, top_k) each), per rank."""

    run: np.ndarray
    hist: np.ndarray
    refs_req: np.ndarray
    n_total: int
    tokens_total: int
    ref_rank: np.ndarray
    hist_rank: np.ndarray
    n_rank: np.ndarray


class Engine:
    def __init__(self, cfg, costs: CostModel, system: System, requests, source, recorder: TraceRecorder | None,
                 make_cache=None, policy_processes: int = 1, ratio_log=None, ratio_player=None):
        """`policy_processes`: processes the simulated groups' policy runs in (sim/group_workers.py); the metrics
        are the same for any number. `ratio_log` records the policy's ratios, `ratio_player` stands in for the
        policy with recorded ones (sim/ratio_replay.py)."""
        self.cfg, self.costs, self.system, self.source = cfg, costs, system, source
        arrival, rid = np.asarray(requests["arrival_s"], dtype=float), np.asarray(requests["request_id"], np.int64)
        order = np.lexsort((rid, arrival))  # by (arrival, request id): a DataFrame's stable sort_values order
        self.rid = rid[order]
        self.arrival = arrival[order]
        self.inp = np.asarray(requests["input_tokens"], np.int64)[order]
        self.out = np.asarray(requests["output_tokens"], np.int64)[order]
        self.n_req = len(order)
        self.q = cfg.query_tokens
        self.hist = self.inp.copy()
        self.generated = np.zeros(self.n_req, np.int64)
        self.dsteps = np.zeros(self.n_req, np.int64)
        self.space = np.full(self.n_req, -1, np.int64)
        self.admit_s = np.full(self.n_req, np.nan)
        self.finish_s = np.full(self.n_req, np.nan)
        self.rng = np.random.default_rng(cfg.workload.seed + 7919)
        self.accept_p = accept_distribution(cfg.spec)
        # accepted lengths are drawn as Generator.choice(1..q, p=accept_p) draws them (cdf, uniforms, searchsorted):
        # the same numbers from the same stream, without its per-call checks (made once here)
        np.random.default_rng(0).choice(len(self.accept_p), p=self.accept_p)
        self.accept_len = np.arange(1, len(self.accept_p) + 1)
        self.accept_cdf = self.accept_p.cumsum()
        self.accept_cdf /= self.accept_cdf[-1]
        cap = system.capacity
        self.used_tokens = np.zeros(cap.num_spaces)
        self.running_per_space = np.zeros(cap.num_spaces, np.int64)
        self.reserved = np.zeros(cap.num_spaces)  # working-set / device-buffer slots reserved per space
        self.env = make_env()
        self.recorder = recorder
        self.node = Node(self.env, cfg.num_gpus, costs, recorder)
        self.timer = StepTimer(self.env, self.node, recorder)
        self.runner = ratio_player
        if ratio_player is None and system.uses_policy and make_cache is not None:
            max_len = int((self.inp + self.out).max()) + self.q + 1
            self.runner = PolicyRunner(cfg, system, source, max_len, make_cache, policy_processes)
            if ratio_log is not None:
                self.runner = ratio_log.recording(self.runner)
        self.group_layers = np.asarray(cfg.model.group_sizes(), dtype=float)
        self.state = RunState()
        self._saturated = False
        self.prefill = make_prefill(cfg, costs, system, self)  # untimed | chunked (sim/prefill.py)
        self._keys = None  # (group map bytes, (distinct (representative, layers), index per group)): _group_keys
        self._orders: dict[tuple, GroupOrder] = {}  # (group map bytes, passes per distinct group) -> _order
        self._reps = (None, [], None)  # (group map bytes, simulated representatives, index of each group's)
        self._links_memo: dict[bytes, dict] = {}  # _links' inputs (exact bits) -> its result
        self._net_bytes: dict = {}  # tokens of a step -> (all-gather, layer-collective) link bytes it adds
        self._per_tokens: dict = {}  # tokens of a (sub-)batch -> the rank-independent parts of `_shared_work`
        self._terms = self._layer_col = None  # _account's per-group terms buffer (row 0 stays 0) and layer weights
        self._per_rep = None  # _account's per-representative buffer
        self._unit = np.eye(cfg.num_gpus)  # row r: 1.0 at rank r (`_batch` of one request under DP)
        self._work_memo: dict[tuple, list[GroupWork]] = {}  # `_ranks_work`: a rank's inputs -> its work, across steps

    # ------------------------------------------------------------------ admission
    def _need(self, i: int) -> float:
        return self.system.need_slots(int(self.inp[i]), int(self.out[i]))

    def _reserve(self, i: int) -> float:
        """Slots request i reserves in the GPU pool / buffers (the system's rule)."""
        return self.system.reserve_slots(self._need(i))

    def _fits_empty(self, i: int) -> bool:
        cap = self.system.capacity
        r = self._reserve(i)
        return (self._need(i) <= cap.logical_tokens_per_space and r <= cap.reserve_capacity_per_space
                and r <= cap.buffer_reserve_capacity_per_space and cap.max_requests_per_space >= 1)

    def _space_for(self, i: int) -> int | None:
        cap = self.system.capacity
        need, r = self._need(i), self._reserve(i)
        n1 = self.running_per_space + 1
        res = self.reserved + r
        ok = ((self.used_tokens + need <= cap.logical_tokens_per_space * (1 + 1e-12))
              & (res <= cap.reserve_capacity_per_space) & (res <= cap.buffer_reserve_capacity_per_space)
              & (n1 <= cap.max_requests_per_space))
        if not ok.any():
            return None
        free = np.where(ok, cap.logical_tokens_per_space - self.used_tokens, -np.inf)
        return int(np.argmax(free))

    def _admit(self, waiting: list[int], running: list[int]):
        cap = self.system.capacity
        limit = self.cfg.workload.max_concurrency
        while waiting and len(running) < limit:
            i = waiting[0]
            s = self._space_for(i)
            if s is None:
                break  # FCFS: the head waits for room
            waiting.pop(0)
            self.space[i] = s
            self.used_tokens[s] += self._need(i)
            self.running_per_space[s] += 1
            self.reserved[s] += self._reserve(i)
            self.admit_s[i] = self.env.now
            running.append(i)
            if self.runner is not None:
                rank = s if cap.num_spaces > 1 else 0
                self.runner.admit(int(self.rid[i]), s, rank, int(self.inp[i]), int(self.running_per_space[s]))
            self.prefill.admit(i, s)

    def _release(self, i: int):
        s = self.space[i]
        self.used_tokens[s] -= self._need(i)
        self.running_per_space[s] -= 1
        self.reserved[s] -= self._reserve(i)
        if self.runner is not None:
            self.runner.release(int(self.rid[i]))

    # ------------------------------------------------------------------ main loop
    def close(self, failed: bool = False) -> None:
        """End the policy's group workers (at once when the run `failed`)."""
        if self.runner is not None:
            (self.runner.kill if failed else self.runner.close)()

    def run(self, progress=None, on_step=None) -> RunState:
        """Simulate to the end (or workload.max_steps); after each decode step `progress(done, requests)` and
        `on_step(the step's timeline record)` where given."""
        st, cfg = self.state, self.cfg
        waiting: list[int] = []
        running: list[int] = []
        nxt = 0
        done = 0
        max_steps = cfg.workload.max_steps
        trace_steps = cfg.output.trace_event_steps
        while True:
            while nxt < self.n_req and self.arrival[nxt] <= self.env.now + 1e-12:
                if self._fits_empty(nxt):
                    waiting.append(nxt)
                else:
                    st.rejected += 1
                    done += 1
                nxt += 1
            self._admit(waiting, running)
            if not running:
                if nxt < self.n_req:
                    self.env.run(until=self.arrival[nxt])
                    continue
                break
            if max_steps and st.steps >= max_steps:
                break
            if self.recorder is not None:
                self.recorder.enabled = st.steps < trace_steps
            self._saturated = bool(waiting)  # a request waits for room: every freed slot is refilled at once
            decoding = self.prefill.decoding(running)  # chunked prefill: those whose prompt is done
            if not decoding:  # only prompts being computed this step
                st.busy_s += self.prefill.idle()
                continue
            finished = self._step(decoding)
            for i in finished:
                running.remove(i)
                self._release(i)
                done += 1
            if progress is not None:
                progress(done, self.n_req)
            if on_step is not None:
                on_step(st.timeline[-1])
        return st

    # ------------------------------------------------------------------ one decode step
    def _step(self, running: list[int]) -> list[int]:
        """One decode step: the batch's shape, the policy's ratios, each rank's group work, timed on the node."""
        b = self._batch(np.asarray(running, dtype=np.int64))
        tracing = self.recorder is not None and self.recorder.enabled
        ratios = self._policy_ratios(b)
        rows, sim_ranks = self._link_rows(b, ratios, tracing)
        shared = self._shared_work(b)
        order = self._order(ratios)
        work = self._ranks_work(b, sim_ranks, ratios, rows, shared)
        epilogue = self._epilogue(b, sim_ranks)
        t_start = self.env.now
        step_s, parts = self.timer.run(work, sim_ranks, epilogue, dedup=not tracing, order=order)
        acc, fin = self._advance(b.run)
        self._account(b, ratios, rows, acc, step_s, parts, t_start, fin.size)
        return fin.tolist()

    def _batch(self, run: np.ndarray) -> Batch:
        """References, history and requests of the running batch, per rank (TP: every rank sees all of them)."""
        m, n_gpu, q = self.cfg.model, self.cfg.num_gpus, self.q
        hist = self.hist[run]
        n_total = len(run)
        tp = self.system.tp
        if n_total == 1 and (tp or 0 <= self.space[run[0]] < n_gpu):  # batch size 1: the same values from Python
            h = int(hist[0])  # numbers (a few numpy calls fewer per step)
            refs = float(q * min(h, m.top_k))
            if tp:
                ref_rank, hist_rank, n_rank = np.full(n_gpu, refs), np.full(n_gpu, float(h)), np.full(n_gpu, 1.0)
            else:  # bincount's one-request sums (0.0 + x), as products of its rank's unit row (1.0 * x, 0.0 * x)
                unit = self._unit[int(self.space[run[0]])]
                ref_rank, hist_rank, n_rank = unit * refs, unit * float(h), unit.copy()
            return Batch(run, hist, np.array([refs]), 1, q, ref_rank, hist_rank, n_rank)
        refs_req = q * np.minimum(hist, m.top_k).astype(float)
        if self.system.tp:
            ref_rank = np.full(n_gpu, refs_req.sum())
            hist_rank = np.full(n_gpu, float(hist.sum()))
            n_rank = np.full(n_gpu, float(n_total))
        else:
            sp = self.space[run]
            ref_rank = np.bincount(sp, weights=refs_req, minlength=n_gpu)
            hist_rank = np.bincount(sp, weights=hist.astype(float), minlength=n_gpu)
            n_rank = np.bincount(sp, minlength=n_gpu).astype(float)
        return Batch(run, hist, refs_req, n_total, n_total * q, ref_rank, hist_rank, n_rank)

    def _policy_ratios(self, b: Batch) -> dict | None:
        """Per-reference ratios of each simulated group (the library's policy), or None (GPU-resident system)."""
        if self.runner is None:
            return None
        if not self.runner.due(self.state.steps):
            return self.runner.last
        spaces = ranks = None  # (read only where a pilot ends: its re-admission)
        if self.runner.pilot_left:
            spaces = self.space[b.run]
            ranks = spaces if self.system.capacity.num_spaces > 1 else np.zeros_like(spaces)
        return self.runner.run_step(self.rid[b.run].tolist(), b.hist, self.dsteps[b.run], self.q, spaces, ranks)

    def _link_rows(self, b: Batch, ratios, tracing: bool) -> tuple[dict, list[int]]:
        """(h2d, d2h, peer) rows per rank of one layer, per simulated group (float64[3, ranks] each: one product
        of the policy's `links` ratios); and the ranks worth timing."""
        sysm, n_gpu = self.system, self.cfg.num_gpus
        sim_ranks = [0] if sysm.symmetric_ranks else list(range(n_gpu))
        rows = {}
        if not ratios:
            return rows, sim_ranks
        for rep in self._simulated_reps()[0]:
            rt = ratios[rep]
            links = rt.get("links")
            if links is not None and links.shape == (3, n_gpu):
                rows[rep] = links * b.ref_rank
            else:
                rows[rep] = np.array([_ranks_of(rt[k], n_gpu) * b.ref_rank for k in ("h2d", "d2h", "peer")])
        if sysm.tp and not sysm.symmetric_ranks and not tracing:
            # TP ranks compute the same; a group ends with the slowest rank, and a rank's time grows with each of
            # its concurrent link volumes: the ranks with the most of some link's rows are the only candidates
            sim_ranks = sorted({r for x in rows.values() for r in x.argmax(axis=1).tolist()})
        return rows, sim_ranks

    def _ranks_work(self, b: Batch, sim_ranks: list[int], ratios, rows: dict, shared: dict) -> list[list[GroupWork]]:
        """Each simulated rank's distinct group work (`_rank_work`). Ranks whose inputs are equal (under DP the idle
        ranks of a small batch) share one list: the same objects, so the timer compares them once."""
        n = len(sim_ranks)
        tp = self.system.tp
        # per step: each simulated group's link rows and (TP) its rank-0 h2d total as Python floats (`_links`),
        # and the batch's per-rank scalars
        shared["row_vals"] = {rep: (x.tolist(), float(x[0].sum()) if tp else 0.0) for rep, x in rows.items()}
        shared["n_rank"], shared["ref_rank"] = b.n_rank.tolist(), b.ref_rank.tolist()
        if n == 1:
            return [self._rank_work(b, sim_ranks[0], ratios, rows, shared)]
        cols = [shared["keys"], shared["n_rank"], shared["ref_rank"]]  # everything rank-dependent it reads
        cols += [x for vals, _ in shared["row_vals"].values() for x in vals]
        pack = struct.Struct(f"{len(cols)}d").pack  # their exact float64 bits (as the arrays' bytes were)
        seen: dict[bytes, list[GroupWork]] = {}
        out = []
        step_key = self._work_step_key(b, ratios, shared)
        memo = self._work_memo
        if step_key is not None:  # per simulated group, what `_links` reads of its ratios: scaled by the rank's refs
            scaled = [x for rt in step_key[3] for x in (rt["unique"], rt["misses"])]
            pack_scaled = struct.Struct(f"{len(scaled)}d").pack  # (exact bits, as `_links`' key)
            step_key = step_key[:3]
        for r in sim_ranks:
            key = pack(*[c[r] for c in cols])
            work = seen.get(key)
            if work is None:
                if step_key is None:
                    work = self._rank_work(b, r, ratios, rows, shared)
                else:  # the same inputs as an earlier step's rank (DP: the idle ranks, step after step)
                    ref = shared["ref_rank"][r]
                    mkey = (step_key, key, pack_scaled(*[x * ref for x in scaled]))
                    work = memo.get(mkey)
                    if work is None:
                        if len(memo) >= 4096:
                            memo.clear()
                        work = memo[mkey] = self._rank_work(b, r, ratios, rows, shared)
                seen[key] = work
            out.append(work)
        return out

    def _work_step_key(self, b: Batch, ratios, shared: dict) -> tuple | None:
        """What `_rank_work` reads besides a rank's own columns and its groups' scaled ratios, when every group ran
        in one pass: (the step's token count (`_shared_work`'s per-token parts), the group map (`_group_keys`),
        each simulated group's TP home h2d total, the groups' ratios); None when some group ran several passes."""
        self._group_keys(ratios)
        if not ratios:
            return (b.tokens_total, self._keys[0], (), ())
        rts = [ratios[rep] for rep in self._simulated_reps()[0]]
        if any(_num_passes(rt) != 1 for rt in rts):
            return None
        homes = tuple([v[1] for v in shared["row_vals"].values()])
        return (b.tokens_total, self._keys[0], homes, rts)

    def _rank_work(self, b: Batch, r: int, ratios, rows: dict, shared: dict) -> list[GroupWork]:
        """Rank r's work for each distinct indexer group (`_group_keys`), one item per pass (`_order` says which
        groups run which item); groups sharing a simulated representative share their work."""
        common = self._compute(b, r, shared)
        by_rep: dict[int, list] = {}
        distinct, _ = self._group_keys(ratios)
        made = []
        for rep, layers in distinct:
            passes = by_rep.get(rep)
            if passes is None:
                passes = by_rep[rep] = self._passes(b, r, ratios[rep] if ratios else None, rows.get(rep),
                                                    shared["row_vals"].get(rep), common, shared)
            made.extend(GroupWork.of(layers, c, links) for c, links in passes)
        return made

    def _order(self, ratios) -> GroupOrder:
        """Which of `_rank_work`'s items each indexer group's passes run, in group order (cached per group map and
        passes)."""
        distinct, index = self._group_keys(ratios)
        passes = tuple(_num_passes(ratios[rep] if ratios else None) for rep, _ in distinct)
        key = (self._keys[0], passes)
        order = self._orders.get(key)
        if order is None:
            first = np.concatenate([[0], np.cumsum(passes)[:-1]]).tolist()
            seq = [first[j] + p for j in index for p in range(passes[j])]
            if len(self._orders) > 256:
                self._orders.clear()
            order = self._orders[key] = GroupOrder.of(seq)
        return order

    def _simulated_reps(self) -> tuple[list[int], np.ndarray]:
        """The simulated representatives in ascending order, and each group's position among them (cached)."""
        group_of = self.runner.group_of
        key = group_of.tobytes()
        if self._reps[0] != key:
            reps = sorted(set(group_of.tolist()))
            self._reps = (key, reps, np.searchsorted(reps, group_of))
        return self._reps[1], self._reps[2]

    def _group_keys(self, ratios) -> tuple[list[tuple[int, int]], list[int]]:
        """The distinct (simulated representative or -1, layers) of the indexer groups, and each group's index into
        them; rebuilt only when the groups change."""
        group_of = self.runner.group_of if ratios else None
        key = None if group_of is None else group_of.tobytes()
        if self._keys is None or self._keys[0] != key:
            reps = [-1] * len(self.group_layers) if group_of is None else [int(x) for x in group_of]
            pairs = list(zip(reps, (int(x) for x in self.group_layers)))
            distinct = list(dict.fromkeys(pairs))
            where = {p: i for i, p in enumerate(distinct)}
            self._keys = (key, (distinct, [where[p] for p in pairs]))
        return self._keys[1]

    def _shared_work(self, b: Batch) -> dict:
        """The parts of batch b's group work that do not depend on the rank (computed once per step)."""
        cfg, sysm, costs, m = self.cfg, self.system, self.costs, self.cfg.model
        n_gpu, tp, tokens = cfg.num_gpus, sysm.tp, b.tokens_total
        per_tokens = self._per_tokens.get(tokens)
        if per_tokens is None:  # pure functions of the step's token count (the same step after step at a fixed batch)
            allgather_b = sysm.indexer_allgather_bytes(tokens)
            if len(self._per_tokens) > 4096:
                self._per_tokens.clear()
            per_tokens = self._per_tokens[tokens] = dict(
                heads=m.num_heads / n_gpu if tp else m.num_heads,
                allgather_s=costs.distributed_topk_s(allgather_b, tokens, n_gpu) if allgather_b else 0.0,
                ffn_s=costs.ffn_s(tokens, n_gpu, attn_replicated=not tp),
                collective_s=costs.layer_collectives_s(tokens / n_gpu, n_gpu, tp))
        return dict(keys=sysm.indexer_keys(b.hist_rank.tolist(), float(b.hist.sum())), **per_tokens)

    def _compute(self, b: Batch, r: int, shared: dict | None = None) -> dict:
        """Rank r's compute for one indexer group of batch b (per layer where GroupWork says so); `shared` is
        `_shared_work(b)` when the caller has it."""
        costs, sysm, q = self.costs, self.system, self.q
        shared = shared if shared is not None else self._shared_work(b)
        keys = shared["keys"][r]
        qtok = b.n_rank[r] * q
        # Python floats (the same values as the numpy scalars the cost model may return): the timer's and simpy's
        # clock arithmetic on them is the same IEEE operations, several times cheaper than numpy scalar arithmetic
        return dict(
            indexer_s=float((costs.indexer_s(keys, keys * q) if keys else 0.0) if b.n_rank[r] or sysm.tp else 0.0),
            allgather_s=float(shared["allgather_s"]),
            attention_s=float(costs.attention_s(qtok, b.ref_rank[r], shared["heads"]) if qtok else 0.0),
            ffn_s=float(shared["ffn_s"]), collective_s=float(shared["collective_s"]),
            prefetch=sysm.prefetch, d2h_blocking=sysm.d2h_blocking, h2d_pays_latency=sysm.h2d_pays_latency)

    def _passes(self, b: Batch, r: int, rt: dict | None, rows, vals, common: dict, shared: dict) -> list[tuple[dict, dict]]:
        """(compute, links) of each pass of one group: one; or p when the policy served the access batch in p
        sub-batches (its working set did not fit the GPU pool / local buffer at once). The indexer and its
        all-gather run once for the batch; each sub-batch (1/p of the requests) then runs the group's layers with its
        own management, transfers and compute, so per-pass fixed costs (launches, latencies, MoE weight reads) are
        paid p times. `vals`: the group's rows as Python lists and its TP home h2d total (`_ranks_work`)."""
        row = self.cfg.model.kv_bytes_per_token_layer
        p = _num_passes(rt)
        if p == 1:
            if not rt:
                return [(common, NO_LINKS)]
            (h2d, d2h, peer), home_h2d = vals
            return [(common, self._links(shared["ref_rank"][r], shared["n_rank"][r], rt, h2d[r], d2h[r], peer[r],
                                         home_h2d, row))]
        subs = shared.setdefault("sub_batches", {})  # p -> (sub-batch, its shared work): once per step
        if p not in subs:
            sub = Batch(b.run, b.hist, b.refs_req / p, b.n_total / p, b.tokens_total / p, b.ref_rank / p, b.hist_rank,
                        b.n_rank / p)
            subs[p] = (sub, self._shared_work(sub))
        sub, sub_shared = subs[p]
        c = self._compute(sub, r, sub_shared)
        sub_rows = rows / p
        h2d, d2h, peer = sub_rows[:, r].tolist()
        links = self._links(float(sub.ref_rank[r]), float(sub.n_rank[r]), rt, h2d, d2h, peer,
                            float(sub_rows[0].sum()) if self.system.tp else 0.0, row)
        first = {**c, "indexer_s": common["indexer_s"], "allgather_s": common["allgather_s"]}
        rest = {**c, "indexer_s": 0.0, "allgather_s": 0.0}
        return [(first, links)] + [(rest, links)] * (p - 1)

    def _links(self, ref_rank: float, n_rank: float, rt: dict, h2d: float, d2h: float, peer: float,
               home_h2d: float, row_bytes: float) -> dict:
        """Management time and link bytes of one simulated group's plan on a rank (one layer) with `ref_rank`
        references of `n_rank` requests and these (h2d, d2h, peer) rows (Python floats). A pure function of the
        scalars below: memoized on their exact bits (idle DP ranks, whose products are 0 step after step, and
        repeated shapes are computed once)."""
        unique, misses = rt["unique"] * ref_rank, rt["misses"] * ref_rank  # (an idle rank's: 0 whatever the ratios)
        key = _F9.pack(ref_rank, unique, misses, n_rank, h2d, d2h, peer, home_h2d, row_bytes)
        out = self._links_memo.get(key)
        if out is None:
            if len(self._links_memo) >= 4096:
                self._links_memo.clear()
            f = np.float64  # the cost model gets the numpy scalars it got from the arrays (same values)
            out = self._links_memo[key] = self._links_of(f(ref_rank), f(unique), f(misses), f(n_rank), f(h2d),
                                                         f(d2h), f(peer), home_h2d, row_bytes)
        return out

    def _links_of(self, ref_rank: float, unique: float, misses: float, n_rank: float, h2d: float, d2h: float,
                  peer: float, home_h2d: float, row_bytes: float) -> dict:
        sysm, costs = self.system, self.costs
        mgmt = sysm.management_s(costs, ref_rank, unique, misses, n_rank)
        chained = min(peer, home_h2d - h2d) if sysm.tp else 0.0  # peer rows promoted at their home first
        replay = sysm.h2d_replay_link_bytes(costs, h2d, row_bytes, n_rank)  # None: layers 2..L move as layer 1
        return dict(mgmt_s=float(mgmt), h2d_bytes=float(sysm.h2d_link_bytes(costs, h2d, row_bytes, n_rank)),
                    h2d_replay_bytes=None if replay is None else float(replay),
                    d2h_bytes=float(costs.d2h_link_bytes(d2h, row_bytes)),
                    peer_bytes=float(costs.peer_link_bytes(peer - chained, row_bytes)),
                    peer_after_h2d_bytes=float(costs.peer_link_bytes(chained, row_bytes)))  # (floats: see _compute)

    def _epilogue(self, b: Batch, sim_ranks: list[int]) -> dict:
        """Speculative draft passes (one MTP layer per draft token, one token per request) + step overhead."""
        costs, m, q, n_gpu, tp = self.costs, self.cfg.model, self.q, self.cfg.num_gpus, self.system.tp
        epilogue = {"overhead_s": costs.step_overhead_s(speculative=q > 1), "draft_s": 0.0}
        if q > 1:
            heads = m.num_heads / n_gpu if tp else m.num_heads
            qn = b.n_rank[sim_ranks].max()
            one = (costs.attention_s(qn, qn * m.top_k, heads) + costs.ffn_s(b.n_total, n_gpu, not tp)
                   + costs.layer_collectives_s(b.n_total / n_gpu, n_gpu, tp))
            epilogue["draft_s"] = float((q - 1) * costs["draft_layer_equiv"] * one)  # (a float: see _compute)
        return epilogue | self.prefill.step(b, sim_ranks)  # chunked prefill: the prompt piece the step carries

    def _advance(self, run: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draw each request's accepted tokens, grow the histories; returns (accepted, finished requests)."""
        one = self.accept_len.size == 1  # one outcome (no draft tokens): every draw picks it; the draws feed nothing else
        if len(run) == 1:  # batch size 1: the same bookkeeping on scalars
            i = int(run[0])
            drawn = 1 if one else int(self.accept_len[self.accept_cdf.searchsorted(self.rng.random(1), "right")[0]])
            a = min(drawn, int(self.out[i] - self.generated[i]))
            acc = np.array([a], self.accept_len.dtype)
            self.generated[i] += a
            self.hist[i] += a
            self.dsteps[i] += 1
            if self.runner is not None:
                self.runner.grow([int(self.rid[i])], acc)
            if self.generated[i] < self.out[i]:
                return acc, run[:0]
            self.finish_s[i] = self.env.now
            return acc, run
        if one:
            acc = np.ones(len(run), self.accept_len.dtype)
        else:
            acc = self.accept_len[self.accept_cdf.searchsorted(self.rng.random(len(run)), side="right")]
        acc = np.minimum(acc, self.out[run] - self.generated[run])
        self.generated[run] += acc
        self.hist[run] += acc
        self.dsteps[run] += 1
        if self.runner is not None:
            self.runner.grow(self.rid[run].tolist(), acc)
        fin = run[self.generated[run] >= self.out[run]]
        self.finish_s[fin] = self.env.now
        return acc, fin

    def _account(self, b: Batch, ratios, rows: dict, acc: np.ndarray, step_s: float, parts: dict, t_start: float,
                 finished: int):
        """Hits, bytes per link, concurrency, footprint and the timeline record of the step (`finished`: requests
        that completed in it)."""
        st, m = self.state, self.cfg.model
        refs_all = float(b.refs_req[0]) if b.n_total == 1 else float(b.refs_req.sum())  # (the same float64 value)
        if ratios:
            link_rows, hits, unique = self._link_totals(ratios, rows, refs_all)
        else:  # GPU-resident: every selected entry is on the GPU
            link_rows = [0.0, 0.0, 0.0]
            unique = hits = refs_all * m.num_layers
        row = m.kv_bytes_per_token_layer
        net = self._net_bytes.get(b.tokens_total)
        if net is None:
            net = self._net_bytes[b.tokens_total] = self._net_of(b.tokens_total)
        tokens = int(acc[0]) if acc.size == 1 else int(acc.sum())
        st.steps += 1
        st.tokens += float(tokens)
        st.busy_s += step_s
        st.hits += hits
        st.unique += unique
        st.refs += refs_all * m.num_layers
        st.h2d_bytes += link_rows[0] * row
        st.d2h_bytes += link_rows[1] * row
        st.peer_bytes += link_rows[2] * row
        st.allgather_bytes += net[0]
        st.collective_bytes += net[1]
        st.max_concurrency = max(st.max_concurrency, b.n_total)
        st.concurrency_sum += b.n_total
        self._footprint(self.prefill.holding(b.run))  # + requests whose prompt is being prefilled
        if st.first_finish_step is None and finished:
            st.first_finish_step = st.steps - 1
        rec = {"step": st.steps - 1, "t_start_s": t_start, "step_s": step_s, "batch": b.n_total,
               "saturated": self._saturated, "finished": finished,
               "tokens": tokens, "history_tokens": int(b.hist.sum()),
               "h2d_rows": float(link_rows[0]), "d2h_rows": float(link_rows[1]), "peer_rows": float(link_rows[2]),
               "gpu_hit_rate": hits / unique if unique else 1.0, "unique_refs": unique}
        rec.update({p: parts.get(p, 0.0) for p in PARTS})
        st.timeline.append(rec)

    def _link_totals(self, ratios, rows: dict, refs_all: float) -> tuple[list[float], float, float]:
        """The step's rows per link (h2d, d2h, peer over all ranks and layers), hits and unique references: each
        simulated representative's figures weighted by the layers of the groups it stands for, summed in group
        order."""
        copies = self.cfg.num_gpus if self.system.symmetric_ranks else 1
        reps, where = self._simulated_reps()
        per_rep = self._per_rep
        if per_rep is None or per_rep.shape[0] != len(reps):
            per_rep = self._per_rep = np.empty((len(reps), 5))  # (every element written each step)
        for j, rep in enumerate(reps):  # row sums, as each row's (`sum(axis=2)` of the stacked rows), or rank 0's
            x = rows[rep]
            per_rep[j, :3] = x[:, 0] if copies > 1 else _add_reduce(x, 1)
            rt = ratios[rep]
            per_rep[j, 3] = rt["hits"] * refs_all
            per_rep[j, 4] = rt["unique"] * refs_all
        terms = self._terms
        if terms is None or terms.shape[0] != len(where) + 1:
            terms = self._terms = np.zeros((len(where) + 1, 5))  # a leading 0 row: the sums start at 0.0
            self._layer_col = self.group_layers[:, None]  # (as scalar sums did)
        np.multiply(per_rep.take(where, axis=0), self._layer_col, out=terms[1:])
        if copies != 1:
            terms[1:, :3] *= copies
        # in group order (np.cumsum is this accumulate; called directly it skips the wrapper's dispatch)
        h2d, d2h, peer, hits, unique = np.add.accumulate(terms, axis=0)[-1].tolist()
        return [h2d, d2h, peer], hits, unique

    def _net_of(self, tokens_total: int) -> tuple[float, float]:
        """The step's all-gather and layer-collective bytes: a function of its token count (memoised by the caller)."""
        m, n_gpu, costs = self.cfg.model, self.cfg.num_gpus, self.costs
        allgather_b = self.system.indexer_allgather_bytes(tokens_total)
        return (costs.collective_link_bytes(allgather_b, n_gpu, "allgather") * m.num_index_groups * n_gpu,
                costs.layer_collective_bytes(tokens_total / n_gpu, n_gpu, self.system.tp) * m.num_layers * n_gpu)

    def _footprint(self, run: np.ndarray):
        """Where the history bytes are now; keep the moment of the most physical slots."""
        sysm = self.system
        hist = self.hist[run].astype(float)
        peak_rows = self.runner.buffer_peak_rows if self.runner is not None else 0.0
        buffer = sysm.buffer_copy_slots(hist, peak_rows)
        fp = sysm.footprint(float(hist.sum()), len(run), hist.tolist(), buffer)
        if fp["physical_slots"] >= self.state.peak.get("physical_slots", -1):
            self.state.peak = fp | {"concurrency": len(run)}
