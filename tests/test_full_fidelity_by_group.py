"""bench/full_fidelity_by_group.py and fidelity.only_group: every group's replay alone, weighted by its layers, gives
the full-fidelity replay's hit rate (the groups are independent caches fed the same decode batches)."""
import argparse

import pytest
import yaml
from replay_cases import SMALL_TP

import sim

CFG = SMALL_TP


@pytest.fixture(scope="module")
def byg(bench_module):
    return bench_module("full_fidelity_by_group")


def test_the_groups_alone_give_the_full_runs_hit_rate_and_a_rerun_resumes(byg, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    out = tmp_path / "r.json"
    args = argparse.Namespace(config=cfg, sets=[], groups=None, processes=2, check_full=True, out=out,
                              ratios=tmp_path / "ratios", dense_map_gb=byg.DENSE_MAP_GB)
    got = byg.run(args)
    layers = got["layers"]
    assert len(layers) == 4 and len(set(layers)) > 1  # (unequal weights: the weighting is tested)
    rates = [got["groups"][str(g)]["gpu_hit_rate"] for g in range(4)]
    assert len(set(rates)) == 4 and max(rates) < 1.0  # groups that differ, under pressure
    comb, full = got["combined"], got["full_run"]
    assert comb["same_batches"] and comb["groups"] == comb["of_groups"] == 4
    assert comb["gpu_hit_rate"] == pytest.approx(full["gpu_hit_rate"], rel=1e-12)
    assert comb["decode_tokens"] == full["decode_tokens"]
    assert comb["gpu_hit_rate"] != pytest.approx(sum(rates) / 4, rel=1e-9)  # not an unweighted mean
    played = got["played"]  # every group's ratios played back: the full run's timing too, not only its hit rate
    assert played["hit_rate_matches_combined"]
    assert {k: played[k] for k in full if k not in ("peak_rss_bytes", "sim_wall_s", "wall_s")} == \
        {k: full[k] for k in full if k not in ("peak_rss_bytes", "sim_wall_s", "wall_s")}
    assert len(played["ratio_logs"]) == 4 and played["streamed"]  # played while the groups ran, from their streams
    assert sorted(x.name for x in (tmp_path / "ratios").iterdir()) == [f"group_0{g}.npz" for g in range(4)]
    capsys.readouterr()
    args.check_full = False
    again = byg.run(args)  # every group kept in --out: none replayed
    assert "group " not in capsys.readouterr().out
    assert again["combined"] == comb and not again["played"]["streamed"]  # played from the finished logs
    (tmp_path / "ratios" / "group_02.npz").unlink()
    third = byg.run(args)  # a group whose ratio log is gone is replayed again (its log rewritten)
    assert capsys.readouterr().out.count("group ") == 1 and third["played"]["decode_throughput_tok_s"] == \
        full["decode_throughput_tok_s"]


def test_only_group_is_checked_and_runs_one_group(tmp_path):
    with pytest.raises(ValueError, match="fidelity.only_group"):
        sim.replay({**CFG, "fidelity": {"only_group": 4}})
    m = sim.replay({**CFG, "fidelity": {"only_group": 1, "policy_groups": 0, "request_fraction": 1.0}})
    assert m["policy_groups_simulated"] == 1


def test_the_fidelity_study_takes_a_by_group_hit_rate(bench_module, tmp_path):
    """bench/fidelity_error.py --hits-from: a hit-rate-only row where no whole full replay exists, and only for the
    default's own batches."""
    import json

    fe = bench_module("fidelity_error")
    comb = {"gpu_hit_rate": 0.4, "groups": 21, "of_groups": 21, "same_batches": True, "decode_steps": 10,
            "decode_tokens": 50.0}
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"config": "configs/paper-h200-tp-specon.yaml", "sets": [], "combined": comb,
                                "tree": "abc"}))
    recs = fe.hit_records([path])
    dm = {"hardware": "h200", "attention": "tp", "draft_tokens": 4, "system": "ulacache", "gpu_hit_rate": 0.5,
          "decode_throughput_tok_s": 100.0, "steady_window_steps": 3, "request_sample_stride": 16,
          "policy_groups_simulated": 2, "decode_steps": 10}
    recs["paper-h200-tp-specon/default"] = {"status": "ok", "metrics": dm}
    (row,) = fe.hit_rows(recs)
    assert row["hit_rate_error_points"] == pytest.approx(10.0) and row["tok_s_error_pct"] is None
    assert row["hit_rate_only"] and row["source_full"] == str(path)
    assert fe.hit_rows({**recs, "paper-h200-tp-specon/default": {"status": "ok",
                                                                   "metrics": {**dm, "decode_steps": 11}}}) == []
    assert fe.hit_rows({**recs, "paper-h200-tp-specon/full": {"status": "ok"}}) == []  # a whole run wins
    path.write_text(json.dumps({"config": "configs/paper-h200-tp-specon.yaml", "sets": [],
                                "combined": {**comb, "groups": 20}}))
    with pytest.raises(ValueError, match="not every group"):
        fe.hit_records([path])


def test_a_played_back_full_run_joins_the_fidelity_table(bench_module, tmp_path):
    """A by-group JSON with `played` (every group's ratios played back) gives the config a whole `full` record: the
    table's tok/s error, costed at all its replays' wall time."""
    import json

    fe = bench_module("fidelity_error")
    comb = {"gpu_hit_rate": 0.4, "groups": 21, "of_groups": 21, "same_batches": True, "decode_steps": 10,
            "decode_tokens": 50.0}
    fm = {"gpu_hit_rate": 0.4, "decode_throughput_tok_s": 90.0, "tpot_ms_p50": 10.0, "tpot_source": "steady",
          "steady_window_steps": 3, "steady_mean_concurrency": 4.0, "request_sample_stride": 1,
          "policy_groups_simulated": 21, "hardware": "h200", "attention": "tp", "draft_tokens": 4,
          "system": "ulacache", "num_requests": 8, "decode_steps": 10, "peak_rss_bytes": 5.0}
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"config": "configs/paper-h200-tp-specon.yaml", "sets": [], "combined": comb,
                                "groups": {"0": {"wall_s": 10.0, "peak_rss_bytes": 7.0},
                                           "1": {"wall_s": 20.0, "peak_rss_bytes": 6.0}},
                                "played": {**fm, "wall_s": 3.0, "hit_rate_matches_combined": True}}))
    recs = fe.hit_records([path])
    full = recs["paper-h200-tp-specon/full"]
    assert full["played"] and full["metrics"]["sim_wall_s"] == 33.0 and full["metrics"]["peak_rss_bytes"] == 7.0
    data = json.loads(path.read_text())
    data["played"].update(streamed=True, wall_s=500.0)  # beside the groups: its wall time is waiting for them
    path.write_text(json.dumps(data))
    assert fe.hit_records([path])["paper-h200-tp-specon/full"]["metrics"]["sim_wall_s"] == 30.0
    data["played"]["cpu_s"] = 2.0
    path.write_text(json.dumps(data))
    assert fe.hit_records([path])["paper-h200-tp-specon/full"]["metrics"]["sim_wall_s"] == 32.0
    dm = {**fm, "gpu_hit_rate": 0.5, "decode_throughput_tok_s": 99.0, "request_sample_stride": 16,
          "policy_groups_simulated": 2, "sim_wall_s": 1.0}
    recs["paper-h200-tp-specon/default"] = {"status": "ok", "metrics": dm}
    (row,) = fe.table_rows(recs)
    assert row["tok_s_error_pct"] == pytest.approx(10.0) and row["hit_rate_error_points"] == pytest.approx(10.0)
    assert fe.hit_rows(recs) == []  # the whole record wins over the hit-rate-only one
    data = json.loads(path.read_text())
    data["played"]["hit_rate_matches_combined"] = False
    path.write_text(json.dumps(data))
    assert "paper-h200-tp-specon/full" not in fe.hit_records([path])


@pytest.mark.parametrize("change, message", [
    ({"processes": 0}, "--processes must be at least 1, got 0"),
    ({"dense_map_gb": -1.0}, "--dense-map-gb must be a number > 0"),
    ({"groups": [1, 4, -1]}, "--groups -1 4: this config has groups 0-3"),
    ({"ratios": "file"}, "--ratios .*: cannot create the directory"),
])
def test_bad_arguments_are_one_line_before_any_replay(byg, tmp_path, monkeypatch, change, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    (tmp_path / "file").write_text("")  # a path under a file: no directory can be made there
    fields = {"config": cfg, "sets": [], "groups": None, "processes": 2, "check_full": False,
              "out": tmp_path / "r.json", "ratios": None, "dense_map_gb": byg.DENSE_MAP_GB}
    fields.update(change)
    if change.get("ratios"):
        fields["ratios"] = tmp_path / "file" / "ratios"
    monkeypatch.setattr(byg, "in_processes", lambda *a: pytest.fail("a replay started"))
    with pytest.raises(ValueError, match=message):
        byg.run(argparse.Namespace(**fields))
    assert not (tmp_path / "r.json").exists()


def test_the_command_prints_a_bad_argument_in_one_line(byg, tmp_path, monkeypatch, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    argv = ["full_fidelity_by_group.py", str(cfg), "--out", str(tmp_path / "r.json"), "--processes", "0"]
    monkeypatch.setattr("sys.argv", argv)
    assert byg.main() == 2
    err = capsys.readouterr().err
    assert err == "error: --processes must be at least 1, got 0\n"
