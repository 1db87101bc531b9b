"""Shared replay cases for the tests (imported by name: pytest puts this folder on sys.path)."""

# A small TP run under pool pressure: 4 indexer groups, 4 requests, 25 decode steps.
SMALL_TP = {"system": "ulacache", "attention": "tp", "hardware": {"preset": "h200", "num_gpus": 8}, "policy": "pb-lru",
            "cpu_storage": True, "model": {"preset": "glm-5", "num_index_groups": 4},
            "ulacache": {"gpu_pool_slots": 20000},
            "workload": {"num_requests": 4, "max_concurrency": 4, "seed": 3, "max_steps": 25}}
FULL = ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0", "fidelity.step_stride=1"]
RUN_ONLY = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "est_peak_memory_bytes",
            "peak_rss_bytes"}  # how the replay ran, not what it simulated
