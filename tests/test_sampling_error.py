"""sim/sampling_error.py: the measured sampling error a sampled run states, and the committed table's provenance."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.config import build, load_config
from sim.sampling_error import TABLE_PATH, is_sampled, load_table, sampling_error

ROOT = Path(__file__).resolve().parents[1]
FULL = ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0"]


def _cfg(name: str, sets=()):
    return build(load_config(ROOT / "configs" / f"{name}.yaml", list(sets)))


def _table(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"source": "bench/results/fidelity_error.json", "date": "2026-12-06",
                                "commit": "abc", "scale": "cap 8", "definition": "default - full", "rows": rows}))
    return path


ROW = {"hardware": "h200", "attention": "tp", "spec": True, "system": "ulacache", "config": "paper-h200-tp-specon",
       "hit_rate_error_points": 12.5, "tok_s_error_pct": 7.0, "tpot_p50_error_pct": -6.0,
       "default_fidelity": {"policy_groups": 2, "request_fraction": 0.0625, "step_stride": 1, "pilot_steps": 4}}


def test_match_returns_the_row_and_its_provenance(tmp_path):
    path = _table(tmp_path, [ROW, {**ROW, "spec": False, "config": "paper-h200-tp-specoff", "tok_s_error_pct": 1.0}])
    none = tmp_path / "no_paper_table.json"  # (the reduced table alone)
    got = sampling_error(_cfg("paper-h200-tp-specon"), path, none)
    assert got["hit_rate_error_points"] == 12.5 and got["tok_s_error_pct"] == 7.0
    assert got["measured_config"] == "paper-h200-tp-specon" and got["fidelity_matches"] is True
    assert got["source"] == "bench/results/fidelity_error.json" and got["date"] == "2026-12-06"
    assert got["scale"] == "cap 8"
    other = sampling_error(_cfg("paper-h200-tp-specon", ["fidelity.request_fraction=0.125"]), path, none)
    assert other["fidelity_matches"] is False and other["tok_s_error_pct"] == 7.0


def test_a_hit_rate_only_measurement_of_the_very_run_says_so(tmp_path):
    """A paper row made from the groups alone (bench/full_fidelity_by_group.py) has no throughput error: the run
    states its hit-rate error, marked, with the reduced-scale row beside it."""
    reduced = _table(tmp_path, [ROW])
    (tmp_path / "paper").mkdir()
    workload = {"profile": "multi-lexsum", "trace": None, "num_requests": 256, "max_concurrency": 256,
                "max_steps": 0, "seed": 0}
    paper = _table(tmp_path / "paper", [{**ROW, "hit_rate_error_points": 2.8, "tok_s_error_pct": None,
                                         "tpot_p50_error_pct": None, "hit_rate_only": True,
                                         "measured_workload": workload}])
    got = sampling_error(_cfg("paper-h200-tp-specon"), reduced, paper)
    assert got["measured_run"] is True and got["hit_rate_only"] is True
    assert got["hit_rate_error_points"] == 2.8 and got["tok_s_error_pct"] is None
    assert got["reduced_scale"]["tok_s_error_pct"] == 7.0 and "hit_rate_only" not in got["reduced_scale"]


def test_no_match_and_full_run_give_none(tmp_path):
    path, none = _table(tmp_path, [ROW]), tmp_path / "no_paper_table.json"
    assert sampling_error(_cfg("paper-h200-tp-specon", ["system=sglang"]), path, none) is None
    assert sampling_error(_cfg("paper-b300-tp-specon"), path, none) is None
    assert sampling_error(_cfg("paper-h200-dp-specon"), path, none) is None
    assert sampling_error(_cfg("paper-h200-tp-specoff"), path, none) is None
    full = _cfg("paper-h200-tp-specon", FULL)
    assert not is_sampled(full) and sampling_error(full, path) is None
    assert sampling_error(_cfg("paper-h200-tp-specon"), tmp_path / "missing.json", none) is None


def test_a_paper_scale_measurement_comes_beside_the_reduced_one(tmp_path):
    reduced = _table(tmp_path, [ROW])
    (tmp_path / "paper").mkdir()
    paper = _table(tmp_path / "paper", [{**ROW, "hit_rate_error_points": 0.5}, {**ROW, "attention": "dp",
                                                                               "config": "paper-h200-dp-specon"}])
    got = sampling_error(_cfg("paper-h200-tp-specon"), reduced, paper)
    assert got["hit_rate_error_points"] == 12.5 and got["paper_scale"]["hit_rate_error_points"] == 0.5
    only_paper = sampling_error(_cfg("paper-h200-dp-specon"), reduced, paper)  # (the reduced table lacks it)
    assert only_paper["measured_config"] == "paper-h200-dp-specon" and "paper_scale" not in only_paper
    assert sampling_error(_cfg("paper-h200-tp-specon"), reduced, tmp_path / "none.json").get("paper_scale") is None


def test_the_measured_run_states_its_own_paper_scale_error(tmp_path):
    """A run with the workload a paper-scale row measured gets that row first, the reduced one beside it; the same
    configuration on other requests keeps the reduced row first."""
    wl = _cfg("paper-h200-tp-specon").workload
    measured = {k: getattr(wl, k) for k in ("profile", "trace", "num_requests", "max_concurrency", "max_steps", "seed")}
    reduced = _table(tmp_path, [ROW])
    (tmp_path / "paper").mkdir()
    paper = _table(tmp_path / "paper", [{**ROW, "hit_rate_error_points": 0.5, "measured_workload": measured}])
    got = sampling_error(_cfg("paper-h200-tp-specon"), reduced, paper)
    assert got["measured_run"] is True and got["hit_rate_error_points"] == 0.5
    assert got["reduced_scale"]["hit_rate_error_points"] == 12.5 and "paper_scale" not in got
    other = sampling_error(_cfg("paper-h200-tp-specon", ["workload.num_requests=64"]), reduced, paper)
    assert other["hit_rate_error_points"] == 12.5 and other["paper_scale"]["hit_rate_error_points"] == 0.5
    assert "measured_run" not in other


def test_any_sampling_knob_counts_as_sampled():
    assert is_sampled(_cfg("paper-h200-tp-specon", ["fidelity.policy_groups=0"]))  # request_fraction 1/16
    assert is_sampled(_cfg("paper-h200-tp-specon", ["fidelity.request_fraction=1.0"]))  # 2 groups
    assert is_sampled(_cfg("paper-h200-tp-specon", FULL + ["fidelity.step_stride=2"]))


def test_committed_table_names_its_source_and_covers_the_paper_configs():
    table = load_table(TABLE_PATH)
    assert (ROOT / table["source"]).is_file(), table["source"]
    assert table["date"] and table["scale"] and table["commit"]
    names = {r["config"] for r in table["rows"]}
    assert names == {f"paper-{hw}-{att}-spec{s}" for hw in ("h200", "b300") for att in ("dp", "tp")
                     for s in ("on", "off")}
    source = json.loads((ROOT / table["source"]).read_text())
    by_config = {r["config"]: r for r in source["table"]}
    for row in table["rows"]:  # the lookup table is the bench's result, not numbers typed in
        src = by_config[row["config"]]
        for key in ("hit_rate_error_points", "tok_s_error_pct", "hit_rate_error_points_matched",
                    "tok_s_error_pct_matched"):
            assert (key in row) == (key in src) and row.get(key) == pytest.approx(src.get(key)), key


@pytest.mark.parametrize("name", ["paper-h200-tp-specon", "paper-b300-dp-specoff"])
def test_each_paper_config_finds_its_own_row(name):
    got = sampling_error(_cfg(name))
    assert got is not None and got["measured_config"] == name and got["fidelity_matches"] is True
    assert (ROOT / got["source"]).is_file()


def test_paper_matched_error_when_the_table_has_it(tmp_path):
    """A row with the paper-matched replay's errors returns them (and other seeds' that have them) beside the
    reduced default's; a row without them returns no `paper_matched`."""
    matched = {"hit_rate_error_points_matched": 0.4, "tok_s_error_pct_matched": 0.7, "tpot_p50_error_pct_matched": -0.6,
               "sampled_per_space_matched": 9, "request_sample_stride_matched": 4}
    seeds = [{"seed": 1, "hit_rate_error_points": 4.3, "tok_s_error_pct": 6.8, "tpot_p50_error_pct": -6.0,
              "hit_rate_error_points_matched": 0.9, "tok_s_error_pct_matched": 0.1, "tpot_p50_error_pct_matched": 0.0}]
    path = _table(tmp_path, [{**ROW, **matched, "other_seeds": seeds}, {**ROW, "spec": False, "config": "x"}])
    got = sampling_error(_cfg("paper-h200-tp-specon"), path, tmp_path / "no_paper_table.json")
    assert got["hit_rate_error_points"] == 12.5  # the reduced default's, unchanged
    pm = got["paper_matched"]
    assert pm["hit_rate_error_points"] == 0.4 and pm["tok_s_error_pct"] == 0.7 and pm["sampled_per_space"] == 9
    assert pm["other_seeds"] == [{"seed": 1, "hit_rate_error_points": 0.9, "tok_s_error_pct": 0.1,
                                  "tpot_p50_error_pct": 0.0}]
    assert "paper_matched" not in sampling_error(_cfg("paper-h200-tp-specoff"), path)


def test_committed_paper_table_is_its_bench_result():
    from sim.sampling_error import PAPER_TABLE_PATH

    table = load_table(PAPER_TABLE_PATH)
    source = json.loads((ROOT / table["source"]).read_text())
    assert source["meta"]["scale"]["label"] == "paper scale" and table["rows"]
    by_config = {r["config"]: r for r in source["table"] + source.get("hit_table", [])}
    for row in table["rows"]:
        for key in ("hit_rate_error_points", "tok_s_error_pct", "hit_rate_default", "hit_rate_full"):
            assert row[key] == (pytest.approx(by_config[row["config"]][key]) if row[key] is not None
                                else by_config[row["config"]][key]), key
    got = sampling_error(_cfg(table["rows"][0]["config"]))  # the measured run itself: its paper-scale error first
    assert got["measured_run"] is True and got["measured_config"] == table["rows"][0]["config"]
    assert got["hit_rate_error_points"] == pytest.approx(table["rows"][0]["hit_rate_error_points"])
    assert "reduced_scale" in got
