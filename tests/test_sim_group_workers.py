"""Group workers (sim/group_workers.py): a replay's simulated groups split over processes give every metric of the
one-process run, and a child's failure or death reaches the parent as an error."""
import os
import signal

import pytest

import sim
import sim.policy
from sim.group_workers import ENV_VAR, GroupWorkers, resolve_processes
from ulacache import threads

DROP = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "sim_cpu_s", "peak_rss_bytes",
        "est_peak_memory_bytes", "policy_processes", "policy_threads", "policy_probe_step_ms"}  # (the process's, not the run's)


def _cfg(system: str, attention: str, concurrency: int, **extra) -> dict:
    cfg = {"system": system, "attention": attention, "hardware": {"preset": "h200", "num_gpus": 8},
           "policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"},
           "workload": {"num_requests": 6, "max_concurrency": concurrency, "seed": 3, "max_steps": 60}}
    cfg.update(extra)
    return cfg


CASES = {
    "ulacache tp, pilot then 2 groups": _cfg("ulacache", "tp", 3),
    "ulacache tp, batch 1, 4 draft tokens": _cfg("ulacache", "tp", 1, spec={"draft_tokens": 4}),
    "ulacache dp, 3 groups, no pilot": _cfg("ulacache", "dp", 4, fidelity={"policy_groups": 3, "pilot_steps": 0}),
    "hisparse dp, coarse pilot": _cfg("hisparse", "dp", 6, fidelity={"request_fraction": 0.5}),
    "ulacache tp, no cpu, small gpu pool": _cfg("ulacache", "tp", 6, cpu_storage=False,
                                                ulacache={"gpu_pool_slots": 60000}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_metrics_equal_across_process_counts(name, monkeypatch):
    monkeypatch.setattr(sim.policy, "FORK_MIN_STEP_S", 0.0)  # fork after the probe however short the steps
    one = sim.replay(CASES[name], policy_workers=1)
    assert one["policy_processes"] == 1
    for n in (2, 3):
        many = sim.replay(CASES[name], policy_workers=n)
        assert many["policy_processes"] == min(n, many["policy_groups_simulated"])
        assert many["policy_processes"] > 1
        assert {k: v for k, v in many.items() if k not in DROP} == {k: v for k, v in one.items() if k not in DROP}
        assert many["peak_rss_bytes"] > 0
        assert many["policy_threads"] == one["policy_threads"] == threads.threads()


def test_policy_threads_reports_the_library_threads(monkeypatch):
    monkeypatch.setattr(sim.policy, "FORK_MIN_STEP_S", 0.0)
    threads.set_threads(None)
    monkeypatch.setenv(threads.ENV_VAR, "3")
    assert sim.replay(CASES["ulacache tp, pilot then 2 groups"], policy_workers=2)["policy_threads"] == 3


def test_short_steps_stay_in_one_process(monkeypatch):
    monkeypatch.setattr(sim.policy, "FORK_MIN_STEP_S", 3600.0)
    m = sim.replay(CASES["ulacache tp, pilot then 2 groups"], policy_workers=2)
    assert m["policy_processes"] == 1
    assert m["policy_probe_step_ms"] > 0  # the probe ran (it chose one process)


@pytest.mark.parametrize("name", ["ulacache dp, 3 groups, no pilot", "ulacache tp, 3 groups, no pilot"])
def test_a_heavy_run_without_a_pilot_splits_before_its_caches_exist(name, monkeypatch):
    """Above SPLIT_FIRST_MIN_REFS references a step, a run without a pilot forks at once (no probe) and each process
    builds its own share's caches: the same metrics as one process."""
    cfg = CASES.get(name) or _cfg("ulacache", "tp", 3, fidelity={"policy_groups": 3, "pilot_steps": 0})
    monkeypatch.setattr(sim.policy, "SPLIT_FIRST_MIN_REFS", 1)
    one = sim.replay(cfg, policy_workers=1)
    many = sim.replay(cfg, policy_workers=3)
    assert many["policy_processes"] == 3 and "policy_probe_step_ms" not in many
    assert {k: v for k, v in many.items() if k not in DROP} == {k: v for k, v in one.items() if k not in DROP}
    monkeypatch.setattr(sim.policy, "SPLIT_FIRST_MIN_REFS", 1 << 62)  # below it: the probe decides, as before
    monkeypatch.setattr(sim.policy, "FORK_MIN_STEP_S", 3600.0)
    probed = sim.replay(cfg, policy_workers=3)
    assert probed["policy_processes"] == 1 and probed["policy_probe_step_ms"] > 0


def test_resolve_processes(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert resolve_processes(3) == 3
    assert resolve_processes(None) >= 1
    monkeypatch.setenv(ENV_VAR, "1")
    assert resolve_processes(None) == 1
    monkeypatch.setenv(ENV_VAR, "two")
    with pytest.raises(ValueError, match=ENV_VAR):
        resolve_processes(None)
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="processes >= 1"):
            resolve_processes(bad)


class _Runner:
    """What GroupWorkers needs of a runner: `after_fork`, `keep_groups`, `device_pool_bytes`, and the methods the
    parent sends."""

    def __init__(self):
        self.groups = []
        self.log = []

    def after_fork(self):
        self.log.append("forked")

    def keep_groups(self, groups):
        self.groups = list(groups)

    def device_pool_bytes(self):
        return 7

    def note(self, x):
        self.log.append(x)

    def report(self):
        return self.groups, self.log, os.getpid()

    def boom(self, text):
        raise ValueError(text)


def test_workers_run_calls_in_order_and_report():
    w = GroupWorkers(_Runner(), [[1, 3], [2]])
    try:
        w.send("note", "a")
        w.send("note", "b")
        w.send("report", reply=True)
        (g1, log1, pid1), (g2, log2, pid2) = w.gather()
        assert (g1, g2) == ([1, 3], [2])
        assert log1 == log2 == ["forked", "a", "b"]  # `after_fork` before anything the parent sends
        assert len({pid1, pid2, os.getpid()}) == 3
    finally:
        w.close()
    assert w.extra_rss_bytes > 0
    assert w.extra_device_bytes == 14  # each child's `device_pool_bytes` at its end, summed
    assert not w.children


def test_a_child_failure_is_raised_in_the_parent():
    w = GroupWorkers(_Runner(), [[1]])
    try:
        w.send("boom", "no room")  # no reply asked: raised at the next call that waits
        w.send("report", reply=True)
        with pytest.raises(ValueError, match="no room"):
            w.gather()
    finally:
        w.close()


def test_a_dead_child_is_an_error_not_a_hang():
    w = GroupWorkers(_Runner(), [[1]])
    pid = w.children[0][0]
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with pytest.raises((RuntimeError, OSError)):
        w.send("report", reply=True)
        w.gather()
    w.kill()


def test_a_queued_failure_at_the_end_is_raised_by_close():
    w = GroupWorkers(_Runner(), [[1], [2]])
    w.send("boom", "at the end")
    with pytest.raises(ValueError, match="at the end"):
        w.close()
    assert not w.children


def test_cli_replay_runs_groups_in_the_processes_asked(tmp_path, monkeypatch, capsys):
    import json

    import yaml

    from ulacache_cli.main import main

    monkeypatch.setattr(sim.policy, "FORK_MIN_STEP_S", 0.0)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CASES["ulacache tp, pilot then 2 groups"]))
    assert main(["replay", str(cfg), "--out", str(tmp_path / "o"), "--quiet", "--policy-workers", "2"]) == 0
    got = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert got["policy_processes"] == 2
    one = sim.replay(CASES["ulacache tp, pilot then 2 groups"])  # the Python API: one process unless asked
    assert one["policy_processes"] == 1 and "policy_probe_step_ms" not in one  # (nothing to choose)
    assert {k: v for k, v in got.items() if k not in DROP} == json.loads(json.dumps(
        {k: v for k, v in one.items() if k not in DROP}))
    assert main(["replay", str(cfg), "--out", str(tmp_path / "p"), "--policy-workers", "0"]) == 2
    assert "--policy-workers" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
