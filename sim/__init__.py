"""sim: the simpy discrete-event simulator of DP/TP sparse-attention decode on 8-GPU nodes.

Public API: `replay(config, out_dir, progress, trace_events, calibration)` -> metrics dict, `load_config(path,
overrides)` -> resolved config dict, `CostModel` (sim.costs) for `hw validate`. This package is the simulator core;
what is built on many replays (sweep, plan, sensitivity, policy-compare) is sim.studies, and the commands' front-ends
are in ulacache_cli.
"""
from __future__ import annotations


def replay(config, out_dir=None, progress=False, trace_events=None, calibration=None, overrides=None,
           max_memory_gb=None, policy_workers=1, policy_backend=None, on_step=None,
           ratio_log=None, ratio_player=None, dense_map_gb=None):
    from sim.run import replay as _replay

    return _replay(config, out_dir, progress=progress, trace_events=trace_events, calibration=calibration,
                   overrides=overrides, max_memory_gb=max_memory_gb, policy_workers=policy_workers,
                   policy_backend=policy_backend, on_step=on_step,
                   ratio_log=ratio_log, ratio_player=ratio_player, dense_map_gb=dense_map_gb)


def load_config(path, overrides=None) -> dict:
    from sim.config import load_config as _load

    return _load(path, overrides)


__all__ = ["replay", "load_config"]
