"""How closely the replay's peak-memory estimate (sim/footprint.py, `est_peak_memory_bytes`) tracks the real peak.

Each replay of the grid runs alone in a fresh interpreter under an address-space limit; its peak resident set is the
child's own (os.wait4 rusage, ru_maxrss), beside the estimate the replay made before it started and the estimate's
parts. The estimate must never fall below the peak (ratio estimate / measured >= 1: a replay that does not fit would
start and be killed) and should be as close to 1 as the mechanism allows (a loose estimate refuses runs that fit).
Grid (peak memory is reached at admission, so most runs stop after `workload.max_steps` decode steps):
- pinned:  the pinned keys (docs/architecture.md), 24 requests at concurrency 24, every system x attention x preset (16 steps: the
           pilot of every indexer group and the switch to the simulated groups);
- full:    two pinned runs to completion (the peak of a whole run, not just of its admission);
- batch1:  4 requests at concurrency 1 with 4 draft tokens, hisparse / ulacache x dp / tp, to completion;
- fidelity: every indexer group and every request simulated (policy_groups=0, request_fraction=1.0) at small scale:
           glm-5.2 (21 groups), 8 requests at concurrency 8, a few steps.

Usage: python bench/footprint_accuracy.py --tag before|after [--filter LABEL] [--out bench/results/footprint_accuracy.json]
Rows are kept per label and tag (`runs[label][tag]`), each with its commit, date, command and load; `summary[tag]` has
the min / median / max ratio of the tag's runs. The parent stays small: a child's ru_maxrss also counts the memory
map it was forked from (kept across exec), so a large parent would lift every child's figure to its own.
`--check-cost COMMIT` instead times footprint.check itself (CPU and wall seconds, gc.collect calls by generation) on
the pinned-keys ulacache TP h200 config, in fresh processes, with sim/footprint.py of COMMIT and of this tree, three
times each, alternating (`check_cost` in the JSON).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PINNED = {"policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 0},
          "workload": {"num_requests": 24, "max_concurrency": 24, "seed": 1}}
AS_LIMIT_GB = 8.0
# The child replays the config and prints its metrics and the estimate's parts (footprint.check's dict).
CHILD = """import json, sys
import sim.footprint as fp
import sim
parts = {}
check = fp.check
def traced(*a, **k):
    est = check(*a, **k)
    parts.update(est)
    return est
fp.check = traced
a = json.loads(sys.argv[1])
m = sim.replay(a['config'], overrides=a['overrides'])
print('RESULT ' + json.dumps({'metrics': m, 'parts': {k: v for k, v in parts.items() if isinstance(v, (int, float))}}))
"""


def grid() -> list[tuple[str, dict, list[str]]]:
    """(label, config tree, overrides) of every replay."""
    runs = []
    for hw in ("h200", "b300"):
        for att in ("dp", "tp"):
            for system in ("sglang", "hisparse", "ulacache"):
                tree = {**PINNED, "system": system, "attention": att, "hardware": {"preset": hw, "num_gpus": 8}}
                runs.append((f"pinned-{system}-{att}-{hw}", tree, ["workload.max_steps=16"]))
    for att in ("dp", "tp"):
        tree = {**PINNED, "system": "ulacache", "attention": att, "hardware": {"preset": "h200", "num_gpus": 8}}
        runs.append((f"full-ulacache-{att}-h200", tree, []))
    for att in ("dp", "tp"):
        for system in ("hisparse", "ulacache"):
            tree = {**PINNED, "system": system, "attention": att, "spec": {"draft_tokens": 4},
                    "hardware": {"preset": "h200", "num_gpus": 8},
                    "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1}}
            runs.append((f"batch1-{system}-{att}-h200-draft4", tree, []))
    for system, att, draft in (("ulacache", "tp", 4), ("ulacache", "dp", 0), ("hisparse", "dp", 0)):
        tree = {**PINNED, "system": system, "attention": att, "model": {"preset": "glm-5.2"},
                "spec": {"draft_tokens": draft}, "hardware": {"preset": "h200", "num_gpus": 8},
                "workload": {"num_requests": 8, "max_concurrency": 8, "seed": 1}}
        runs.append((f"fidelity-{system}-{att}-h200-glm52-draft{draft}", tree,
                     ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0", "workload.max_steps=4"]))
    return runs


def run_one(tree: dict, overrides: list[str], timeout_s: float = 600.0) -> dict:
    """One replay in a fresh interpreter: its own peak RSS and CPU seconds (os.wait4), the estimate and its parts."""
    limit = int(AS_LIMIT_GB * 1e9)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    load, t0 = os.getloadavg(), time.perf_counter()
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps({"config": tree, "overrides": overrides})],
                                cwd=ROOT, stdout=fo, stderr=fe, text=True, preexec_fn=cap)
        deadline = time.monotonic() + timeout_s
        while (done := os.wait4(proc.pid, os.WNOHANG))[0] == 0:  # the child's own rusage, not all children's
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(done[1])
        usage = done[2]
        fo.seek(0), fe.seek(0)
        out, err = fo.read(), fe.read()
    wall = time.perf_counter() - t0
    result = next((json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")), None)
    row = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "status": "ok" if proc.returncode == 0 and result else f"exit {proc.returncode}",
           "wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2), "load_avg_before": [round(x, 2) for x in load],
           "load_avg_after": [round(x, 2) for x in os.getloadavg()], "overrides": overrides}
    if result is None:
        row["stderr_tail"] = err.strip().splitlines()[-1:]
        return row
    m, parts = result["metrics"], result["parts"]
    peak, est = usage.ru_maxrss * 1024.0, float(m["est_peak_memory_bytes"])  # ru_maxrss: kB (Linux)
    row.update({"est_peak_bytes": est, "peak_rss_bytes": peak, "ratio": round(est / peak, 4),
                "est_parts_bytes": {k: v for k, v in parts.items() if k.endswith("_bytes") and k not in ("peak_bytes", "limit_bytes")},
                "decode_steps": m.get("decode_steps"), "completed_requests": m.get("completed_requests"),
                "policy_groups_simulated": m.get("policy_groups_simulated"),
                "request_sample_stride": m.get("request_sample_stride")})
    return row


COST_CHILD = """import gc, importlib.util, json, sys, time
from sim.config import build, load_config
from sim.run import load_workload, cache_factory
from sim.systems import budget_for, system_for_workload
spec = importlib.util.spec_from_file_location("footprint_under_test", sys.argv[1])
fp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fp)
cfg = build(load_config(json.loads(sys.argv[2])))
requests, source = load_workload(cfg)
system = system_for_workload(cfg, budget_for(cfg), requests, source)
make = cache_factory(cfg, system, requests)
calls, real = [], gc.collect
gc.collect = lambda generation=2: (calls.append(generation), real(generation))[1]
t0, w0 = time.process_time(), time.perf_counter()
est = fp.check(cfg, system, requests, make)
cpu, wall = time.process_time() - t0, time.perf_counter() - w0
gc.collect = real
print("RESULT " + json.dumps({"cpu_s": cpu, "wall_s": wall, "gc_calls_by_generation": {g: calls.count(g) for g in set(calls)},
                             "est_peak_bytes": est["peak_bytes"]}))
"""


def check_cost(commit: str) -> dict:
    """footprint.check's own cost with sim/footprint.py of `commit` and of this tree (fresh processes, alternating)."""
    tree = {**PINNED, "system": "ulacache", "attention": "tp", "hardware": {"preset": "h200", "num_gpus": 8}}
    old = Path(tempfile.mkdtemp()) / "footprint_old.py"
    old.write_text(subprocess.run(["git", "show", f"{commit}:sim/footprint.py"], cwd=ROOT, capture_output=True,
                                  text=True, check=True).stdout)
    out = {"config": tree, "runs": {commit: [], "tree": []}}
    for _ in range(3):
        for label, path in ((commit, old), ("tree", ROOT / "sim" / "footprint.py")):
            run = subprocess.run([sys.executable, "-c", COST_CHILD, str(path), json.dumps(tree)], cwd=ROOT,
                                 capture_output=True, text=True)
            row = next(json.loads(x[7:]) for x in run.stdout.splitlines() if x.startswith("RESULT "))
            row["load_avg"] = [round(x, 2) for x in os.getloadavg()]
            out["runs"][label].append(row)
            print(label, row, flush=True)
    out["min_cpu_s"] = {k: round(min(r["cpu_s"] for r in v), 3) for k, v in out["runs"].items()}
    return out


def summary(rows: list[dict]) -> dict:
    ratios = sorted(r["ratio"] for r in rows if r.get("ratio"))
    if not ratios:
        return {}
    return {"runs": len(ratios), "min_ratio": ratios[0], "median_ratio": round(statistics.median(ratios), 4),
            "max_ratio": ratios[-1], "below_1": sum(x < 1.0 for x in ratios)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default=None)
    ap.add_argument("--check-cost", metavar="COMMIT", default=None, help="time footprint.check: COMMIT's vs this tree's")
    ap.add_argument("--filter", default="")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "footprint_accuracy.json"))
    args = ap.parse_args()
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {"bench": "footprint_accuracy", "runs": {}}
    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    commit = git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain", "sim", "ulacache") else "")
    result.update({"about": __doc__.split("\n\n")[0], "machine": {
        "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)},
        "address_space_limit_gb": AS_LIMIT_GB})
    if args.check_cost:
        result["check_cost"] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                "commit": commit, "command": " ".join([Path(sys.executable).name, *sys.argv]),
                                **check_cost(args.check_cost)}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(out)
        return 0
    if not args.tag:
        ap.error("--tag is required (unless --check-cost)")
    for label, tree, overrides in grid():
        if args.filter and args.filter not in label:
            continue
        row = run_one(tree, overrides)
        row.update({"commit": commit, "command": " ".join([Path(sys.executable).name, *sys.argv])})
        result["runs"].setdefault(label, {})[args.tag] = row
        print(f"{label:44s} {row['status']:>6s} {row['wall_s']:7.1f} s  peak {row.get('peak_rss_bytes', 0) / 1e9:6.3f} GB"
              f"  est {row.get('est_peak_bytes', 0) / 1e9:6.3f} GB  ratio {row.get('ratio', 0):.3f}", flush=True)
        result["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        tags = {t for r in result["runs"].values() for t in r}
        result["summary"] = {t: summary([r[t] for r in result["runs"].values() if t in r]) for t in sorted(tags)}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(out)
    print(json.dumps(result.get("summary", {})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
