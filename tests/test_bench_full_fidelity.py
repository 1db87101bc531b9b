"""bench/full_fidelity.py: its progress ticks (a cut stopped at --max-wall-s keeps what it had done) and what it
derives from them; sim.replay's callable progress that feeds them."""
import json

import pytest

import sim

CFG = {"system": "ulacache", "attention": "tp", "hardware": {"preset": "h200", "num_gpus": 8}, "policy": "pb-lru",
       "cpu_storage": True, "model": {"preset": "glm-5"},
       "workload": {"num_requests": 4, "max_concurrency": 4, "seed": 3, "max_steps": 30}}


@pytest.fixture(scope="module")
def ff(bench_module):
    return bench_module("full_fidelity")


def test_replay_calls_a_progress_callable_once_a_decode_step():
    calls = []
    m = sim.replay(CFG, progress=lambda done, total: calls.append((done, total)))
    assert len(calls) == m["decode_steps"] == 30
    assert all(total == 4 for _, total in calls) and [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_ticker_prints_every_n_steps_and_the_parent_reads_them(ff, capsys):
    tick = ff._ticker(0.0, 2)
    for _ in range(5):
        tick(1, 4)
    ticks = ff.ticks_of(capsys.readouterr().out.encode())  # (a stopped child's output comes back as bytes)
    assert [t[:2] for t in ticks] == [[2.0, 1.0], [4.0, 1.0]] and ticks[1][2] >= ticks[0][2] > 0


def test_on_step_sees_every_decode_step_and_the_totals_give_the_run_hit_rate(ff, capsys):
    """sim.replay's on_step gets each decode step's record; the bench's TOTALS over them give the run's own hit rate
    and decode tokens at a tick on its last step (and a stopped cut's at its last tick)."""
    recs = []
    totals = ff._Totals(10)

    def both(rec):
        recs.append(rec)
        totals(rec)
    m = sim.replay({**CFG, "ulacache": {"gpu_pool_slots": 20000}}, on_step=both)
    assert len(recs) == 30 and [r["step"] for r in recs] == list(range(30))
    got = ff.totals_of(capsys.readouterr().out)
    assert [t["decode_steps"] for t in got] == [10, 20, 30]
    assert got[-1]["gpu_hit_rate"] == pytest.approx(m["gpu_hit_rate"], abs=1e-6)
    assert m["gpu_hit_rate"] < 1.0 and got[0]["gpu_hit_rate"] != got[-1]["gpu_hit_rate"]  # (a run under pressure)
    assert got[-1]["decode_tokens"] == m["decode_tokens"]
    assert got[-1]["decode_tok_s"] == pytest.approx(m["decode_tokens"] / sum(r["step_s"] for r in recs))
    cut = {"steps": None, "timed_out_after_s": 70, "ticks": [[10, 0, 1.0], [20, 0, 2.0]], "totals": got[:2]}
    assert ff.derive([cut], 30)["stopped_totals"] == got[1]


def test_a_stopped_cut_estimates_the_whole_run_from_its_second_half(ff):
    ticks = [[100, 0, 30.0], [200, 1, 40.0], [300, 2, 52.0], [400, 3, 64.0]]
    got = ff.derive([{"steps": None, "timed_out_after_s": 70, "ticks": ticks}], 1000)
    assert got["stopped_at_steps"] == 400 and got["stopped_requests_done"] == 3
    assert got["stopped_s_per_decode_step"] == pytest.approx(0.12)  # from step 200 on, not the start-up's 0.3
    assert got["stopped_full_run_estimate_s"] == pytest.approx(64 + 0.12 * 600)
    assert ff.derive([{"steps": None, "timed_out_after_s": 70, "ticks": ticks[:1]}], 1000) == {}


def test_fidelity_error_takes_a_whole_full_run_from_a_full_fidelity_json(tmp_path, bench_module):
    fe = bench_module("fidelity_error")
    cut = {"steps": None, "wall_s": 321.0, "gpu_hit_rate": 0.5, "decode_throughput_tok_s": 4000.0,
           "steady_mean_concurrency": 140.0, "tpot_ms_p50": 30.0, "steady_window_steps": 400}
    ok = {"config": "configs/paper-h200-dp-specon.yaml", "sets": [], "cuts": [{"steps": 8, "wall_s": 9.0}, cut],
          "tree": "abc1234", "device_kind": "H100"}
    (tmp_path / "ok.json").write_text(json.dumps(ok))
    rec = fe.full_records([tmp_path / "ok.json"])["paper-h200-dp-specon/full"]
    assert rec["status"] == "ok" and rec["commit"] == "abc1234" and rec["wall_s"] == 321.0
    assert rec["metrics"]["gpu_hit_rate"] == 0.5 and rec["metrics"]["attention"] == "dp"
    assert rec["metrics"]["hardware"] == "h200" and rec["metrics"]["draft_tokens"] > 0
    for bad in ({**ok, "sets": ["workload.max_concurrency=64"]}, {**ok, "cuts": [{"steps": None,
                                                                                   "timed_out_after_s": 60}]}):
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(ValueError, match="not a whole full-fidelity run"):
            fe.full_records([tmp_path / "bad.json"])


def _drain_run(steps: int, num_requests: int, admitted: int, a: float, b: float):
    """Ticks every 100 steps of a run whose requests finish one per `steps // num_requests` steps after step 100,
    each step costing a + b x running; and its whole wall."""
    per = steps // num_requests
    ticks, wall = [], 0.0
    for s in range(1, steps + 1):
        done = min(num_requests, max(0, (s - 100) // per))
        wall += a + b * min(admitted, num_requests - done)
        if s % 100 == 0:
            ticks.append([float(s), float(done), wall])
    return ticks, wall


def test_the_drain_estimate_recovers_a_run_that_costs_a_line_in_its_running_requests(bench_module):
    de = bench_module("drain_estimate")
    ticks, wall = _drain_run(2200, 200, 150, 0.05, 0.004)  # 150 of 200 admitted: it drains from step ~650
    got = de.estimate(ticks[:11], [t[:2] + [0.0] for t in ticks], 2200, 200, 150)
    assert got["drain_fit_a_s"] == pytest.approx(0.05, rel=0.05)
    assert got["drain_fit_b_s"] == pytest.approx(0.004, rel=0.05)
    assert got["drain_estimate_s"] == pytest.approx(wall, rel=0.02)
    assert got["curve_mismatch_requests"] == 0
    assert de.estimate(ticks, ticks, 2200, 200, 150)["drain_rest_s"] == 0.0  # stopped at the end: nothing left
    flat = ticks[10][2] + (ticks[10][2] - ticks[5][2]) / 500 * (2200 - 1100)  # the second-half extrapolation
    assert flat > wall * 1.1  # (overstates a draining run)


def test_the_drain_estimate_reads_bench_jsons_and_refuses_what_it_cannot_use(bench_module, tmp_path, capsys):
    de = bench_module("drain_estimate")
    ticks, _ = _drain_run(1000, 100, 100, 0.01, 0.002)
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"cuts": [{"steps": None, "decode_steps": 1000, "max_admitted_concurrency": 100,
                                         "ticks": ticks}]}))
    stopped = tmp_path / "stopped.json"
    stopped.write_text(json.dumps({"cuts": [{"steps": None, "timed_out_after_s": 9, "ticks": ticks[:6]}],
                                   "derived": {}}))
    assert de.main([str(stopped), "--reference", str(ref), "--num-requests", "100", "--write"]) == 0
    assert json.loads(stopped.read_text())["derived"]["drain_estimate_s"] == pytest.approx(ticks[-1][2], rel=0.02)
    stopped.write_text(json.dumps({"cuts": [{"steps": None, "timed_out_after_s": 9, "ticks": ticks[:3]}]}))
    capsys.readouterr()
    assert de.main([str(stopped), "--reference", str(ref), "--num-requests", "100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    stopped.write_text("not json")
    assert de.main([str(stopped), "--reference", str(ref), "--num-requests", "100"]) == 2
    assert capsys.readouterr().err.startswith(f"error: stopped {stopped}: not a readable JSON file")


def test_a_cut_runs_in_a_child_and_a_slow_one_is_stopped(ff, tmp_path):
    import argparse

    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    args = argparse.Namespace(config=cfg, sets=["fidelity.policy_groups=2"], policy_workers=1, policy_backend="numpy",
                              max_memory_gb=None, profile_top=0, max_wall_s=300.0, dense_map_gb=None)
    row = ff.run_cut(args, 10)  # (FULL first, then --set: a default-fidelity cut)
    assert row["decode_steps"] == 10 and row["steps"] == 10 and row["ticks"] == [] and row["totals"] == []
    args.max_wall_s = 0.3
    assert ff.run_cut(args, None) == {"steps": None, "timed_out_after_s": 0.3, "ticks": [], "totals": []}


@pytest.mark.parametrize("argv, message", [
    (["configs/nope.yaml"], "error: config file not found: configs/nope.yaml"),
    (["configs/demo.yaml", "--steps", "-5"], "error: --steps and --profile-top must be >= 0"),
    (["configs/demo.yaml", "--max-wall-s", "nan"], "error: --max-wall-s must be > 0, got nan"),
    (["configs/demo.yaml", "--dense-map-gb", "0"], "error: --dense-map-gb must be a number > 0"),
    (["configs/demo.yaml", "--set", "workload.foo=1"], "error: configs/demo.yaml: unknown config key 'workload.foo'"),
])
def test_full_fidelity_refuses_bad_arguments_in_one_line_before_any_cut(ff, monkeypatch, capsys, tmp_path, argv,
                                                                         message):
    monkeypatch.chdir(ff.ROOT)
    monkeypatch.setattr("sys.argv", ["full_fidelity.py", *argv, "--out", str(tmp_path / "o.json")])
    monkeypatch.setattr(ff, "run_cut", lambda *a: pytest.fail("a cut started"))
    assert ff.main() == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1 and not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--only", "nope"], "--only: unknown config 'nope'"),
    (["--jobs", "0"], "--jobs must be at least 1"),
    (["--add", "bogus"], "--add takes default, fraction_4"),
    (["--hits-from", "nope.json"], "nope.json: no such file"),
    (["--full-from", "README.md"], "--full-from README.md: not a readable JSON file"),
    (["--add", "default", "--out", "absent.json"], "absent.json: no study to add to"),
])
def test_fidelity_error_refuses_bad_arguments_in_one_line(bench_module, monkeypatch, capsys, argv, message):
    fe = bench_module("fidelity_error")
    monkeypatch.chdir(fe.ROOT)
    monkeypatch.setattr(fe, "run_all", lambda *a: pytest.fail("a replay started"))
    monkeypatch.setattr(fe, "save", lambda *a: pytest.fail("a result was written"))
    assert fe.main(["--paper", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fidelity_error: {message}") and err.count("\n") == 1
