"""`ulacache replay`: simulate one system on one workload (cheap to import: the work is imported in the handler)."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "replay", help="simulate one system (sglang | hisparse | ulacache) on a workload, write metrics.json",
        description="Replay a workload on a modelled node. CONFIG is a YAML of DESIGN §8 keys (see configs/); "
        "--set overrides any dotted key. Writes OUT/metrics.json, OUT/config.yaml and OUT/timeline.parquet.")
    p.add_argument("config", type=Path, help="replay config YAML")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set system=hisparse --set spec.draft_tokens=4")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--calibration", type=Path, default=None, help="calibration YAML from `ulacache hw calibrate`")
    p.add_argument("--trace-events", type=Path, default=None,
                   help="write a Chrome/Perfetto trace of the first output.trace_event_steps decode steps")
    p.add_argument("--trace", type=Path, default=None,
                   help="trace directory (requests.parquet + trace.yaml); default: generate from workload.*")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    import sim

    sets = list(args.sets)
    if args.trace is not None:
        sets.append(f"workload.trace={args.trace}")
    metrics = sim.replay(args.config, args.out, progress=not args.quiet, trace_events=args.trace_events,
                         calibration=args.calibration, overrides=sets)
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
