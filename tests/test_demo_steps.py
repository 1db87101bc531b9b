"""`ulacache demo` wiring: the policy-compare step runs on the demo's own trace, into OUT/policy_compare (where the
report finds it), before the report, with arguments the real `policy-compare` parser accepts."""
from __future__ import annotations

import argparse

import pandas as pd

from ulacache_cli import demo


def test_demo_runs_policy_compare_before_the_report(tmp_path, monkeypatch):
    steps = []
    monkeypatch.setattr(demo, "_step", lambda title, argv: steps.append(argv))
    monkeypatch.setattr(demo, "_rule", lambda title: None)
    monkeypatch.setattr("sim.studies.sweep.run_demo_sweeps",
                        lambda *a, sweeps, **k: {name: pd.DataFrame({"status": ["ok"]}) for name in sweeps})
    monkeypatch.setattr(demo, "HW_RESULTS", tmp_path / "none")
    args = argparse.Namespace(config=demo.DEFAULT_CONFIG, out=tmp_path / "o", num_requests=48, workers=1,
                              slo_tpot_ms=25.0, seed=0)
    assert demo._demo(args) == 0
    commands = [argv[0] for argv in steps]
    assert commands == ["trace", "trace", "policy-compare", "plan", "report"]
    pc = steps[2]
    assert pc[1] == str(tmp_path / "o" / "trace") and pc[pc.index("--out") + 1] == str(tmp_path / "o" /
                                                                                         "policy_compare")
    from ulacache_cli import policy_compare as policy_compare_cli

    parser = argparse.ArgumentParser()
    policy_compare_cli.register(parser.add_subparsers(dest="command"))
    parsed = parser.parse_args(pc)  # the demo's arguments are ones the command takes
    default = parser.parse_args(["policy-compare", "T", "--out", "O"])
    assert parsed.max_steps < default.max_steps  # cut to demo time
