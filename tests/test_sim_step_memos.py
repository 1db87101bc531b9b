"""The per-step driver's memos (a step's references per rank -> `_divisors`; a rank's work reused across steps) and
its skipped position scan leave every metric as the plain computation does."""
import numpy as np
import pytest

import sim
import sim.engine
import sim.policy
from sim.policy import AddressTable, PolicyRunner
from traces.synthetic.source import SyntheticSelections

DROP = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "sim_cpu_s", "peak_rss_bytes",
        "est_peak_memory_bytes"}  # (the process's, not the run's)


def _cfg(system: str, attention: str, concurrency: int) -> dict:
    return {"system": system, "attention": attention, "hardware": {"preset": "h200", "num_gpus": 8},
            "policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"},
            "workload": {"num_requests": 3, "max_concurrency": concurrency, "seed": 5, "max_steps": 40}}


def _metrics(cfg: dict) -> dict:
    return {k: v for k, v in sim.replay(cfg).items() if k not in DROP}


def _plain_per_rank(self, sids, s_hist, q):
    """What run_step computed before the memo: the references per rank, then their divisors."""
    per_req_refs = q * np.minimum(s_hist, self.cfg.model.top_k).astype(float)
    if self.system.tp:
        return self._divisors(np.full(self.num_ranks, per_req_refs.sum()))
    ranks = np.array([self.sampled[r] for r in sids], dtype=np.int64)
    return self._divisors(np.bincount(ranks, weights=per_req_refs, minlength=self.num_ranks))


@pytest.mark.parametrize("system,attention,concurrency",
                         [("hisparse", "dp", 1), ("hisparse", "dp", 2), ("ulacache", "tp", 1), ("ulacache", "tp", 3)])
def test_memos_change_no_metric(monkeypatch, system, attention, concurrency):
    cfg = _cfg(system, attention, concurrency)
    calls = []
    rank_work = sim.engine.Engine._rank_work
    monkeypatch.setattr(sim.engine.Engine, "_rank_work", lambda self, *a: calls.append(1) or rank_work(self, *a))
    fast = _metrics(cfg)
    fast_calls = len(calls)
    monkeypatch.setattr(PolicyRunner, "_per_rank", _plain_per_rank)
    monkeypatch.setattr(sim.engine.Engine, "_work_step_key", lambda self, b, ratios, shared: None)
    calls.clear()
    plain = _metrics(cfg)
    assert fast["decode_steps"] == 40
    assert fast == plain
    if attention == "dp":  # the idle ranks' work is built once, not once per step
        assert fast_calls < len(calls)


def test_position_scan_skipped_only_for_a_checked_source():
    assert SyntheticSelections.positions_checked
    t = AddressTable(8, np.int32)
    t.add(7, np.arange(10, 14, dtype=np.int32))
    pos = np.array([[[0, 3, -1]]])
    assert t.lookup([7], pos).tolist() == [[[10, 13, -1]]]
    assert t.lookup([7], pos, checked=True).tolist() == [[[10, 13, -1]]]
    with pytest.raises(ValueError):
        t.lookup([7], np.array([[[0, -2]]]))


def _general_batch(self, run):
    """`Engine._batch`'s general path (what it computed for a batch of one before its shortcut)."""
    m, n_gpu, q = self.cfg.model, self.cfg.num_gpus, self.q
    hist = self.hist[run]
    refs_req = q * np.minimum(hist, m.top_k).astype(float)
    if self.system.tp:
        ref_rank = np.full(n_gpu, refs_req.sum())
        hist_rank = np.full(n_gpu, float(hist.sum()))
        n_rank = np.full(n_gpu, float(len(run)))
    else:
        sp = self.space[run]
        ref_rank = np.bincount(sp, weights=refs_req, minlength=n_gpu)
        hist_rank = np.bincount(sp, weights=hist.astype(float), minlength=n_gpu)
        n_rank = np.bincount(sp, minlength=n_gpu).astype(float)
    return refs_req, ref_rank, hist_rank, n_rank


@pytest.mark.parametrize("attention,draft", [("dp", 0), ("tp", 4)])
def test_batch_of_one_is_the_general_batch(attention, draft):
    from sim.costs import CostModel
    from sim.engine import Engine
    from sim.run import budget_for, build, load_config, load_workload, system_for_workload

    tree = load_config({"system": "sglang", "attention": attention, "hardware": {"preset": "h200", "num_gpus": 8},
                        "model": {"preset": "glm-5"}, "spec": {"draft_tokens": draft},
                        "workload": {"num_requests": 6, "max_concurrency": 6, "seed": 2}}, None)
    cfg = build(tree)
    requests, source = load_workload(cfg)
    system = system_for_workload(cfg, budget_for(cfg), requests, source)
    eng = Engine(cfg, CostModel.load(cfg.hardware, cfg.model, None, overrides=cfg.costs), system, requests, source,
                 None)
    for i, (space, hist) in enumerate([(0, 5), (3, 2047), (7, 2048), (5, 131092), (2, 1)]):
        eng.space[i], eng.hist[i] = space, hist
        run = np.array([i], dtype=np.int64)
        b = eng._batch(run)
        want = _general_batch(eng, run)
        got = (b.refs_req, b.ref_rank, b.hist_rank, b.n_rank)
        for x, y in zip(got, want):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
        assert (b.n_total, b.tokens_total) == (1, eng.q)
