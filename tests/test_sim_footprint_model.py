"""The footprint model against what the library and a replay really allocate (issue 10 item 3): the growth bound is
the library's rule at its worst, a cache filled the way the runner fills it never costs more than the model says,
and a small replay's own peak resident set (wait4) never exceeds its estimate."""
import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sim import footprint
from ulacache import CacheConfig, UlaCache
from ulacache.rows import RaggedRows, RankRows


@pytest.mark.parametrize("rows", [1, 4])
def test_grown_ids_bounds_the_growth_rule(rows):
    """Rows grown one token at a time and by request-sized jumps (rows.RankRows / RaggedRows, the real rule) never
    hold more storage than `grown_ids` allows for what they hold."""
    rng = np.random.default_rng(0)
    rank, ragged = RankRows(rows, 1 << 24, 1 << 24), RaggedRows(rows, 1 << 24, 1 << 24)
    need = np.zeros(rows, dtype=np.int64)
    for _ in range(3000):
        need += rng.choice([1, 1, 1, 64, 5000, 40000]) if rng.random() < 0.5 else 1
        rank.grow(int(need.max()))
        ragged.grow(need)
        assert rows * rank.cap <= footprint.grown_ids(rows * need.max(), rows, ragged=False)
        assert ragged.size <= footprint.grown_ids(need.sum(), rows), (need, ragged.caps)


def _maker(config: CacheConfig):
    def make(group: int, k: int):
        return UlaCache(config)

    make.config = lambda k: config
    return make


def _filled_bytes(config: CacheConfig, placement: list[tuple[int, int]], decode_steps: int) -> float:
    """Bytes a cache holds once given its requests one by one (prompt, then `decode_steps` tokens each per step), as
    the runner gives them, measured as the probes measure (tracemalloc + the library's mappings)."""
    with footprint.probing():
        base = footprint._held()
        cache = UlaCache(config)
        for rid, (tokens, rank) in enumerate(placement):
            cache.alloc_many([rid], np.array([tokens]), np.array([rank]))
        for _ in range(decode_steps):
            ids = list(range(len(placement)))
            cache.alloc_many(ids, np.ones(len(ids), dtype=np.int64), np.array([r for _, r in placement]))
        held = footprint._held() - base
        del cache
    return float(held)


CASES = {
    # DP, the fullest rank spilling to the CPU tier: per-entry rows, the GPU pool's shared rows and CPU entries
    "dp-spill": (CacheConfig(mode="dp", num_ranks=4, gpu_slots=6000, cpu_slots=60000),
                 [(9000, 0), (4000, 1), (3000, 1), (5000, 2), (2500, 3)]),
    # DP, everything on the GPU (short rows: the doubling regime)
    "dp-gpu": (CacheConfig(mode="dp", num_ranks=4, gpu_slots=40000, cpu_slots=0),
               [(7000, 0), (7000, 1), (7000, 2), (7000, 3)]),
    # TP: homes spread over the ranks, most entries in the CPU tier
    "tp-spill": (CacheConfig(mode="tp", num_ranks=4, gpu_slots=2000, cpu_slots=30000, local_buffer_slots=1000),
                 [(20000, 0), (15000, 0), (9000, 0)]),
    "hisparse-dp": (CacheConfig(mode="dp", num_ranks=2, gpu_slots=20000, cpu_slots=60000, policy="hisparse",
                                device_buffer_slots=1024), [(12000, 0), (8000, 1), (3000, 1)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cache_model_covers_a_cache_filled_as_the_run_fills_it(case):
    """probe_cache's bytes for a run's entries and fullest rank cover a real cache given them request by request
    plus decode tokens (growth events included); dropping any part of the model (the CPU tier, the DP shared rows,
    the growth rule) makes one of these cases fail."""
    config, placement = CASES[case]
    steps = 300
    per_rank = np.zeros(config.num_ranks, dtype=np.int64)
    for tokens, rank in placement:
        per_rank[rank] += tokens + steps
    entries = int(per_rank.sum())
    fullest = int(per_rank.max()) if config.mode == "dp" else entries
    model = footprint.probe_cache(_maker(config), 1, entries, fullest)
    real = _filled_bytes(config, placement, steps)
    assert real <= model["bytes"], (real, model)
    assert model["bytes"] <= 3 * real + 4e6, (real, model)  # a bound, not a blanket: within the growth rule's 2x


def test_probes_never_walk_the_old_generations(monkeypatch):
    """The probes collect only the garbage they made (gen 0 per measurement, gens 0-1 once at the end): a full
    collection walks every object of the process, a fixed cost per replay."""
    calls = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda generation=2: calls.append(generation) or real(generation))
    config, placement = CASES["dp-spill"]
    footprint.probe_cache(_maker(config), 1, 30000, 12000)
    footprint.probe_freed(_maker(config), 1)
    assert calls and max(calls) <= 1, calls
    assert gc.isenabled()


CHILD = """import json, sys
import sim
m = sim.replay(json.loads(sys.argv[1]))
hwm = next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmHWM:"))
print(json.dumps({"est": m["est_peak_memory_bytes"], "peak": hwm}))
"""


@pytest.mark.parametrize("system,attention", [("ulacache", "tp"), ("ulacache", "dp"), ("hisparse", "dp")])
def test_estimate_covers_the_peak_rss_of_a_small_replay(profile, system, attention):
    """A small replay in its own process: its peak resident set (VmHWM, the high-water mark of its own memory map:
    wait4's ru_maxrss would also count this test process, which the child is forked from) is within the estimate
    it made before starting (every indexer group and request simulated, so the caches dominate)."""
    cfg = {"system": system, "attention": attention, "model": {"preset": "glm-5.2", "weight_bytes": 100e9},
           "hardware": {"preset": "h200", "num_gpus": 4},
           "workload": {"profile": profile, "num_requests": 8, "max_concurrency": 8, "seed": 1, "max_steps": 4},
           "memory": {"gpu_kv_bytes_per_gpu": 1.0e9, "cpu_kv_bytes_per_gpu": 20e9},
           "fidelity": {"policy_groups": 0, "request_fraction": 1.0}}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["peak"] <= got["est"], got
