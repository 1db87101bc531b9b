"""HiSparse replays of issue 10 for two commits, alternating: bench/scale_bench.py's own runs (batch1: 4 requests at
concurrency 1, draft 0 / 4, dp / tp, h200 / b300; pinned: 24 requests at 24), each replay in a fresh process of the
commit's tree (`git archive` into a temporary directory), CPU-s (user + sys) and peak RSS from wait4, wall, load.

Usage: python bench/hisparse_ab.py BEFORE AFTER OUT.json [--sections batch1,pinned] [--repeats N] [--filter S]
Runs alternate before / after per replay (load drifts alike on both); writes every run, the best CPU-s per replay and
tree, and whether the two trees' metrics agree (wall-clock and memory figures aside), with date, command, commits,
machine and load.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {  # the labels scale_bench gives hisparse's replays
    "batch1": [f"hisparse-{att}-{hw}-draft{d}" for hw in ("h200", "b300") for d in (0, 4) for att in ("dp", "tp")],
    "pinned": [f"hisparse-{att}-{hw}" for hw in ("h200", "b300") for att in ("dp", "tp")],
}
VOLATILE = ("sim_wall_s", "sim_cpu_s", "peak_rss_bytes", "est_peak_memory_bytes")  # not results of the simulation


def export(commit: str, into: Path) -> str:
    """The commit's tree unpacked into `into`; returns the full commit id."""
    full = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", full.strip()], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return full.strip()


def replay(tree: Path, section: str, label: str, scratch: Path) -> dict:
    """One scale_bench replay run by the tree's own bench script (its library, its simulator)."""
    out = scratch / "one.json"
    out.unlink(missing_ok=True)
    subprocess.run([sys.executable, "bench/scale_bench.py", "--only", section, "--filter", label, "--out", str(out)],
                   cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True, capture_output=True)
    row = json.loads(out.read_text())["sections"][section]["runs"][label]
    keep = ("status", "cpu_s", "wall_s", "peak_rss_gb", "load_avg_before", "load_avg_after", "metrics")
    return {k: row.get(k) for k in keep}


def run_ab(bench: str, before: str, after: str, cases: list[tuple[str, str]], repeats: int, out: str) -> int:
    """Each (section, label) replayed by the `before` and the `after` commit alternately (load drifts alike on both),
    `repeats` rounds; writes every run, the best CPU-s and largest peak RSS per replay and tree, and whether the
    trees' metrics agree (wall-clock, CPU and memory figures aside; `metrics_differ` names the keys that do not),
    with date, command, commits, machine and load. Shared by the A/B benches (small_batch_ab.py)."""
    with tempfile.TemporaryDirectory(prefix=f"{bench}_") as tmp:
        tmp = Path(tmp)
        trees = {"before": tmp / "before", "after": tmp / "after"}
        commits = {"before": export(before, trees["before"]), "after": export(after, trees["after"])}
        runs = []
        for section, label in cases:
            for i in range(repeats):
                for name, tree in trees.items():
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
    for section, labels in summary.items():
        for label, s in labels.items():
            ms = [{k: v for k, v in (r["metrics"] or {}).items() if k not in VOLATILE and "wall" not in k}
                  for r in runs if r["section"] == section and r["label"] == label]
            s["metrics_identical"] = all(m == ms[0] for m in ms) and bool(ms[0])
            differ = sorted({k for m in ms for k in m if m.get(k) != ms[0].get(k)})
            if differ:
                s["metrics_differ"] = differ
    write_result(bench, out, commits, summary, runs)
    return 0


def write_result(bench: str, out: str, commits: dict, summary: dict, runs: list) -> dict:
    """Write an A/B's JSON (date, command, machine, load at the end, both commits, summary, every run) and print the
    summary: the one result layout of the A/B benches (this one, small_batch_ab, facade_trace ab)."""
    result = {"bench": bench, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
              "load_avg_end": os.getloadavg(), "before": commits["before"], "after": commits["after"],
              "summary": summary, "runs": runs}
    Path(out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("out")
    ap.add_argument("--sections", default="batch1,pinned")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--filter", default="", help="only replays whose label contains this")
    args = ap.parse_args()
    cases = [(sec, label) for sec in args.sections.split(",") for label in SECTIONS[sec] if args.filter in label]
    return run_ab("hisparse_ab", args.before, args.after, cases, args.repeats, args.out)

if __name__ == "__main__":
    sys.exit(main())
