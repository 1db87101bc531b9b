"""Reports select runs on the System facts the simulator records (metrics.json), not on system names; result files
written before the facts were recorded fall back to what those systems were then (reports.frame.fact)."""
from __future__ import annotations

import pandas as pd
import pytest

from reports.figures import Skip, peak_speedups, policy_hit_rate
from reports.frame import X, fact, prepare


def _runs(system: str, recorded: dict | None) -> pd.DataFrame:
    rows = []
    for policy, hit in (("pb-lru", 0.91), ("lru", 0.90)):
        for cap in (8, 16):
            rows.append({"system": system, "policy": policy, "attention": "tp", X: cap, "gpu_hit_rate": hit,
                         "decode_throughput_tok_s": 100.0 * cap, "status": "ok", **(recorded or {})})
    return pd.DataFrame(rows)


def test_recorded_facts_win_over_names_and_old_files_fall_back():
    df = pd.DataFrame({"system": ["ulacache", "newsys", "hisparse", "ulacache"],
                       "configurable_policy": [False, True, None, None]})
    assert fact(df, "configurable_policy").tolist() == [False, True, False, True]
    assert fact(df, "speedup_baseline").tolist() == [False, False, True, False]  # column absent: all by name
    old = pd.DataFrame({"system": ["sglang", "ulacache", "unknown"]})
    assert fact(old, "configurable_policy").tolist() == [False, True, False]


def test_policy_figure_selects_on_configurable_policy(tmp_path):
    fig = policy_hit_rate(prepare(_runs("newsys", {"configurable_policy": True})), None, tmp_path)
    assert fig.table["difference_pt"].round(6).tolist() == [1.0, 1.0]
    with pytest.raises(Skip):  # a system named ulacache that records no configurable policy is not drawn
        policy_hit_rate(prepare(_runs("ulacache", {"configurable_policy": False})), None, tmp_path)
    assert policy_hit_rate(prepare(_runs("ulacache", None)), None, tmp_path).table is not None  # old files


def test_speedups_are_over_the_recorded_baseline(tmp_path):
    runs = pd.concat([_runs("base", {"speedup_baseline": True}), _runs("fast", {"speedup_baseline": False})])
    runs.loc[runs["system"] == "fast", "decode_throughput_tok_s"] *= 3
    table = peak_speedups(prepare(runs), None, tmp_path).table
    assert dict(zip(table["system"], table["speedup_vs_hisparse"])) == {"base": 1.0, "fast": 3.0}
