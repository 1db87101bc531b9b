"""The replay engine: continuous batching with admission control, decode steps timed on the simpy node, metrics.

Decode-only (PD-disaggregated decode node): a request arrives with its prompt's KV and is admitted when its whole
history + growth (input + output tokens) fits the system's capacity (`sim/systems.py`). Each step every running
request verifies `q` tokens (q = spec.draft_tokens, or 1 without speculative decoding) and keeps an accepted length
drawn from the configured distribution.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.costs import CostModel
from sim.events import TraceRecorder
from sim.hardware import Node, make_env
from sim.policy import PolicyRunner
from sim.systems import System
from sim.timing import PARTS, GroupWork, StepTimer


def accept_distribution(spec: dict) -> np.ndarray:
    """P(accepted = 1..q): explicit `accept_probs`, else 1 + Binomial(q - 1, p) with mean `accept_mean`
    (default 1 + 2/3 (q - 1): 3.0 for the recipes' 4 verify tokens, DESIGN §7's 2.2-3.5 range)."""
    q = max(1, spec["draft_tokens"])
    if spec["accept_probs"] is not None:
        return np.asarray(spec["accept_probs"], dtype=float)
    if q == 1:
        return np.ones(1)
    from math import comb

    mean = spec["accept_mean"] if spec["accept_mean"] is not None else 1.0 + (q - 1) * 2.0 / 3.0
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


class Engine:
    def __init__(self, cfg, costs: CostModel, system: System, requests, source, recorder: TraceRecorder | None,
                 make_cache=None):
        self.cfg, self.costs, self.system, self.source = cfg, costs, system, source
        req = requests.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)
        self.rid = req["request_id"].to_numpy(np.int64)
        self.arrival = req["arrival_s"].to_numpy(float)
        self.inp = req["input_tokens"].to_numpy(np.int64)
        self.out = req["output_tokens"].to_numpy(np.int64)
        self.n_req = len(req)
        self.q = cfg.query_tokens
        self.hist = self.inp.copy()
        self.generated = np.zeros(self.n_req, np.int64)
        self.dsteps = np.zeros(self.n_req, np.int64)
        self.space = np.full(self.n_req, -1, np.int64)
        self.admit_s = np.full(self.n_req, np.nan)
        self.finish_s = np.full(self.n_req, np.nan)
        self.rng = np.random.default_rng(cfg.workload["seed"] + 7919)
        self.accept_p = accept_distribution(cfg.spec)
        cap = system.capacity
        self.used_tokens = np.zeros(cap.num_spaces)
        self.running_per_space = np.zeros(cap.num_spaces, np.int64)
        self.reserved = np.zeros(cap.num_spaces)  # working-set / device-buffer slots reserved per space
        self.env = make_env()
        self.recorder = recorder
        self.node = Node(self.env, cfg.num_gpus, costs, recorder)
        self.timer = StepTimer(self.env, self.node, recorder)
        self.runner = None
        if system.uses_policy and make_cache is not None:
            max_len = int((self.inp + self.out).max()) + self.q + 1
            self.runner = PolicyRunner(cfg, system, source, max_len, make_cache)
        self.group_layers = np.asarray(cfg.model.group_sizes(), dtype=float)
        self.state = RunState()

    # ------------------------------------------------------------------ admission
    def _need(self, i: int) -> float:
        return float(self.inp[i] + self.out[i] + self.q)

    def _reserve(self, i: int) -> float:
        """Slots request i reserves in the GPU pool / buffers (UlaCache: never more than its whole history)."""
        r = float(self.system.capacity.reserve_slots_per_request)
        return min(r, self._need(i)) if self.system.reserve_capped_by_history else r

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
        limit = self.cfg.workload["max_concurrency"]
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

    def _release(self, i: int):
        s = self.space[i]
        self.used_tokens[s] -= self._need(i)
        self.running_per_space[s] -= 1
        self.reserved[s] -= self._reserve(i)
        if self.runner is not None:
            self.runner.release(int(self.rid[i]))

    # ------------------------------------------------------------------ main loop
    def run(self, progress=None) -> RunState:
        st, cfg = self.state, self.cfg
        waiting: list[int] = []
        running: list[int] = []
        nxt = 0
        done = 0
        max_steps = cfg.workload["max_steps"]
        trace_steps = cfg.output["trace_event_steps"]
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
            finished = self._step(running)
            for i in finished:
                running.remove(i)
                self._release(i)
                done += 1
            if progress is not None:
                progress(done, self.n_req)
        return st

    # ------------------------------------------------------------------ one decode step
    def _step(self, running: list[int]) -> list[int]:
        cfg, st, sysm, costs, m = self.cfg, self.state, self.system, self.costs, self.cfg.model
        run = np.asarray(running, dtype=np.int64)
        q, n_gpu, tp = self.q, cfg.num_gpus, sysm.tp
        hist = self.hist[run]
        refs_req = q * np.minimum(hist, m.top_k).astype(float)
        n_total = len(run)
        tokens_total = n_total * q
        if tp:
            ref_rank = np.full(n_gpu, refs_req.sum())
            hist_rank = np.full(n_gpu, float(hist.sum()))
            n_rank = np.full(n_gpu, float(n_total))
        else:
            sp = self.space[run]
            ref_rank = np.bincount(sp, weights=refs_req, minlength=n_gpu)
            hist_rank = np.bincount(sp, weights=hist.astype(float), minlength=n_gpu)
            n_rank = np.bincount(sp, minlength=n_gpu).astype(float)

        ratios = None
        if self.runner is not None:
            if self.runner.due(st.steps):
                rids = self.rid[run].tolist()
                spaces = self.space[run]
                ranks = spaces if sysm.capacity.num_spaces > 1 else np.zeros_like(spaces)
                ratios = self.runner.run_step(rids, hist, self.dsteps[run], q, spaces, ranks)
            else:
                ratios = self.runner.last
        sim_ranks = [0] if sysm.symmetric_ranks else list(range(n_gpu))
        tracing = self.recorder is not None and self.recorder.enabled
        keys = sysm.indexer_keys(hist_rank.tolist(), float(hist.sum()))
        allgather_b = sysm.indexer_allgather_bytes(tokens_total)
        allgather_s = costs.distributed_topk_s(allgather_b, tokens_total, n_gpu) if allgather_b else 0.0
        ffn = costs.ffn_s(tokens_total, n_gpu, attn_replicated=not tp)
        coll = costs.layer_collectives_s(tokens_total / n_gpu, n_gpu, tp)
        heads = m.num_heads / n_gpu if tp else m.num_heads
        row = m.kv_bytes_per_token_layer
        prefetch = sysm.name == "ulacache"
        layer_w = self.group_layers
        hits = unique = 0.0
        h2d_rows_tot = d2h_rows_tot = peer_rows_tot = 0.0
        rows = {}  # distinct ratio set -> (h2d, d2h, peer) rows per rank, one layer
        if ratios:
            for rep in sorted(set(int(x) for x in self.runner.group_of)):
                rt = ratios[rep]
                rows[rep] = tuple(np.resize(np.asarray(rt[k], float), n_gpu) * ref_rank for k in ("h2d", "d2h", "peer"))
            copies = n_gpu if sysm.symmetric_ranks else 1
            for g in range(m.num_index_groups):
                h, d, p = rows[int(self.runner.group_of[g])]
                scale = layer_w[g] * copies
                h2d_rows_tot += (h[0] if copies > 1 else h.sum()) * scale
                d2h_rows_tot += (d[0] if copies > 1 else d.sum()) * scale
                peer_rows_tot += (p[0] if copies > 1 else p.sum()) * scale
            if tp and not sysm.symmetric_ranks and not tracing:
                # TP ranks compute the same; a group ends with the slowest rank, and a rank's time grows with each of
                # its concurrent link volumes: the ranks with the most of some link's rows are the only candidates
                sim_ranks = sorted({int(np.argmax(arr)) for h, d, p in rows.values() for arr in (h, d, p)})
        work = []
        for r in sim_ranks:
            per_group = []
            qtok = n_rank[r] * q
            attn = costs.attention_s(qtok, ref_rank[r], heads) if qtok else 0.0
            idx_s = costs.indexer_s(keys[r], keys[r] * q) if keys[r] else 0.0
            for g in range(m.num_index_groups):
                h2d = d2h = peer = mgmt = chained = 0.0
                if ratios:
                    rep = int(self.runner.group_of[g])
                    rt = ratios[rep]
                    h2d, d2h, peer = (x[r] for x in rows[rep])
                    mgmt = sysm.management_s(costs, ref_rank[r], rt["unique"] * ref_rank[r],
                                             rt["misses"] * ref_rank[r], n_rank[r])
                    if tp:  # rows promoted at other homes this step are fetched only after their promotion
                        chained = min(peer, float(rows[rep][0].sum()) - h2d)
                per_group.append(GroupWork(
                    layers=int(layer_w[g]), indexer_s=idx_s if n_rank[r] or tp else 0.0, allgather_s=allgather_s,
                    mgmt_s=mgmt, h2d_bytes=sysm.h2d_link_bytes(costs, h2d, row, n_rank[r]),
                    d2h_bytes=costs.d2h_link_bytes(d2h, row), peer_bytes=costs.peer_link_bytes(peer - chained, row),
                    peer_after_h2d_bytes=costs.peer_link_bytes(chained, row), attention_s=attn, ffn_s=ffn, collective_s=coll,
                    prefetch=prefetch, d2h_blocking=prefetch))
            work.append(per_group)
        if ratios:
            refs_all = refs_req.sum()
            for g in range(m.num_index_groups):
                rt = ratios[int(self.runner.group_of[g])]
                hits += rt["hits"] * refs_all * layer_w[g]
                unique += rt["unique"] * refs_all * layer_w[g]
        else:  # GPU-resident: every selected entry is on the GPU
            unique = hits = refs_req.sum() * m.num_layers
        # speculative draft passes (one MTP layer per draft token, at one token per request) + step overhead
        epilogue = {"overhead_s": costs.step_overhead_s(speculative=q > 1), "draft_s": 0.0}
        if q > 1:
            qn = n_rank[sim_ranks].max()
            one = (costs.attention_s(qn, qn * m.top_k, heads) + costs.ffn_s(n_total, n_gpu, not tp)
                   + costs.layer_collectives_s(n_total / n_gpu, n_gpu, tp))
            epilogue["draft_s"] = (q - 1) * costs["draft_layer_equiv"] * one
        t_start = self.env.now
        step_s, parts = self.timer.run(work, sim_ranks, epilogue, dedup=not tracing)

        # accept and advance
        acc = self.rng.choice(np.arange(1, len(self.accept_p) + 1), size=n_total, p=self.accept_p)
        remaining = self.out[run] - self.generated[run]
        acc = np.minimum(acc, remaining)
        self.generated[run] += acc
        self.hist[run] += acc
        self.dsteps[run] += 1
        if self.runner is not None:
            self.runner.grow(self.rid[run].tolist(), acc)
        fin = run[self.generated[run] >= self.out[run]]
        self.finish_s[fin] = self.env.now

        # bookkeeping
        st.steps += 1
        st.tokens += float(acc.sum())
        st.busy_s += step_s
        st.hits += hits
        st.unique += unique
        st.refs += refs_req.sum() * m.num_layers
        st.h2d_bytes += h2d_rows_tot * row
        st.d2h_bytes += d2h_rows_tot * row
        st.peer_bytes += peer_rows_tot * row
        st.allgather_bytes += costs.collective_link_bytes(allgather_b, n_gpu, "allgather") * m.num_index_groups * n_gpu
        st.collective_bytes += costs.layer_collective_bytes(tokens_total / n_gpu, n_gpu, tp) * m.num_layers * n_gpu
        st.max_concurrency = max(st.max_concurrency, n_total)
        st.concurrency_sum += n_total
        self._footprint(run)
        rec = {"step": st.steps - 1, "t_start_s": t_start, "step_s": step_s, "batch": n_total,
               "tokens": int(acc.sum()), "history_tokens": int(hist.sum()),
               "h2d_rows": h2d_rows_tot, "d2h_rows": d2h_rows_tot, "peer_rows": peer_rows_tot,
               "gpu_hit_rate": hits / unique if unique else 1.0}
        rec.update({p: parts.get(p, 0.0) for p in PARTS})
        st.timeline.append(rec)
        return fin.tolist()

    def _footprint(self, run: np.ndarray):
        """Where the history bytes are now; keep the moment of the most physical slots."""
        sysm, cap = self.system, self.system.capacity
        hist = self.hist[run].astype(float)
        unique_tokens = float(hist.sum())
        if sysm.name == "hisparse":
            per_req = np.minimum(hist, cap.device_buffer_slots) + 1  # + the newest token's slot
            buffer = float(per_req.sum()) * cap.history_copies
        elif sysm.name == "ulacache" and sysm.tp:
            ws = cap.notes["ws_reserve_slots"]
            per_rank = min(cap.local_buffer_slots, float(np.minimum(hist, ws).sum()))
            if self.runner is not None and self.runner.buffer_peak_rows:
                per_rank = min(per_rank, self.runner.buffer_peak_rows / self.cfg.num_gpus)
            buffer = per_rank * self.cfg.num_gpus
        else:
            buffer = 0.0
        fp = sysm.footprint(unique_tokens, len(run), hist.tolist(), buffer)
        if fp["physical_slots"] >= self.state.peak.get("physical_slots", -1):
            self.state.peak = fp | {"concurrency": len(run)}
