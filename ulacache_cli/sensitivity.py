"""`ulacache sensitivity CONFIG --out DIR`: +-50% on each assumed constant -> table (csv, parquet) + JSON."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sensitivity", help="perturb each assumed cost-model constant by +-50%%; how far throughput, TPOT, admission move",
        description="Replays CONFIG once as is and twice per assumed constant of the fidelity ledger (docs/cost-model.md) "
        "at 0.5x and 1.5x its value, on a small workload unless --full (16 requests at concurrency 16, 32 steps). "
        "Writes DIR/sensitivity.csv, DIR/sensitivity.parquet and DIR/sensitivity.json; `reports/tornado.py` draws them.")
    p.add_argument("config", type=Path, help="replay config YAML")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (applied after the small workload)")
    p.add_argument("--out", type=Path, required=True, help="output directory (must not exist unless --force)")
    p.add_argument("--calibration", default=None, help="calibration YAML, or 'none'; default: the preset's own")
    p.add_argument("--full", action="store_true", help="keep the config's workload instead of the small one")
    p.add_argument("--force", action="store_true", help="replace an earlier sensitivity output (its manifest)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_run)


def write(result: dict, out: Path, force: bool = False) -> None:
    """Write the table and JSON into a hidden sibling of `out` and rename it into place (traces.atomic): a refused
    or failed command leaves what was on disk untouched; --force replaces only an earlier sensitivity output."""
    import pandas as pd

    from traces.atomic import StagedDir, check_out_path

    check_out_path(out, force, command="sensitivity", what="sensitivity output")
    with StagedDir(out, command="sensitivity", replace=force) as stage:
        table = pd.DataFrame(result["rows"])
        table.to_csv(stage.path / "sensitivity.csv", index=False)
        table.to_parquet(stage.path / "sensitivity.parquet", index=False)
        (stage.path / "sensitivity.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
        stage.publish()


def _run(args: argparse.Namespace) -> int:
    from sim.studies import sensitivity
    from traces.atomic import check_out_path

    check_out_path(args.out, args.force, command="sensitivity", what="sensitivity output")  # before the replays
    tick = None if args.quiet else (lambda i, n: print(f"sensitivity: {i}/{n} constants", flush=True))
    result = sensitivity.run(args.config, args.sets, calibration=args.calibration, full=args.full, progress=tick)
    write(result, args.out, force=args.force)
    if not args.quiet:
        b = result["base"]
        print(f"base: {b['throughput_tok_s']:,.0f} tok/s, TPOT {b['tpot_ms']:.2f} ms, admitted {b['admitted']:.0f}")
        print(f"{'constant':34s} {'x':>4s} {'d thr %':>8s} {'d TPOT %':>9s} {'d adm %':>8s}")
        for r in sorted(result["rows"], key=lambda r: result["ranking"].index(r["constant"])):
            print(f"{r['constant']:34s} {r['factor']:4.1f} {r['d_throughput_tok_s_pct']:8.2f} {r['d_tpot_ms_pct']:9.2f} "
                  f"{r['d_admitted_pct']:8.2f}")
        _print_topology(result)
        print(f"wrote {args.out}/sensitivity.csv, .parquet, .json ({result['replays']} replays, "
              f"{result['wall_s']:.0f} s)")
    return 0


def _print_topology(result: dict) -> None:
    """The node-topology values at the ends of their plausible ranges (sim/studies/sensitivity.py TOPOLOGY)."""
    rows = result.get("topology_rows") or []
    if not rows:
        return
    print("node topology (low .. high end of each value's sourced range):")
    print(f"{'value':34s} {'end':>4s} {'at':>10s} {'d thr %':>8s} {'d TPOT %':>9s}")
    for r in rows:
        print(f"{r['constant']:34s} {r['end']:>4s} {r['value']:10.4g} {r['d_throughput_tok_s_pct']:8.2f} "
              f"{r['d_tpot_ms_pct']:9.2f}")
