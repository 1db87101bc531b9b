"""Batch-1 (and pinned) ulacache replays of issue 10 for two commits, alternating, for the library's small-batch
work: bench/hisparse_ab.py's runner (each replay by the commit's own bench/scale_bench.py in a fresh process of the
commit's tree; CPU-s user + sys and peak RSS from wait4; wall; load) over another system's labels.

Usage: python bench/small_batch_ab.py BEFORE AFTER OUT.json [--system ulacache] [--sections batch1,pinned]
       [--filter S] [--repeats N]
Writes every run, the best CPU-s and the largest peak RSS per replay and tree, and whether the trees' metrics agree
(wall-clock and memory figures aside), with date, command, commits, machine and load.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hisparse_ab import VOLATILE, export, replay  # noqa: E402


def labels(system: str, section: str) -> list[str]:
    """scale_bench's labels of the system's replays in a section."""
    if section == "batch1":
        return [f"{system}-{att}-{hw}-draft{d}" for hw in ("h200", "b300") for d in (0, 4) for att in ("dp", "tp")]
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
    runs = []
    with tempfile.TemporaryDirectory(prefix="small_batch_ab_") as tmp:
        tmp = Path(tmp)
        trees = {name: tmp / name for name in ("before", "after")}
        commits = {name: export(getattr(args, name), path) for name, path in trees.items()}
        for section in args.sections.split(","):
            for label in (x for x in labels(args.system, section) if any(w in x for w in wanted)):
                for i in range(args.repeats):
                    for name, tree in trees.items():  # alternate: load drifts alike on both trees
                        row = {"section": section, "label": label, "tree": name, "repeat": i,
                               **replay(tree, section, label, tmp)}
                        runs.append(row)
                        print(f"{section:7s} {label:26s} {name:6s} {row['status']:>6s} {row['cpu_s'] or 0:7.2f} cpu-s "
                              f"{row['wall_s']:7.2f} s {row['peak_rss_gb'] or 0:5.2f} GB load "
                              f"{row['load_avg_before'][0]:.2f}", flush=True)
    summary = {}
    for row in runs:
        s = summary.setdefault(row["section"], {}).setdefault(row["label"], {})
        key = f"{row['tree']}_cpu_s_min"
        s[key] = min(s.get(key, float("inf")), row["cpu_s"] or float("inf"))
        rss = f"{row['tree']}_peak_rss_gb_max"
        s[rss] = max(s.get(rss, 0.0), row["peak_rss_gb"] or 0.0)
    for section, rows in summary.items():
        for label, s in rows.items():
            ms = [{k: v for k, v in (r["metrics"] or {}).items() if k not in VOLATILE + ("sim_cpu_s",) and "wall" not in k}
                  for r in runs if r["section"] == section and r["label"] == label]
            s["metrics_identical"] = all(m == ms[0] for m in ms) and bool(ms[0])
            differ = sorted({k for m in ms for k in m if m.get(k) != ms[0].get(k)})
            if differ:
                s["metrics_differ"] = differ
    result = {"bench": "small_batch_ab", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
              "load_avg_end": os.getloadavg(), "before": commits["before"], "after": commits["after"],
              "summary": summary, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
