"""A request's prompt: untimed or chunked prefill, and the prompt KV each system writes to host memory (issue 11 item 6).

`workload.prefill` picks the mode from `PREFILL_MODES`; the engine calls the same hooks in both:
`admit(i, space)` when request i is admitted, `decoding(running)` for the requests that decode this step,
`step(batch, sim_ranks)` for the epilogue parts a decode step carries, `idle()` for a step of prompts alone,
`holding(decoding)` for the requests the footprint counts, and `metrics()`.
- `untimed` (default): the prompt's KV arrives with the request (a PD-disaggregated decode node); it decodes at once.
- `chunked`: prefill co-located with decode as SGLang's mixed chunked prefill runs it: each step carries up to
  `prefill_chunk_tokens` prompt tokens (per DP rank: that over the ranks, as SGLang divides it) of the admitted
  requests in admission order beside the decode batch, costed by `CostModel.mixed_prefill_s`. The prompt KV a
  system keeps on the host (`System.prompt_host_tokens`) is written on the step's PCIe D2H links, sharing them with
  the decode traffic; a request decodes once its prompt is computed and written (its time to first token).
Both modes report the host bytes the prompts take (`prompt_host_write_bytes`).
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

GIB = 1024 ** 3


def default_chunk_tokens(hbm_bytes: float) -> int:
    """SGLang's `--chunked-prefill-size` default by GPU memory (server_args.py): 8192 below 160 GiB (H100, H200),
    16384 above (B200, B300)."""
    return 8192 if hbm_bytes < 160 * GIB else 16384


class Untimed:
    """The prompt's KV arrives with the request: no prefill work on this node; its host share is still counted."""

    name = "untimed"

    def __init__(self, cfg, costs, system, engine):
        self.cfg, self.costs, self.system = cfg, costs, system
        self.env, self.node, self.runner = engine.env, engine.node, engine.runner
        self.rid, self.inp, self.arrival = engine.rid, engine.inp, engine.arrival
        self.host = np.zeros((engine.n_req, cfg.num_gpus))  # prompt tokens written to each rank's host memory
        self._rows_seen = 0.0
        self._cpu_share: dict[int, float] = {}  # space -> CPU share of the prompt its last sampled request placed

    # ---- hooks
    def admit(self, i: int, space: int) -> None:
        self.host[i] = self.system.prompt_host_tokens(space, int(self.inp[i]), self._placed_cpu_tokens(i, space))

    def decoding(self, running: list[int]) -> list[int]:
        return running

    def step(self, batch, sim_ranks: list[int]) -> dict:
        return {}

    def holding(self, decoding: np.ndarray) -> np.ndarray:
        """Requests holding history KV now (the footprint's): the decode batch, + prompts being prefilled."""
        return decoding

    def idle(self) -> float:  # pragma: no cover - decoding() is every running request
        raise RuntimeError("untimed prefill has no prompt-only steps")

    def metrics(self) -> dict:
        return {"prefill_mode": self.name, "prefill_chunk_tokens": None, "prefill_s": 0.0, "prefill_only_s": 0.0,
                "prefill_tokens": 0.0, "prompt_host_write_bytes": self.host_bytes(),
                "ttft_ms_p50": None, "ttft_ms_p90": None, "ttft_ms_mean": None}

    # ---- the prompt's host share
    def host_bytes(self) -> float:
        """KV bytes the admitted prompts put in host memory, every rank (all layers, as `pcie_prompt_load_bytes`)."""
        return float(self.host.sum()) * self.cfg.model.kv_bytes_per_token

    def _placed_cpu_tokens(self, i: int, space: int) -> float:
        """Prompt tokens of request i the policy's library placed in its CPU tier at admission: a sampled request's
        own placement (the runner's `prompt_rows_own` grew by it); an unsampled one takes the share
        of the last sampled request of its space (it stands for the requests admitted there until the next sampled
        one: placement fills the GPU pool first, so the share moves with time, not with the request)."""
        r = self.runner
        if r is None:
            return 0.0
        rows, self._rows_seen = r.prompt_rows_own - self._rows_seen, r.prompt_rows_own
        n = float(self.inp[i])
        if int(self.rid[i]) in r.sampled:
            own = rows
            self._cpu_share[space] = own / n
            return own
        return n * self._cpu_share.get(space, 0.0)


class Chunked(Untimed):
    """SGLang's mixed chunked prefill: one chunk budget per step and attention rank, beside the decode batch."""

    name = "chunked"

    def __init__(self, cfg, costs, system, engine):
        super().__init__(cfg, costs, system, engine)
        wl, n = cfg.workload, cfg.num_gpus
        self.chunk_tokens = int(wl.prefill_chunk_tokens or default_chunk_tokens(cfg.hardware.hbm_bytes))
        spaces = system.capacity.num_spaces
        self.budget = max(1, self.chunk_tokens // spaces)  # SGLang: chunked_prefill_size // dp_size under DP attention
        self.queues = [deque() for _ in range(spaces)]  # admitted requests with prompt left, admission order
        self.done = np.zeros(engine.n_req, np.int64)  # prompt tokens computed
        self.ready = np.zeros(engine.n_req, bool)
        self.ttft_s = np.full(engine.n_req, np.nan)
        self.events: dict[int, list] = {}  # request -> its prompt's host-write link events
        self.pending: list[int] = []  # prompts computed, waiting for their host writes
        self.prefill_s = self.prefill_only_s = 0.0
        self.tokens = 0.0
        self.key_share = float(system.indexer_keys([1.0] * n, 1.0)[0])  # distributed indexer: 1/N of the keys
        self.extra_layers = costs["draft_layer_equiv"] * cfg.model.draft_layers if cfg.query_tokens > 1 else 0.0

    def admit(self, i: int, space: int) -> None:
        super().admit(i, space)
        self.queues[space].append(i)
        self.events[i] = []

    def decoding(self, running: list[int]) -> list[int]:
        """Running requests whose prompt is computed and written (the moment is their first token)."""
        if self.pending:
            done = [i for i in self.pending if all(ev.triggered for ev in self.events[i])]
            for i in done:
                del self.events[i]
                self.ready[i] = True
                self.ttft_s[i] = self.env.now - self.arrival[i]
            self.pending = [i for i in self.pending if not self.ready[i]]
        return [i for i in running if self.ready[i]]

    def holding(self, decoding: np.ndarray) -> np.ndarray:
        """The decode batch and the admitted requests whose prompt is not done: their whole prompt, as the library
        allocated it at admission."""
        waiting = [i for q in self.queues for i in q] + self.pending
        return np.concatenate([decoding, np.asarray(waiting, dtype=decoding.dtype)]) if waiting else decoding

    def step(self, batch, sim_ranks: list[int]) -> dict:
        """Plan this step's prompt pieces beside the decode batch; their host writes start with the step."""
        t = self._run_pieces(batch.tokens_total, sim_ranks)
        return {"prefill_s": t}

    def idle(self) -> float:
        """No request decodes: a step of prompt pieces alone, or (all computed) the wait for their host writes."""
        t0 = self.env.now
        if any(self.queues):
            ranks = [0] if self.system.symmetric_ranks else list(range(self.cfg.num_gpus))
            self.node.simulate(ranks)
            t = self._run_pieces(0.0, ranks) + self.costs["step_overhead_s"]
            if t > 0:
                self.env.run(until=t0 + t)
            self.prefill_only_s += t
        else:
            import simpy

            self.env.run(until=simpy.AnyOf(self.env, [ev for i in self.pending for ev in self.events[i]]))
        return self.env.now - t0

    def _run_pieces(self, decode_tokens: float, sim_ranks: list[int]) -> float:
        cfg, sysm = self.cfg, self.system
        pieces: list[list] = [[] for _ in self.queues]
        host = np.zeros(cfg.num_gpus)
        members = []
        for space, queue in enumerate(self.queues):
            budget = self.budget
            while queue and budget > 0:
                i = queue[0]
                take = int(min(budget, self.inp[i] - self.done[i]))
                pieces[space].append((take, int(self.done[i])))
                host += self.host[i] * take / self.inp[i]
                self.done[i] += take
                budget -= take
                members.append(i)
                if self.done[i] >= self.inp[i]:
                    queue.popleft()
                    self.pending.append(i)
        if not members:
            return 0.0
        prompt = sum(t for p in pieces for t, _ in p)
        self.tokens += prompt
        t = self.costs.mixed_prefill_s(pieces, decode_tokens, cfg.num_gpus, sysm.tp, self.key_share,
                                       sysm.indexer_allgather_bytes(prompt), self.extra_layers)
        self._write(host, sim_ranks, members)
        self.prefill_s += t
        return t

    def _write(self, host: np.ndarray, sim_ranks: list[int], members: list[int]) -> None:
        """The pieces' host KV on each simulated rank's PCIe D2H link (a simulated rank stands for the others);
        a request with KV in a write waits for it before it decodes."""
        m = self.cfg.model
        for r in sim_ranks:
            if host[r] <= 0:
                continue
            ev = self.node.d2h[r].transfer(self.costs.d2h_link_bytes(host[r] * m.num_layers,
                                                                     m.kv_bytes_per_token_layer), "prompt d2h")
            for i in members:
                if self.host[i, r] > 0:
                    self.events[i].append(ev)

    def metrics(self) -> dict:
        ttft = self.ttft_s[np.isfinite(self.ttft_s)] * 1e3
        pct = (lambda p: float(np.percentile(ttft, p))) if ttft.size else (lambda p: math.nan)  # noqa: E731
        return super().metrics() | {
            "prefill_chunk_tokens": self.chunk_tokens, "prefill_s": self.prefill_s,
            "prefill_only_s": self.prefill_only_s, "prefill_tokens": self.tokens,
            "ttft_ms_p50": pct(50), "ttft_ms_p90": pct(90),
            "ttft_ms_mean": float(ttft.mean()) if ttft.size else math.nan}


PREFILL_MODES = {"untimed": Untimed, "chunked": Chunked}


def make_prefill(cfg, costs, system, engine) -> Untimed:
    return PREFILL_MODES[cfg.workload.prefill](cfg, costs, system, engine)
