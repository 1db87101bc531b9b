"""Steady-state throughput (issue 11 item 1): concurrency held at the cap by refills, warm-up and drain left out."""
import pandas as pd
import pytest

import sim


def _config(profile, system="sglang", num_requests=16, cap=4):
    return {"system": system, "attention": "dp", "model": {"preset": "glm-5.2", "weight_bytes": 100e9},
            "hardware": {"preset": "h200", "num_gpus": 2},
            "workload": {"profile": profile, "num_requests": num_requests, "max_concurrency": cap, "seed": 2},
            "memory": {"gpu_kv_bytes_per_gpu": 1.0e9, "cpu_kv_bytes_per_gpu": 4e9},
            "fidelity": {"policy_groups": 2, "pilot_steps": 0, "request_fraction": 1.0}}


@pytest.mark.parametrize("system", ["sglang", "ulacache"])
def test_window_holds_the_cap_and_leaves_out_warmup_and_drain(profile, tmp_path, system):
    m = sim.replay(_config(profile, system), tmp_path / "run")
    tl = pd.read_parquet(tmp_path / "run" / "timeline.parquet")
    assert m["steady_window_steps"] > 0 and m["tpot_source"] == "steady window"
    first_finish = int(tl.index[tl["finished"] > 0][0])
    win = tl[tl["saturated"]].iloc[-m["steady_window_steps"]:]
    assert (win["batch"] == 4).all()  # held at the cap
    assert win["step"].min() > first_finish  # warm-up left out
    assert not tl["saturated"].iloc[-1]  # the drain is not in the window
    assert m["decode_throughput_tok_s"] == pytest.approx(win["tokens"].sum() / win["step_s"].sum())
    assert m["run_throughput_tok_s"] == pytest.approx(tl["tokens"].sum() / tl["step_s"].sum())
    assert m["tpot_ms_p50"] <= m["tpot_ms_p90"]


def test_sglang_steady_figure_beats_the_run_average_with_its_drain(profile):
    m = sim.replay(_config(profile))
    assert m["decode_throughput_tok_s"] > m["run_throughput_tok_s"]


def test_without_refills_the_whole_run_is_reported(profile):
    m = sim.replay(_config(profile, num_requests=4, cap=8))
    assert m["steady_window_steps"] == 0 and m["tpot_source"] == "whole run"
    assert m["decode_throughput_tok_s"] == m["run_throughput_tok_s"]


def test_default_request_count_gives_a_steady_window(profile):
    """A config without workload.num_requests draws 2 x cap requests: the cap is held by refills for a window."""
    cfg = _config(profile, system="ulacache")
    del cfg["workload"]["num_requests"]
    m = sim.replay(cfg)
    assert m["num_requests"] == 8 and m["completed_requests"] == 8
    assert m["steady_window_steps"] > 0 and m["tpot_source"] == "steady window"
