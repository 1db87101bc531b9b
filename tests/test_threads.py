"""ulacache/threads.py: large gathers and scatters split over threads give the one-thread results bit for bit, in
the library's TP local buffers too; the thread count is checked."""
import numpy as np
import pytest

from ulacache import CacheConfig, UlaCache, threads
from ulacache.slot_map import DenseSlotMaps


@pytest.fixture
def small_parts(monkeypatch):
    """Every array of 4+ items split over 3 threads (the default splits only very large ones)."""
    monkeypatch.setattr(threads, "MIN_ITEMS", 4)
    threads.set_threads(3)
    yield
    threads.set_threads(None)


def test_scatter_take_and_over_match_one_thread(small_parts):
    rng = np.random.default_rng(5)
    src = rng.integers(0, 1 << 30, 1000)
    at = rng.permutation(1000)[:777]
    assert np.array_equal(threads.take(src, at), src.take(at))
    dst, ref = np.zeros(1000, dtype=np.int32), np.zeros(1000, dtype=np.int32)
    vals = rng.integers(1, 99, at.size).astype(np.int32)
    threads.scatter(dst, at, vals)
    ref[at] = vals
    assert np.array_equal(dst, ref)
    seen = []
    threads.over(12, lambda lo, hi: seen.append((lo, hi)))
    assert sorted(seen) == [(0, 4), (4, 8), (8, 12)]
    seen.clear()
    threads.over(10, lambda lo, hi: seen.append((lo, hi)))  # each part holds MIN_ITEMS or more
    assert sorted(seen) == [(0, 5), (5, 10)]
    threads.over(7, lambda lo, hi: seen.append((lo, hi)))  # too small to split
    assert seen[-1] == (0, 7)


def test_thread_count_from_the_environment(monkeypatch):
    threads.set_threads(None)
    monkeypatch.setenv(threads.ENV_VAR, "3")
    assert threads.threads() == 3
    monkeypatch.setenv(threads.ENV_VAR, "many")
    with pytest.raises(ValueError, match="ULACACHE_THREADS"):
        threads.threads()
    monkeypatch.delenv(threads.ENV_VAR)
    assert threads.threads() == 2
    with pytest.raises(ValueError):
        threads.set_threads(0)


def _tp_run():
    """A TP cache whose small local buffers insert and evict every step: its plans' counts and its maps' table."""
    c = UlaCache(CacheConfig(mode="tp", num_ranks=4, gpu_slots=40, cpu_slots=200, policy="pb-lru",
                             local_buffer_slots=48, payload_bytes=2))
    rng = np.random.default_rng(3)
    a = c.alloc_many([1, 2, 3], [300, 300, 300])
    c.write(a, rng.integers(0, 255, (a.size, 2), dtype=np.uint8))
    out = []
    for _ in range(40):
        plan = c.access(rng.choice(a, 40, replace=False))
        c.commit(plan)
        out.append(plan.counts())
        for r in range(4):
            assert np.array_equal(c.read_local(plan.addrs, r), c.read(plan.addrs))
    c.check_invariants()
    assert isinstance(c.buffers.maps, DenseSlotMaps)
    return out, c.buffers.maps.table.copy()


def test_tp_local_buffers_are_the_same_on_threads(small_parts):
    threads.set_threads(1)
    one_counts, one_table = _tp_run()
    threads.set_threads(3)
    calls = []
    real = threads.over
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(threads, "over", lambda size, fn: (calls.append(size), real(size, fn)))
        many_counts, many_table = _tp_run()
    assert calls and max(calls) >= 12  # the inserts and row reads went through the threads
    assert sum(c["num_peer_fetches"] for c in one_counts) > 0 and sum(c["num_local_hits"] for c in one_counts) > 0
    assert many_counts == one_counts and np.array_equal(many_table, one_table)


def test_a_2d_scatter_with_repeats_and_the_marker_dedup_match_one_thread(small_parts):
    from ulacache.backends.numpy_backend import NumpyBackend

    rng = np.random.default_rng(9)
    addrs = rng.integers(-1, 500, (7, 33))  # repeated addresses and -1 padding, as a step's selections
    marker = np.zeros(600, dtype=bool)
    got = NumpyBackend._dedup_marker(addrs, marker)
    want = np.unique(addrs[addrs >= 0])
    assert np.array_equal(got, want) and not marker.any()
    assert np.array_equal(threads.flatnonzero(marker | (np.arange(600) % 7 == 0)), np.arange(0, 600, 7))


def test_a_bad_thread_count_is_one_line_before_the_run(tmp_path, monkeypatch, capsys):
    import yaml

    from ulacache_cli.main import main

    threads.set_threads(None)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"system": "ulacache", "attention": "tp", "hardware": {"preset": "h200", "num_gpus": 8},
                                   "model": {"preset": "glm-5"}, "workload": {"num_requests": 2, "max_steps": 5}}))
    monkeypatch.setenv(threads.ENV_VAR, "two")
    assert main(["replay", str(cfg), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "ULACACHE_THREADS" in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
