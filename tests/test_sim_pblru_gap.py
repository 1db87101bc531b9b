"""PB-LRU vs exact LRU inside the simulator (issue 11 item 7): DESIGN §3 wants them within a tenth of a point.

Cause of the gap found in the simulator (2.98 points at paper scale; this cheap config reproduces it: 1 request of
~100K tokens over a 45,634-slot GPU pool, the per-rank pool of the issue's config at its 1/8 request sample, 4 verify
tokens, 300 steps: pb-lru 0.8793 vs lru 0.9268): the buckets rotate once per access, so the 32 recent buckets span
the last 32 steps; this pool turns over in ~60 steps (45.6K slots / ~730 misses per step), so most candidates sit in
the cold bucket, where eviction goes by slot index, not age. With 120 recent buckets (spanning the turnover) the
same replay gives 0.92664 vs 0.92676. The fix belongs to the library's aging schedule (ulacache/policies/pblru.py:
rotate by volume -- an epoch ends when ~pool/(K+1) slots were touched -- so the recent buckets span the turnover
whatever the pool); until it lands this test is an expected failure (strict: it fails loudly once fixed).
"""
import pytest

import sim


def _hit_rate(policy: str) -> float:
    cfg = {"system": "ulacache", "attention": "dp", "policy": policy, "cpu_storage": True,
           "hardware": {"preset": "h200", "num_gpus": 1}, "model": {"preset": "glm-5", "weight_bytes": 50e9},
           "spec": {"draft_tokens": 4}, "memory": {"gpu_kv_bytes_per_gpu": 20e9, "cpu_kv_bytes_per_gpu": 100e9},
           "ulacache": {"gpu_pool_slots": 45634},
           "workload": {"num_requests": 1, "max_concurrency": 1, "seed": 11, "max_steps": 300},
           "fidelity": {"policy_groups": 1, "pilot_steps": 0, "request_fraction": 1.0}}
    return sim.replay(cfg)["gpu_hit_rate"]


@pytest.mark.xfail(strict=True, reason="PB-LRU ages by access count (32 steps) while this pool turns over in ~60: "
                                       "needs volume-based rotation in ulacache/policies/pblru.py")
def test_pblru_within_a_tenth_of_a_point_of_lru():
    assert abs(_hit_rate("pb-lru") - _hit_rate("lru")) < 0.001
