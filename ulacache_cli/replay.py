"""`ulacache replay`: simulate one system on one workload (cheap to import: the work is imported in the handler)."""
from __future__ import annotations

import argparse
from pathlib import Path

from sim.policy_backend import CHOICES as POLICY_BACKENDS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="simulate one system (sglang | hisparse | ulacache) on a workload, write metrics.json",
        description="Replay a workload on a modelled node. CONFIG is a YAML of config keys (docs/config.md; see configs/); "
        "--set overrides any dotted key. Writes OUT/metrics.json, OUT/config.yaml and OUT/timeline.parquet.")
    p.add_argument("config", type=Path, help="replay config YAML")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set system=hisparse --set spec.draft_tokens=4; the "
                        "value read as YAML (8, true, 2.5e9, [0.5, 0.5], null for none), the same for replay, sweep and plan")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--calibration", type=Path, default=None, help="calibration YAML from `ulacache hw calibrate`; default: the preset's committed calibration (hw/calibration/), 'none' for the uncalibrated costs.yaml")
    p.add_argument("--trace-events", type=Path, default=None,
                   help="write a Chrome/Perfetto trace of the first output.trace_event_steps decode steps")
    p.add_argument("--trace", type=Path, default=None,
                   help="trace directory (requests.parquet + trace.yaml); default: generate from workload.*")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.add_argument("--max-memory-gb", type=float, default=None, metavar="GB",
                   help="refuse (exit 2) a replay whose estimated peak memory exceeds this (default: what the "
                   "machine has available; a larger figure is taken as given: the estimate ran 11%% under to 25%% "
                   "over measured peaks)")
    p.add_argument("--force", action="store_true",
                   help="replace an earlier run in --out (and --trace-events file) that `ulacache replay` wrote and "
                        "nobody changed since (its manifest); anything else is refused")
    p.add_argument("--policy-workers", type=int, default=None, metavar="N",
                   help="processes the simulated indexer groups run in (default $ULACACHE_POLICY_WORKERS, else the "
                   "usable cores); every metric but the wall time is the same for any N")
    p.add_argument("--policy-backend", choices=POLICY_BACKENDS, default=None,
                   help="array backend the policy caches run on (default $ULACACHE_POLICY_BACKEND, else numpy; auto: "
                   "cupy where a CUDA device is usable, else numpy); every metric but the wall time is the same on any")
    p.add_argument("--dense-map-gb", type=float, default=None, metavar="GB",
                   help="keep each policy cache's TP address maps one dense table up to this size (default: the "
                   "library's rule, at most 1 GiB and 4x hash maps): faster for memory where few groups run at once "
                   "(fidelity.only_group); every metric but the wall time and memory is the same")
    p.set_defaults(func=_replay)


RUN_FILES = ("metrics.json", "config.yaml", "timeline.parquet")


def _events_inside(out: Path, events: Path | None) -> Path | None:
    """`--trace-events` as a path relative to `--out` when it lies inside it (README: runs/x/perfetto.json), else None."""
    import os

    if events is None:
        return None
    rel = os.path.relpath(os.path.abspath(events), os.path.abspath(out))
    if rel == "." or rel == ".." or rel.startswith(".." + os.sep):
        if rel == ".":
            raise ValueError(f"--trace-events {events}: is the --out directory itself; give a file name")
        return None
    return Path(rel)


def _replay(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    import sim
    from traces.atomic import StagedDir, StagedFile, check_out_path

    sets = list(args.sets)
    if args.trace is not None:
        sets.append(f"workload.trace={args.trace}")
    # Refuse before simulating: an earlier run is replaced only with --force, and only one this tool wrote (its
    # manifest); the run is written into a hidden sibling dir and renamed into place whole, so a failure leaves what
    # was on disk byte-identical. A --trace-events file inside --out is written into the run dir itself.
    if args.max_memory_gb is not None and not 0 < args.max_memory_gb < float("inf"):
        raise ValueError(f"--max-memory-gb must be a finite number > 0, got {args.max_memory_gb}")
    if args.policy_workers is not None and args.policy_workers < 1:
        raise ValueError(f"--policy-workers must be a whole number >= 1, got {args.policy_workers}")
    check_out_path(args.out, args.force, command="replay", what="replay run")
    inside = _events_inside(args.out, args.trace_events)
    if inside is not None and inside.parts[0] in RUN_FILES:
        raise ValueError(f"--trace-events {args.trace_events}: would overwrite the run's own {inside.parts[0]}")
    with ExitStack() as stack:
        stage = stack.enter_context(StagedDir(args.out, command="replay", replace=args.force))
        events = None
        if args.trace_events is not None and inside is None:
            events = stack.enter_context(StagedFile(args.trace_events, command="replay --trace-events",
                                                    replace=args.force))
            events_path = events.path
        elif inside is not None:
            events_path = stage.path / inside
            events_path.parent.mkdir(parents=True, exist_ok=True)
        metrics = sim.replay(args.config, stage.path, progress=not args.quiet,
                             trace_events=events_path if args.trace_events is not None else None,
                             calibration=args.calibration, overrides=sets, max_memory_gb=args.max_memory_gb,
                             policy_workers=args.policy_workers, policy_backend=args.policy_backend,
                             dense_map_gb=args.dense_map_gb)
        stage.publish()
        if events is not None:
            events.publish()
    if not args.quiet:
        keys = ("system", "attention", "completed_requests", "max_admitted_concurrency", "decode_throughput_tok_s",
                "tpot_ms_p50", "gpu_hit_rate", "pcie_bytes_per_token", "nvlink_bytes_per_token",
                "physical_kv_slots", "unique_history_positions", "sim_wall_s")
        for key in keys:
            value = metrics.get(key)
            text = f"{value:,.4g}" if isinstance(value, float) else str(value)
            print(f"{key:28s} {text}")
        print(f"wrote {args.out / 'metrics.json'}")
    return 0
