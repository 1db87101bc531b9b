"""`ulacache policy-compare`: the reference stream, our exact lru against libCacheSim's LRU, the CLI's outputs."""
import json

import numpy as np
import pytest

from sim.studies import peers
from sim.studies.policy_compare import ReferenceStream, compare, replay_ours
from ulacache_cli.main import main

HAS_LCS = peers.available() is not None
needs_lcs = pytest.mark.skipif(not HAS_LCS, reason="libcachesim (extra 'peers') not installed")


def _stream(batches: list[np.ndarray], num_positions: int) -> ReferenceStream:
    ids = np.concatenate(batches).astype(np.int64)
    bounds = np.concatenate([[0], np.cumsum([b.size for b in batches])]).astype(np.int64)
    return ReferenceStream(ids, bounds, np.diff(bounds), np.array([num_positions], np.int64), 0, 1)


def _zipf_ids(n: int, universe: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.zipf(1.3, n) * 7919 + rng.integers(0, 3, n)) % universe


@needs_lcs
@pytest.mark.parametrize("slots", [1, 7, 64, 200])
def test_exact_lru_equals_libcachesim_lru_hit_for_hit(slots):
    ids = _zipf_ids(1500, 400, seed=slots)
    st = _stream([np.array([x]) for x in ids], 400)  # one reference per batch: no ties, strict sequence
    _, _, ours = replay_ours(st, "lru", slots, hit_masks=True)
    theirs = peers.hit_mask("lcs-lru", st.ids, slots)
    assert 0 < theirs.sum() < theirs.size  # both hits and misses occur
    np.testing.assert_array_equal(ours, theirs)


@needs_lcs
def test_batched_feed_order_puts_lru_hits_first(tmp_path):
    """The defined order (most recently referenced first) makes every LRU hit of a batch precede every miss."""
    from sim.studies.policy_compare import extract_stream
    from traces import generate_trace, open_trace

    path = generate_trace(tmp_path / "t", profile="small", num_requests=3, seed=1, num_groups=3)
    st = extract_stream(open_trace(path), group=2, concurrency=3, max_steps=12)
    mask = peers.hit_mask("lcs-lru", st.ids, 9000)
    for b in range(st.num_batches):
        m = mask[st.bounds[b]:st.bounds[b + 1]]
        assert not (np.diff(m.astype(np.int8)) > 0).any(), f"batch {b}: a hit after a miss"
    assert 0 < mask.sum() < mask.size


def test_stream_is_deduplicated_and_replays(tmp_path):
    from traces import generate_trace

    path = generate_trace(tmp_path / "t", profile="small", num_requests=4, seed=2, num_groups=3)
    rows, meta = compare(path, [6000, 30000], group=1, warmup_steps=3, concurrency=2, query_tokens=2,
                         max_steps=10, peers=False)
    assert meta["distinct_refs_total"] < meta["refs_total"]  # two verify tokens share selections
    assert meta["num_steps"] == 10 and meta["note"] and "libcachesim" not in {r["implementation"] for r in rows}
    by = {(r["policy"], r["gpu_slots"]): r for r in rows}
    for p in ("pb-lru", "lru"):
        assert 0 <= by[(p, 6000)]["hit_ratio"] <= by[(p, 30000)]["hit_ratio"] <= 1  # a bigger pool never hurts LRU
        assert by[(p, 6000)]["refs"] == meta["distinct_refs_counted"]


def test_cli_writes_tables_refuses_overwrite_and_bad_input(tmp_path, capsys):
    from traces import generate_trace

    path = generate_trace(tmp_path / "t", profile="small", num_requests=3, seed=3, num_groups=2)
    out = tmp_path / "pc"
    args = ["policy-compare", str(path), "--out", str(out), "--gpu-slots", "7000,12000", "--warmup-steps", "2",
            "--max-steps", "6", "--concurrency", "3"]
    assert main(args) == 0
    o = capsys.readouterr().out
    assert "hit ratio after warm-up" in o
    doc = json.loads((out / "policy_compare.json").read_text())
    import pandas as pd

    df = pd.read_parquet(out / "policy_compare.parquet")
    want = {"pb-lru", "lru"} | (set(peers.PEERS) if HAS_LCS else set())
    assert set(df["policy"]) == want and set(df["gpu_slots"]) == {7000, 12000}
    assert (doc["libcachesim"] is None) == (not HAS_LCS) and len(doc["rows"]) == len(df)
    if HAS_LCS:  # Belady is the offline optimum: no policy beats it on the same references
        for size, g in df.groupby("gpu_slots"):
            lcs = g[g["implementation"] == "libcachesim"].set_index("policy")["hit_ratio"]
            assert lcs["belady"] >= lcs.max() - 1e-12
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for bad in (args, args[:-6] + ["--gpu-slots", "2x"], args[:-6] + ["--gpu-slots", "100"],
                args[:-6] + ["--group", "9"], args[:-6] + ["--warmup-steps", "500"]):
        assert main(bad + ["--force"] if bad is not args else bad) == 2
        err = capsys.readouterr().err
        assert err.startswith("ulacache: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["policy-compare", str(tmp_path / "none"), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
