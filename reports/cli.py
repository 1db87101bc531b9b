"""`ulacache report DIR`: figures + index.html from the result files under DIR (cheap to import)."""
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
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from reports import build_report

    index = build_report(args.dir, args.out)
    print(f"report: {index}")
    return 0
