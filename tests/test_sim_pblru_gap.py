"""PB-LRU vs exact LRU inside the simulator (issue 11 item 7): docs/architecture.md wants them within a tenth of a point.

The cause of the old gap, reproduced on this cheap config (1 request of ~100K tokens over a 45,634-slot GPU pool, the
per-rank pool of the issue's config at its 1/8 request sample, 4 verify tokens, 300 steps): the buckets rotated once
per access, so the 32 recent buckets spanned the last 32 steps while this pool turns over in ~60; 82% of evictions
came from the cold bucket (a median 31% of the pool), where eviction goes by slot index, not age: pb-lru 0.8793 vs
lru 0.9268. The buckets now age by GPU insertions (an epoch ends after a (K + 1)-th of the pool was inserted,
ulacache/policies/pblru.py), so the ring spans the turnover whatever the pool and the batch: 0.92658 vs 0.92676.
The full paired replay of the issue (128 requests at concurrency 64) is in bench/results/pblru_gap.json.
"""
import sim


def _hit_rate(policy: str, num_recent_buckets: int = 32) -> float:
    cfg = {"system": "ulacache", "attention": "dp", "policy": policy, "cpu_storage": True,
           "hardware": {"preset": "h200", "num_gpus": 1}, "model": {"preset": "glm-5", "weight_bytes": 50e9},
           "spec": {"draft_tokens": 4}, "memory": {"gpu_kv_bytes_per_gpu": 20e9, "cpu_kv_bytes_per_gpu": 100e9},
           "ulacache": {"gpu_pool_slots": 45634, "num_recent_buckets": num_recent_buckets},
           "workload": {"num_requests": 1, "max_concurrency": 1, "seed": 11, "max_steps": 300},
           "fidelity": {"policy_groups": 1, "pilot_steps": 0, "request_fraction": 1.0}}
    return sim.replay(cfg)["gpu_hit_rate"]


def test_pblru_within_a_tenth_of_a_point_of_lru():
    lru = _hit_rate("lru")
    assert 0.5 < lru < 0.99  # the pool is under replacement pressure
    assert abs(_hit_rate("pb-lru") - lru) < 0.001
