"""ulacache TP replays (DESIGN §8 keys: 8 GPUs TP, glm-5, pb-lru, CPU storage, no draft tokens unless the case
says) before and after a change to the TP local buffers: CPU-s of each (child rusage), and whether every metric that
does not measure the host (wall clock, resident memory) is identical. Cases: pinned-<preset> (24 requests at
concurrency 24) and batch1-<preset> (4 requests at concurrency 1), preset h200 or b300, optionally -d<N> (N draft
tokens).

Case paper-h200: configs/paper-h200-tp-specon.yaml of the after tree (the paper default: 256 requests, 4 draft
tokens, default fidelity).

Usage: python bench/tplru_bench.py --before-tree DIR [--after-tree DIR] [--cases pinned-h200,batch1-b300]
       [--repeat N] [--note TEXT] [--out bench/results/tplru.json]
Each tree is a checkout of this repository (imported through PYTHONPATH); the replays run one after the other, each
in a fresh interpreter under a 6 GB address-space cap, before and after alternating N times per case (the machine
is shared: `cpu_s` is the least of the N, `cpu_s_runs` all of them). The file's previous record is kept under
"earlier".
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
CONFIG = """system: ulacache
attention: tp
hardware: {{preset: {preset}, num_gpus: 8}}
model: {{preset: glm-5}}
policy: pb-lru
cpu_storage: true
spec: {{draft_tokens: {draft}}}
workload: {workload}
"""
WORKLOADS = {"pinned": "{num_requests: 24, max_concurrency: 24, seed: 1}",
             "batch1": "{num_requests: 4, max_concurrency: 1, seed: 1}"}


def case_config(case: str, tree: Path = ROOT) -> str:
    """The replay config of a case `pinned-h200` / `batch1-b300` / `batch1-h200-d4` (workload-preset[-dN: N draft
    tokens, default 0]) or `paper-h200`."""
    if case == "paper-h200":
        return (tree / "configs" / "paper-h200-tp-specon.yaml").read_text()
    workload, preset, *draft = case.split("-")
    draft_tokens = draft[0][1:] if len(draft) == 1 and draft[0][:1] == "d" else None
    if workload not in WORKLOADS or preset not in ("h200", "b300") or (draft and not (draft_tokens or "").isdigit()):
        raise SystemExit(f"tplru_bench: error: unknown case {case!r} (pinned|batch1 - h200|b300 [-dN])")
    return CONFIG.format(preset=preset, workload=WORKLOADS[workload], draft=int(draft_tokens or 0))
HOST_METRICS = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "est_peak_memory_bytes",
                "peak_rss_bytes"}  # measure this machine, not the simulation
AS_LIMIT_BYTES = 6_000_000_000


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT_BYTES, AS_LIMIT_BYTES))


def replay(tree: Path, config: Path, out: Path) -> dict:
    """One replay of `config` with the code of `tree`: CPU-s (user + sys of the child), wall, load, peak RSS of that
    child (GNU time's %M; RUSAGE_CHILDREN's maxrss is the largest child so far), metrics."""
    cmd = [sys.executable, "-c", "import sys; from ulacache_cli.main import main; sys.exit(main())", "replay", str(config), "--out",
           str(out), "--quiet"]
    timing = out.with_suffix(".time")
    if Path("/usr/bin/time").is_file():
        cmd = ["/usr/bin/time", "-o", str(timing), "-f", "%U %S %M", *cmd]
    load = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, preexec_fn=_cap,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak_kb = after.ru_maxrss
    if timing.is_file():
        user, system, peak = timing.read_text().split()[-3:]
        cpu, peak_kb = float(user) + float(system), int(peak)
    metrics = json.loads((out / "metrics.json").read_text()) if proc.returncode == 0 else {}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    return {"tree_commit": commit, "status": proc.returncode, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "load_avg_before": load, "load_avg_after": os.getloadavg(), "peak_rss_kb": peak_kb,
            "stderr_tail": proc.stderr.strip().splitlines()[-1:], "metrics": metrics}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before-tree", type=Path, required=True)
    ap.add_argument("--after-tree", type=Path, default=ROOT)
    ap.add_argument("--cases", default="pinned-h200")
    ap.add_argument("--repeat", type=int, default=1, help="before/after pairs per case (alternating)")
    ap.add_argument("--note", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tplru.json")
    args = ap.parse_args()
    configs = {case: case_config(case, args.after_tree) for case in args.cases.split(",")}
    cases = {}
    for case, text in configs.items():
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / f"{case}.yaml"
            config.write_text(text)
            cpu: dict[str, list[float]] = {"before": [], "after": []}
            runs = {}
            for i in range(max(args.repeat, 1)):  # loop over repetitions: before, after, before, after, ...
                for name, tree in (("before", args.before_tree), ("after", args.after_tree)):
                    run = replay(tree.resolve(), config, Path(tmp) / f"{name}{i}")
                    cpu[name].append(run["cpu_s"])
                    runs.setdefault(name, run)  # the first run's record (metrics, load, memory)
            for name, run in runs.items():
                run["cpu_s_runs"], run["cpu_s"] = cpu[name], min(cpu[name])
        sim_metrics = [{k: v for k, v in r["metrics"].items() if k not in HOST_METRICS} for r in runs.values()]
        same = bool(sim_metrics[0]) and sim_metrics[0] == sim_metrics[1]
        diff = sorted(k for k in set(sim_metrics[0]) | set(sim_metrics[1]) if sim_metrics[0].get(k) != sim_metrics[1].get(k))
        for r in runs.values():
            r["metrics"] = {k: r["metrics"].get(k) for k in ("decode_steps", "gpu_hit_rate", "tpot_ms_mean",
                                                             "max_admitted_concurrency") if k in r["metrics"]}
        cases[case] = {"config": text, "runs": runs, "metrics_identical": same, "metrics_differing": diff}
        print(f"{case}: before {runs['before']['cpu_s']} CPU-s -> after {runs['after']['cpu_s']} CPU-s; "
              f"metrics identical: {same} {diff if diff else ''}", flush=True)
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "cases": cases, "ignored_host_metrics": sorted(HOST_METRICS)}
    if args.note:
        record["note"] = args.note
    if args.out.is_file():
        record["earlier"] = json.loads(args.out.read_text())
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
