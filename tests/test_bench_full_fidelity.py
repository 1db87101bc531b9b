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
