"""Storage growth (issue 10): pinned-keys replays (DESIGN §8 keys, 8xH200, glm-5, pb-lru, CPU storage, 24 requests
at concurrency 24) with the code of two trees, one replay at a time, before and after alternating per config: CPU-s
(user + sys), wall, peak RSS and minor page faults of each replay's own process (os.wait4), load, and whether every
metric that does not measure the host is identical.

Usage: python bench/growth_bench.py --before-tree DIR [--after-tree DIR] [--configs hisparse:dp ulacache:dp]
                                    [--as-limit-gb 8] [--out bench/results/growth.json]
Each tree is a checkout of this repository (imported through PYTHONPATH), run in a fresh interpreter under an
address-space cap (8 GB by default: above every pinned-keys estimate of sim/footprint.py, which refuses a replay
whose estimate exceeds the memory it may use).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """system: {system}
attention: {attention}
hardware: {{preset: h200, num_gpus: 8}}
model: {{preset: glm-5}}
policy: pb-lru
cpu_storage: true
spec: {{draft_tokens: 0}}
workload: {{num_requests: 24, max_concurrency: 24, seed: 1}}
"""
HOST_METRICS = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "est_peak_memory_bytes",
                "peak_rss_bytes"}  # measure this machine (or its estimate), not the simulation
CLI = "import sys; from ulacache_cli.main import main; sys.exit(main())"


def replay(tree: Path, config: Path, out: Path, as_limit: int) -> dict:
    """One replay with the code of `tree`: the child's own CPU-s, peak RSS and faults (wait4), wall, load."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))

    cmd = [sys.executable, "-c", CLI, "replay", str(config), "--out", str(out), "--quiet"]
    load = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, preexec_fn=cap,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    metrics = json.loads((out / "metrics.json").read_text()) if proc.returncode == 0 else {}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    return {"tree": str(tree), "tree_commit": commit, "status": proc.returncode,
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 2), "user_s": round(ru.ru_utime, 2),
            "sys_s": round(ru.ru_stime, 2), "wall_s": round(wall, 2), "peak_rss_gb": round(ru.ru_maxrss / 2**20, 3),
            "minor_faults": ru.ru_minflt, "load_avg_before": load,
            "load_avg_after": [round(x, 2) for x in os.getloadavg()], "stderr_tail": err.strip().splitlines()[-1:],
            "metrics": metrics}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before-tree", type=Path, required=True)
    ap.add_argument("--after-tree", type=Path, default=ROOT)
    ap.add_argument("--configs", nargs="+", default=["hisparse:dp", "ulacache:dp"], help="system:attention pairs")
    ap.add_argument("--as-limit-gb", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "growth.json")
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in args.configs:
            system, attention = pair.split(":")
            config = Path(tmp) / f"{system}_{attention}.yaml"
            config.write_text(CONFIG.format(system=system, attention=attention))
            runs = {name: replay(tree.resolve(), config, Path(tmp) / f"{pair}_{name}", int(args.as_limit_gb * 1e9))
                    for name, tree in (("before", args.before_tree), ("after", args.after_tree))}
            sim = [{k: v for k, v in r["metrics"].items() if k not in HOST_METRICS} for r in runs.values()]
            diff = sorted(k for k in set(sim[0]) | set(sim[1]) if sim[0].get(k) != sim[1].get(k))
            for r in runs.values():
                r["metrics"] = {k: r["metrics"].get(k) for k in ("decode_steps", "gpu_hit_rate", "tpot_ms_mean",
                                                                  "max_admitted_concurrency") if k in r["metrics"]}
            results[f"{system} {attention} h200"] = {"runs": runs, "metrics_identical": bool(sim[0]) and not diff,
                                                     "metrics_differing": diff}
            b, a = runs["before"], runs["after"]
            print(f"{system} {attention}: CPU-s {b['cpu_s']} -> {a['cpu_s']}, peak RSS {b['peak_rss_gb']} -> "
                  f"{a['peak_rss_gb']} GB, faults {b['minor_faults']} -> {a['minor_faults']}; metrics identical: "
                  f"{results[f'{system} {attention} h200']['metrics_identical']} {diff if diff else ''}")
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "config": CONFIG,
              "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "as_limit_gb": args.as_limit_gb, "results": results, "ignored_host_metrics": sorted(HOST_METRICS)}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
