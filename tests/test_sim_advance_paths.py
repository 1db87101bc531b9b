"""`Engine._advance`'s shortcuts (no draws when there is one acceptance outcome; scalar bookkeeping at batch size 1)
leave every array, every returned value and the acceptance stream as the general, vectorized path does."""
import numpy as np
import pytest

from sim.costs import CostModel
from sim.engine import Engine
from sim.run import budget_for, build, load_config, load_workload, system_for_workload

STATE = ("generated", "hist", "dsteps", "finish_s")


def _general(self, run):
    """The general path (what `_advance` did for every batch before its shortcuts)."""
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


class _Grow:
    def __init__(self):
        self.calls = []

    def grow(self, rids, counts):
        self.calls.append((list(rids), counts.tolist(), counts.dtype.str))


def _engine(draft: int) -> Engine:
    tree = load_config({"system": "sglang", "attention": "dp", "hardware": {"preset": "h200", "num_gpus": 8},
                        "model": {"preset": "glm-5"}, "spec": {"draft_tokens": draft},
                        "workload": {"num_requests": 6, "max_concurrency": 6, "seed": 2}}, None)
    cfg = build(tree)
    requests, source = load_workload(cfg)
    system = system_for_workload(cfg, budget_for(cfg), requests, source)
    return Engine(cfg, CostModel.load(cfg.hardware, cfg.model, None, overrides=cfg.costs), system, requests, source,
                  None)


def _trace(advance, draft: int) -> list:
    """Steps of batches of one and of several requests, some finishing (outputs cut short): what each step
    returned, the state arrays after it, the grow calls and (several outcomes) the acceptance stream's next draw."""
    eng = _engine(draft)
    eng.runner = _Grow()
    eng.out[:] = [3, 1, 5, 2, 4, 6]
    out = []
    for step, run in enumerate(([0], [1], [0, 2, 3], [4], [2], [0], [4, 5], [5], [5], [5])):
        run = np.asarray(run, np.int64)
        eng.env._now = float(step)
        acc, fin = advance(eng, run)
        out.append((acc.tolist(), acc.dtype.str, fin.tolist(), fin.dtype.str,
                    [getattr(eng, k).tobytes() for k in STATE]))  # (exact bits; NaN finish times alike)
    # the acceptance stream feeds nothing but these draws: with one outcome the fast path takes none
    out.append((eng.runner.calls, float(eng.rng.random()) if eng.accept_len.size > 1 else None))
    return out


@pytest.mark.parametrize("draft", [0, 4])
def test_advance_shortcuts_match_the_general_path(draft):
    fast = _trace(Engine._advance, draft)
    assert fast == _trace(_general, draft)
    assert any(step[2] for step in fast[:-1])  # some requests finished


def test_a_planted_error_in_the_scalar_path_is_caught():
    """A scalar path that forgets the finish time must make the traces differ."""
    def forgetful(self, run):
        if len(run) == 1:
            saved = self.finish_s.copy()
            acc, fin = Engine._advance(self, run)
            self.finish_s[:] = saved
            return acc, fin
        return Engine._advance(self, run)

    assert _trace(forgetful, 0) != _trace(_general, 0)


def test_a_planted_skipped_draw_is_caught():
    """Skipping the draws where there are several outcomes would shift the acceptance stream."""
    def nodraw(self, run):
        one = self.accept_len[:1]
        self.accept_len, keep = one, self.accept_len
        try:
            return Engine._advance(self, run)
        finally:
            self.accept_len = keep

    assert _trace(nodraw, 4) != _trace(_general, 4)
