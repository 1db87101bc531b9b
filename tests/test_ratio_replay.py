"""sim/ratio_replay.py: every group's own replay, recorded, then played back together, gives the full-fidelity
replay's metrics exactly (the timing too, which the by-group hit rate alone cannot)."""
import pytest

import sim
from sim.ratio_replay import RatioLog, RatioPlayer

CFG = {"system": "ulacache", "attention": "tp", "hardware": {"preset": "h200", "num_gpus": 8}, "policy": "pb-lru",
       "cpu_storage": True, "model": {"preset": "glm-5", "num_index_groups": 4},
       "ulacache": {"gpu_pool_slots": 20000},
       "workload": {"num_requests": 4, "max_concurrency": 4, "seed": 3, "max_steps": 25}}
FULL = ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0", "fidelity.step_stride=1"]
RUN_ONLY = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "est_peak_memory_bytes",
            "peak_rss_bytes"}  # how the replay ran, not what it simulated


def _logs(cfg: dict, sets: list[str], tmp_path, groups=range(4)) -> list[RatioLog]:
    out = []
    for g in groups:
        log = RatioLog()
        sim.replay(cfg, overrides=FULL + sets + [f"fidelity.only_group={g}"], ratio_log=log)
        log.save(tmp_path / f"g{g}.npz")
        out.append(RatioLog.load(tmp_path / f"g{g}.npz"))  # (through the file, as the bench keeps them)
    return out


@pytest.mark.parametrize("sets", [[], ["spec.draft_tokens=4", "workload.prefill=chunked"]],
                         ids=["plain", "spec-chunked"])
def test_played_back_groups_give_the_full_run(tmp_path, sets):
    full = sim.replay(CFG, overrides=FULL + sets)
    assert 0.0 < full["gpu_hit_rate"] < 1.0  # under pressure: the groups' hits matter to the timing
    played = sim.replay(CFG, overrides=FULL + sets, ratio_player=RatioPlayer(_logs(CFG, sets, tmp_path)))
    differ = {k: (full[k], played.get(k)) for k in full if k not in RUN_ONLY and full[k] != played.get(k)}
    assert not differ
    assert played["decode_throughput_tok_s"] == full["decode_throughput_tok_s"]


def test_one_group_standing_for_all_is_not_the_full_run(tmp_path):
    """The timing does depend on which group's ratios each layer gets (else the test above could not fail)."""
    full = sim.replay(CFG, overrides=FULL)
    alone = sim.replay(CFG, overrides=FULL + ["fidelity.only_group=0"])
    assert alone["decode_throughput_tok_s"] != full["decode_throughput_tok_s"]


def test_logs_that_do_not_fit_are_refused_in_one_line(tmp_path):
    logs = _logs(CFG, [], tmp_path)
    with pytest.raises(ValueError, match="missing \\[3\\]"):
        sim.replay(CFG, overrides=FULL, ratio_player=RatioPlayer(logs[:3]))
    with pytest.raises(ValueError, match="in two logs"):
        RatioPlayer(logs + logs[:1])
    other = {**CFG, "workload": {**CFG["workload"], "seed": 4}}
    with pytest.raises(ValueError, match="batches other requests"):
        sim.replay(other, overrides=FULL, ratio_player=RatioPlayer(logs))
    with pytest.raises(ValueError, match="different decode batches"):
        RatioPlayer(logs[:3] + _logs(other, [], tmp_path / "o", groups=[3]))
    with pytest.raises(ValueError, match="runs no policy"):
        sim.replay({**CFG, "system": "sglang"}, overrides=FULL, ratio_player=RatioPlayer(logs))
    (tmp_path / "bad.npz").write_bytes(b"no")
    with pytest.raises(ValueError, match="not a ratio log"):
        RatioLog.load(tmp_path / "bad.npz")
