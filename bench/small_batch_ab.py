"""Batch-1 (and pinned) ulacache replays of issue 10 for two commits, alternating, for the library's small-batch
work: bench/hisparse_ab.py's runner (each replay by the commit's own bench/scale_bench.py in a fresh process of the
commit's tree; CPU-s user + sys and peak RSS from wait4; wall; load) over another system's labels.

Usage: python bench/small_batch_ab.py BEFORE AFTER OUT.json [--system ulacache] [--sections batch1,pinned]
       [--filter S] [--repeats N]   (sections: batch1, pinned, paper)
Writes every run, the best CPU-s and the largest peak RSS per replay and tree, and whether the trees' metrics agree
(wall-clock and memory figures aside), with date, command, commits, machine and load.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hisparse_ab import run_ab  # noqa: E402


def labels(system: str, section: str) -> list[str]:
    """scale_bench's labels of the system's replays in a section."""
    if section == "batch1":
        return [f"{system}-{att}-{hw}-draft{d}" for hw in ("h200", "b300") for d in (0, 4) for att in ("dp", "tp")]
    if section == "paper":  # configs/paper-h200-tp-specon.yaml (ulacache only)
        return ["ulacache-tp-h200-specon"] if system == "ulacache" else []
    return [f"{system}-{att}-{hw}" for hw in ("h200", "b300") for att in ("dp", "tp")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("out")
    ap.add_argument("--system", default="ulacache")
    ap.add_argument("--sections", default="batch1,pinned")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--filter", default="", help="only replays whose label contains one of these (comma-separated)")
    args = ap.parse_args()
    wanted = args.filter.split(",")
    cases = [(sec, label) for sec in args.sections.split(",") for label in labels(args.system, sec)
             if any(w in label for w in wanted)]
    return run_ab("small_batch_ab", args.before, args.after, cases, args.repeats, args.out)


if __name__ == "__main__":
    sys.exit(main())
