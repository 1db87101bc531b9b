"""The engine scales the policy's three link ratios in one product (`links`); without it (a policy that gives only
h2d / d2h / peer) it builds the same rows link by link: every metric is the same either way."""
import pytest

import sim
import sim.policy


def _cfg(system: str, attention: str) -> dict:
    return {"system": system, "attention": attention, "hardware": {"preset": "h200", "num_gpus": 8},
            "policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"},
            "workload": {"num_requests": 3, "max_concurrency": 2, "seed": 5, "max_steps": 40}}


@pytest.mark.parametrize("system,attention", [("ulacache", "tp"), ("hisparse", "dp")])
def test_rows_without_the_links_ratio_are_the_same(monkeypatch, system, attention):
    drop = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "sim_cpu_s", "peak_rss_bytes",
            "est_peak_memory_bytes"}  # (the process's, not the run's)
    fast = sim.replay(_cfg(system, attention))
    ratios = sim.policy.PolicyRunner._ratios
    monkeypatch.setattr(sim.policy.PolicyRunner, "_ratios",
                        lambda self, t, r: {k: v for k, v in ratios(self, t, r).items() if k != "links"})
    slow = sim.replay(_cfg(system, attention))
    assert fast["decode_steps"] == 40
    assert {k: v for k, v in fast.items() if k not in drop} == {k: v for k, v in slow.items() if k not in drop}
