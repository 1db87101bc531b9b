"""Simulator scale (issue 10 item 4): wall time and peak RSS of replays, each in its own subprocess, against targets.

Sections (each replay runs alone, one at a time, under an address-space limit). Memory: a replay's simulated groups
run in forked processes (sim/group_workers.py, one per usable core), so one process's peak RSS (/usr/bin/time's) is
not the run's. `peak_gb` is the most of: that main-process peak and the process tree's summed PSS (proportional
set size: a page shared by n processes counts 1/n in each), sampled every 0.2 s; `peak_rss_sum_gb` is the replay's
own `peak_rss_bytes` (its peak RSS plus each group worker's largest sample of its private pages). The 2 GB target is
judged on `peak_gb`.
- pinned:     the pinned keys (docs/architecture.md) only (glm-5, pb-lru, CPU storage, no draft tokens, 24 requests at concurrency 24,
              seed 1) for every system x attention x hardware preset. Target <= 2 GB and <= 30 s each.
- batch1:     4 requests at max_concurrency 1, every system x attention, draft tokens 0 and 4 (h200 and b300).
              Target <= 10 s each.
- paper:      configs/paper-h200-tp-specon.yaml (8xH200 TP, 256 Multi-LexSum requests, 4 draft tokens, ulacache with
              CPU storage) at its default fidelity. Target <= 30 s.
- paper-full: the same with every indexer group and every request simulated. Target <= 10 min and <= 8 GB.
Each figure is written next to the one it replaces (`replaces`, from the issue / bench/results/sim.json).

Usage: python bench/scale_bench.py [--only pinned,batch1,paper,paper-full] [--out bench/results/scale.json]
Writes JSON (date, command, machine, load before/after each replay); sections not run keep their earlier results, and
a run that is repeated keeps its previous figures under `before`. The shared VM's speed drifts by up to ~1.5x between
hours, so the run also times a fixed reference workload (`machine_speed`) before and after: figures of two runs compare
only as far as their reference times agree.
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
import threading
import time
from pathlib import Path

from traces.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
PINNED = {"policy": "pb-lru", "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 0},
          "workload": {"num_requests": 24, "max_concurrency": 24, "seed": 1}}
SYSTEMS, ATTENTION, PRESETS = ("sglang", "hisparse", "ulacache"), ("dp", "tp"), ("h200", "b300")
PAPER = ROOT / "configs" / "paper-h200-tp-specon.yaml"
KEEP = ("system", "attention", "hardware", "draft_tokens", "num_requests", "completed_requests",
        "max_admitted_concurrency", "decode_steps", "decode_throughput_tok_s", "gpu_hit_rate", "policy_groups_simulated",
        "request_sample_stride", "est_peak_memory_bytes", "peak_rss_bytes", "sim_wall_s")
# The figures these runs replace (issue 10, measured before the scale work; sim.json for the paper default).
REPLACED = {
    "pinned": "ulacache tp h200: killed by the kernel at 24.4 GB resident after 88 s (no output)",
    "batch1": "ulacache dp b300 spec off 444 s, ulacache tp b300 spec off > 480 s, ulacache tp h200 4 draft tokens "
              "92 s; sglang 3-38 s (4 requests, one replay per core on a 64-core host)",
    "paper": "100.4 s (bench/results/sim.json, 2026-11-30, 2 groups, 1/16 of the requests)",
    "paper-full": "not runnable: 24+ GB (issue 10)",
}
TARGETS = {"pinned": (30.0, 2.0), "batch1": (10.0, None), "paper": (30.0, None), "paper-full": (600.0, 8.0)}


def tree_pss_bytes(root: int) -> int:
    """Summed PSS of a process and its descendants now (/proc/PID/smaps_rollup; gone processes count 0)."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                todo += [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            continue
    return total


class PssSampler(threading.Thread):
    """The largest `tree_pss_bytes(pid)` seen, every `period_s` until `stop`."""

    def __init__(self, pid: int, period_s: float = 0.2):
        super().__init__(daemon=True)
        self.pid, self.period_s, self.peak = pid, period_s, 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.period_s):
            self.peak = max(self.peak, tree_pss_bytes(self.pid))

    def stop(self) -> int:
        self.done.set()
        self.join()
        return self.peak


def run_one(config, overrides: list[str], as_limit_gb: float, timeout_s: float) -> dict:
    """One replay in a fresh interpreter: wall, peak RSS (its own, from wait4), status, metrics."""
    payload = json.dumps({"config": str(config) if isinstance(config, Path) else config, "overrides": overrides})
    code = ("import json, sys; import sim; a = json.loads(sys.argv[1]); "
            "m = sim.replay(a['config'], overrides=a['overrides'], policy_workers=None); "
            "print('METRICS ' + json.dumps(m))")  # (policy_workers=None: the usable cores, as `ulacache replay` runs)
    limit = int(as_limit_gb * 1e9)

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    load = os.getloadavg()
    t0 = time.perf_counter()
    # /usr/bin/time reports the child's own peak resident set (wait4 rusage), even when it dies
    proc = subprocess.Popen(["/usr/bin/time", "-f", "PEAKRSS_KB %M CPU_S %U %S", sys.executable, "-c", code, payload], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap)
    sampler = PssSampler(proc.pid)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout_s)
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        status = f"timeout after {timeout_s:.0f} s"
    wall = time.perf_counter() - t0
    pss = sampler.stop()
    metrics, rss, cpu = {}, None, None
    for line in out.splitlines():
        if line.startswith("METRICS "):
            metrics = json.loads(line[8:])
    lines = err.splitlines()
    for line in lines:
        if line.startswith("PEAKRSS_KB "):
            parts = line.split()
            rss, cpu = int(parts[1]) * 1024, float(parts[3]) + float(parts[4])
    err = "\n".join(x for x in lines if not x.startswith("PEAKRSS_KB ") and not x.startswith("Command "))
    rss_sum = metrics.get("peak_rss_bytes")
    peak = max(rss or 0, pss)
    row = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "status": status, "wall_s": round(wall, 2), "cpu_s": cpu, "peak_gb": round(peak / 1e9, 3) if peak else None,
           "peak_rss_gb": round(rss / 1e9, 3) if rss else None, "peak_pss_sampled_gb": round(pss / 1e9, 3),
           "peak_rss_sum_gb": round(rss_sum / 1e9, 3) if rss_sum else None,
           "policy_processes": metrics.get("policy_processes"),
           "load_avg_before": load, "load_avg_after": os.getloadavg(),
           "metrics": {k: metrics.get(k) for k in KEEP} if metrics else None}
    if status != "ok":
        row["stderr_tail"] = err.strip().splitlines()[-1:] if err.strip() else []
    return row


def _judge(section: str, row: dict) -> dict:
    wall_t, rss_t = TARGETS[section]
    row["meets_target"] = (row["status"] == "ok" and row["wall_s"] <= wall_t
                           and (rss_t is None or (row["peak_gb"] or 0) <= rss_t))
    return row


def _overrides(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out += _overrides(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={json.dumps(value) if isinstance(value, bool) else value}")
    return out


SECTIONS = ("pinned", "batch1", "paper", "paper-full")


def section_runs(section: str) -> list[tuple[str, object, list[str], float, float]]:
    """(label, config, overrides, address-space limit GB, timeout s) of each replay of a section."""
    runs = []
    if section == "pinned":
        for hw in PRESETS:
            for att in ATTENTION:
                for system in SYSTEMS:
                    tree = {**PINNED, "system": system, "attention": att,
                            "hardware": {"preset": hw, "num_gpus": 8}}
                    runs.append((f"{system}-{att}-{hw}", tree, [], 8.0, 300.0))
    elif section == "batch1":
        for hw in PRESETS:
            for draft in (0, 4):
                for att in ATTENTION:
                    for system in SYSTEMS:
                        tree = {**PINNED, "system": system, "attention": att, "spec": {"draft_tokens": draft},
                                "hardware": {"preset": hw, "num_gpus": 8},
                                "workload": {"num_requests": 4, "max_concurrency": 1, "seed": 1}}
                        runs.append((f"{system}-{att}-{hw}-draft{draft}", tree, [], 8.0, 300.0))
    elif section == "paper":
        runs.append(("ulacache-tp-h200-specon", PAPER, [], 8.0, 600.0))
    elif section == "paper-full":
        runs.append(("ulacache-tp-h200-specon-full", PAPER,
                     ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0"], 10.0, 900.0))
    return runs


# A fixed workload of the kinds the replays are made of (sorts, random gathers from a table larger than the caches,
# an interpreted loop); it runs in a fresh interpreter and only its own work is timed (process CPU, imports excluded).
SPEED_PROBE = """
import time, numpy as np
t = time.process_time()
rng = np.random.default_rng(0)
a = rng.integers(0, 1 << 40, 2_000_000)
for _ in range(5):
    np.sort(a)
table = np.arange(16 << 20, dtype=np.int32)
ix = rng.integers(0, table.size, 2_000_000)
for _ in range(20):
    table.take(ix)
n = 0
for i in range(3_000_000):
    n += i & 7
print(time.process_time() - t)
"""


def machine_speed(repeats: int = 3) -> float:
    """Least CPU seconds of `repeats` runs of SPEED_PROBE on this machine now (lower is faster; single runs vary by
    up to ~1.5x on the shared VM)."""
    runs = [subprocess.run([sys.executable, "-c", SPEED_PROBE], capture_output=True, text=True, check=True)
            for _ in range(repeats)]
    return round(min(float(r.stdout.split()[-1]) for r in runs), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="pinned,batch1,paper,paper-full")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scale.json"))
    ap.add_argument("--filter", default="", help="run only replays whose label contains this")
    ap.add_argument("--timeout-s", type=float, default=None, help="override each replay's time limit")
    args = ap.parse_args()
    unknown = sorted(set(args.only.split(",")) - set(SECTIONS))
    if unknown or (args.timeout_s is not None and not args.timeout_s > 0):
        ap.error(f"--only takes {','.join(SECTIONS)} and --timeout-s a number > 0 (got --only {args.only}, "
                 f"--timeout-s {args.timeout_s})")
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.is_file() else {"bench": "scale", "sections": {}}
    if result.get("bench") != "scale" or "sections" not in result:
        ap.error(f"--out {out}: holds no scale bench result to add to")
    prev_date = result.get("date")
    result.pop("note", None)  # a note written by hand about the previous run
    speed = {"what": "least CPU-s of 3 runs of bench/scale_bench.py's SPEED_PROBE (a fixed workload; lower = faster machine)",
             "before_s": machine_speed()}

    def save() -> None:  # after each section (a killed run keeps the finished ones) and once the probe ran again
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps({**result, "machine_speed": speed}, indent=2) + "\n")

    result.update({
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)},
    })
    for section in args.only.split(","):
        rows = {}
        for label, config, overrides, as_gb, timeout in section_runs(section):
            if args.filter and args.filter not in label:
                continue
            row = _judge(section, run_one(config, overrides, as_gb, args.timeout_s or timeout))
            rows[label] = row
            print(f"{section:10s} {label:36s} {row['status']:>10s} {row['wall_s']:8.1f} s {row['cpu_s'] or 0:8.1f} cpu-s "
                  f"{row['peak_gb'] or 0:6.2f} GB ({row['policy_processes'] or 1} proc, RSS sum "
                  f"{row['peak_rss_sum_gb'] or 0:.2f}) {'ok' if row['meets_target'] else 'MISSES TARGET'}", flush=True)
        if not rows:
            continue
        prev = result["sections"].get(section, {}).get("runs", {})
        for label, row in rows.items():  # the figure this run replaces: the same run's last recorded one
            old = prev.get(label)
            if old:
                row["before"] = {k: old.get(k) for k in ("status", "wall_s", "cpu_s", "peak_gb", "peak_rss_gb",
                                                         "policy_processes", "load_avg_before") if k in old}
                row["before"].update({"date": old["date"]} if old.get("date") else {"file_date": prev_date})
        result["sections"][section] = {
            "target": {"wall_s": TARGETS[section][0], "peak_gb": TARGETS[section][1]},
            "replaces": REPLACED[section], "runs": {**prev, **rows},
            "max_wall_s": max(r["wall_s"] for r in {**prev, **rows}.values()),
            "max_peak_gb": max((r.get("peak_gb") or r.get("peak_rss_gb") or 0) for r in {**prev, **rows}.values()),
        }
        save()
    speed["after_s"] = machine_speed()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
