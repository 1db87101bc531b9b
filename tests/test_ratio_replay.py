"""sim/ratio_replay.py: every group's own replay, recorded, then played back together, gives the full-fidelity
replay's metrics exactly (the timing too, which the by-group hit rate alone cannot)."""
import pytest
from replay_cases import FULL, RUN_ONLY, SMALL_TP

import sim
from sim.ratio_replay import RatioLog, RatioPlayer

CFG = SMALL_TP


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
    with pytest.raises(ValueError, match="set fidelity=full"):
        sim.replay(CFG, overrides=["fidelity.policy_groups=2"], ratio_player=RatioPlayer(logs))
    with pytest.raises(ValueError, match="runs no policy"):
        sim.replay({**CFG, "system": "sglang"}, overrides=FULL, ratio_player=RatioPlayer(logs))
    (tmp_path / "bad.npz").write_bytes(b"no")
    with pytest.raises(ValueError, match="not a ratio log"):
        RatioLog.load(tmp_path / "bad.npz")


def test_streams_played_while_their_replays_run_give_the_full_run(tmp_path):
    """Each group's replay streams its log (sim/ratio_stream.py) while the playback reads it in another thread of
    time: the playback waits where a group is behind and ends with the full run's figures."""
    import threading

    from sim.ratio_stream import RatioStream

    full = sim.replay(CFG, overrides=FULL)
    paths = [tmp_path / f"g{g}.stream" for g in range(4)]
    got = {}

    def play():
        streams = [RatioStream(p, stall_s=120) for p in paths]
        got["m"] = sim.replay(CFG, overrides=FULL, ratio_player=RatioPlayer(streams))

    t = threading.Thread(target=play)
    t.start()  # before any stream exists: it waits for them
    for g, p in enumerate(paths):
        log = RatioLog(stream=p)
        sim.replay(CFG, overrides=FULL + [f"fidelity.only_group={g}"], ratio_log=log)
        assert RatioStream(p).end_vals().tolist() == log.end.tolist()
    t.join(timeout=120)
    m = got["m"]
    assert {k: m[k] for k in full if k not in RUN_ONLY} == {k: full[k] for k in full if k not in RUN_ONLY}


def test_a_stream_that_stalls_or_is_not_one_fails_in_one_line(tmp_path):
    from sim.ratio_stream import RatioStream

    with pytest.raises(ValueError, match="no record for 0 s"):
        RatioStream(tmp_path / "missing.stream", stall_s=0.01)
    (tmp_path / "bad.stream").write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="not a ratio stream"):
        RatioStream(tmp_path / "bad.stream")
