"""`ulacache report DIR`: figures + index.html from the result files under DIR (cheap to import).

The drawing is the `reports` package's (which imports only pandas, matplotlib and the standard library); writing the
output dir is the shared output helper's (traces.atomic), as for every other command: refused before drawing without
--force, and with it unless the dir is an earlier report (its manifest); drawn into a hidden sibling, renamed in whole.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="draw the comparison figures and a static HTML page from result files",
        description="Reads sweep tables (results.parquet), replay metrics.json, plan.json and hw validate.json "
        "found under DIR and writes PNG figures and index.html (default: DIR/report/).")
    p.add_argument("dir", type=Path, help="directory holding result files (searched recursively)")
    p.add_argument("--out", type=Path, default=None, help="output dir (default: DIR/report)")
    p.add_argument("--force", action="store_true", help="replace an earlier report in the output dir (only one `ulacache report` wrote: its manifest)")
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from reports import build_report
    from traces.atomic import StagedDir, check_out_path

    out = args.out if args.out is not None else args.dir / "report"
    if not args.dir.is_dir():
        raise ValueError(f"{args.dir}: result dir not found" if not args.dir.exists() else f"{args.dir}: not a "
                         "directory")
    check_out_path(out, args.force, command="report", what="report")
    with StagedDir(out, command="report", replace=args.force) as stage:
        index = build_report(args.dir, stage.path)
        stage.publish()
    print(f"report: {out / index.name}")
    return 0
