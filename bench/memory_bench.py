"""Peak memory of the pinned-keys replays against the estimate that refuses them (issue 10 items 1, 3, 4).

Each replay (the DESIGN §8 pinned keys, 24 requests at concurrency 24, for hisparse / ulacache x dp / tp x h200 /
b300; sglang holds no library state) runs alone in a fresh interpreter under an address-space limit; its peak
resident set comes from /usr/bin/time (wait4 rusage of the child itself), beside the estimate
`sim/footprint.py` made before it started (`est_peak_memory_bytes`). Target: peak <= 2 GB; estimate >= peak (an
estimate below the peak lets a replay that does not fit start and be killed).

Usage: python bench/memory_bench.py --tag before|after [--filter LABEL] [--out bench/results/memory.json]
Rows are kept per tag (`runs[label][tag]`), with the commit, date, command, machine and load of each.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from traces.atomic import atomic_write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_bench import PINNED, run_one  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS, ATTENTION, PRESETS = ("hisparse", "ulacache"), ("dp", "tp"), ("h200", "b300")
TARGET_GB = 2.0


def runs() -> list[tuple[str, dict]]:
    out = []
    for hw in PRESETS:
        for att in ATTENTION:
            for system in SYSTEMS:
                tree = {**PINNED, "system": system, "attention": att, "hardware": {"preset": hw, "num_gpus": 8}}
                out.append((f"{system}-{att}-{hw}", tree))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", required=True)
    ap.add_argument("--filter", default="")
    ap.add_argument("--override", action="append", default=[], help="config override KEY=VALUE for every replay")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory.json"))
    ap.add_argument("--commit", default=None, help="the commit measured (default: this checkout's HEAD)")
    args = ap.parse_args()
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {"bench": "memory", "runs": {}}
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                           text=True).stdout.strip()
    dirty = not args.commit and bool(subprocess.run(["git", "status", "--porcelain", "sim", "ulacache"], cwd=ROOT,
                                                    capture_output=True, text=True).stdout.strip())
    result.update({"target_peak_rss_gb": TARGET_GB, "machine": {
        "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)}})
    for label, tree in runs():
        if args.filter and args.filter not in label:
            continue
        row = run_one(tree, args.override, 8.0, 900.0)
        m = row.get("metrics") or {}
        est = m.get("est_peak_memory_bytes")
        row.update({"commit": commit + ("+dirty" if dirty else ""),
                    "command": " ".join([Path(sys.executable).name, *sys.argv]),
                    "overrides": args.override,
                    "est_peak_gb": round(est / 1e9, 3) if est else None,
                    "meets_target": row["status"] == "ok" and (row["peak_rss_gb"] or 0) <= TARGET_GB,
                    "estimate_covers_peak": bool(est and row["peak_rss_gb"] and est / 1e9 >= row["peak_rss_gb"])})
        result["runs"].setdefault(label, {})[args.tag] = row
        print(f"{label:24s} {row['status']:>8s} {row['wall_s']:7.1f} s {row['cpu_s'] or 0:7.1f} cpu-s "
              f"peak {row['peak_rss_gb'] or 0:5.2f} GB est {row['est_peak_gb'] or 0:5.2f} GB", flush=True)
        result["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
