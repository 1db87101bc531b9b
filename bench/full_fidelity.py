"""Full fidelity (issue 29 item 2): a config with every indexer group and every request simulated, on a chosen policy
backend, cut at a few decode-step counts; wall time, peak host RSS and peak device memory of each, in a fresh process.

The cut runs share admission and the first step, so the difference of two cuts' wall times is the time of their
extra decode steps (`s_per_decode_step`); with the whole run's decode steps (`--full-run-steps`, e.g. the
decode_steps of a default-fidelity replay of the config) it estimates a whole run against the 10-minute target. A
cut of 0 steps runs the whole replay, measured outright if it ends within `--max-wall-s`; one stopped there is
estimated from how its requests drain with `--reference` (bench/drain_estimate.py).

Usage: python bench/full_fidelity.py [CONFIG] --policy-backend cupy --steps 2 6 [--policy-workers N]
           [--full-run-steps 2146] [--out bench/results/full_fidelity.json]
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

from sim.group_workers import usable_cores
from sim.policy_backend import CHOICES
from ulacache.threads import ENV_VAR

ROOT = Path(__file__).resolve().parents[1]
FULL = ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0"]
TICK_STEPS = 100  # a progress line every this many decode steps
KEEP = ("decode_steps", "completed_requests", "max_admitted_concurrency", "gpu_hit_rate", "decode_throughput_tok_s",
        "policy_calls", "policy_groups_simulated", "request_sample_stride", "policy_backend", "policy_processes",
        "policy_threads", "peak_rss_bytes", "est_peak_memory_bytes", "sim_wall_s", "policy_device_pool_bytes",
        "run_throughput_tok_s", "steady_window_steps", "tpot_ms_p50", "tpot_source", "steady_mean_concurrency",
        "selections_on")


def device_view(backend: str) -> dict:
    """The device's used memory at the end (nvidia-smi's view, every process's) and its name; what the device
    allocators of all the replay's processes held is the replay's own `policy_device_pool_bytes`."""
    out: dict = {}
    if backend == "cupy":
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        out["device_used_bytes_at_end"] = int(total - free)
        out["device_name"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return out


def profile_top(prof, n: int) -> list[dict]:
    """The `n` functions with the most own time in this process (cProfile; the group workers' are not seen)."""
    import pstats

    stats = pstats.Stats(prof).stats  # {(file, line, name): (calls, prim calls, tottime, cumtime, callers)}
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    root = str(ROOT) + "/"
    return [{"function": f"{f.replace(root, '')}:{line}({name})", "calls": int(nc), "own_s": round(tt, 4),
             "cumulative_s": round(ct, 4)} for (f, line, name), (_, nc, tt, ct, _) in rows]


def _ticker(t0: float, every: int):
    """A progress callback printing `TICK decode steps, requests done, wall s` every `every` decode steps: what a cut
    stopped at --max-wall-s had done by then (the parent keeps these lines)."""
    steps = 0

    def tick(done: int, total: int) -> None:
        nonlocal steps
        steps += 1
        if steps % every == 0:
            print(f"TICK {steps} {done} {time.perf_counter() - t0:.3f}", flush=True)
    return tick


class _Totals:
    """An `on_step` observer printing `TOTALS decode steps, hit rate so far, decode tokens, decode s` every `every`
    decode steps (the hit rate weighted by each step's unique references): a stopped cut's figures up to its last
    tick, to set beside a default-fidelity run's at the same step."""

    def __init__(self, every: int):
        self.every, self.steps, self.hits, self.unique, self.tokens, self.busy_s = every, 0, 0.0, 0.0, 0.0, 0.0

    def __call__(self, rec: dict) -> None:
        self.steps += 1
        self.hits += rec["gpu_hit_rate"] * rec["unique_refs"]
        self.unique += rec["unique_refs"]
        self.tokens += rec["tokens"]
        self.busy_s += rec["step_s"]
        if self.steps % self.every == 0:
            rate = self.hits / self.unique if self.unique else 1.0
            print(f"TOTALS {self.steps} {rate:.6f} {self.tokens:.0f} {self.busy_s:.6f}", flush=True)


def _tagged(stdout, tag: str, n: int) -> list[list[float]]:
    """The first n numbers of each `tag` line of a child's output (str, or bytes from a stopped child)."""
    text = stdout.decode() if isinstance(stdout, bytes) else (stdout or "")
    return [[float(x) for x in ln.split()[1:n + 1]] for ln in text.splitlines() if ln.startswith(tag + " ")]


def totals_of(stdout) -> list[dict]:
    """The TOTALS lines: decode steps, hit rate so far, decode tokens and s so far (tok/s: tokens / s)."""
    return [{"decode_steps": int(steps), "gpu_hit_rate": rate, "decode_tokens": tokens, "decode_s": busy,
             "decode_tok_s": tokens / busy if busy else 0.0} for steps, rate, tokens, busy in _tagged(stdout, "TOTALS", 4)]


def ticks_of(stdout) -> list[list[float]]:
    """[decode steps, requests done, wall s] of each TICK line."""
    return _tagged(stdout, "TICK", 3)


def child(spec: dict) -> None:
    """One replay in this (fresh) process; prints one JSON line."""
    import sim

    prof = None
    if spec.get("profile_top"):
        import cProfile

        prof = cProfile.Profile()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    m = sim.replay(spec["config"], None, progress=_ticker(t0, TICK_STEPS), overrides=spec["sets"],
                   policy_workers=spec["workers"], policy_backend=spec["backend"],
                   max_memory_gb=spec.get("max_memory_gb"), on_step=_Totals(TICK_STEPS),
                   dense_map_gb=spec.get("dense_map_gb"))
    if prof is not None:
        prof.disable()
    row = {k: m.get(k) for k in KEEP}
    row["wall_s"] = time.perf_counter() - t0
    if prof is not None:  # (wall includes the profiler's overhead)
        row["profile_top"] = profile_top(prof, int(spec["profile_top"]))
    row["main_process_maxrss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    row.update(device_view(m["policy_backend"]))
    print("RESULT " + json.dumps(row))


def _child_run(spec: dict, max_wall_s: float) -> tuple[bool, int, str, str]:
    """The child replay, its TICK and TOTALS lines echoed here as they come (a caller killed mid-cut, e.g. by a
    device call's limit, still has them in its log), stopped at `max_wall_s`: (stopped, returncode, stdout,
    stderr)."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        proc.kill()  # (its group workers end as their parent's pipes close)
    timer = threading.Timer(max_wall_s, stop)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    timer.start()
    reader.start()
    out = []
    for ln in proc.stdout:
        out.append(ln)
        if ln.startswith(("TICK ", "TOTALS ")):
            print(ln, end="", flush=True)
    proc.wait()
    timer.cancel()
    reader.join()
    return stopped.is_set(), proc.returncode, "".join(out), "".join(err)


def run_cut(args, steps: int | None) -> dict:
    sets = FULL + list(args.sets) + ([f"workload.max_steps={steps}"] if steps else [])
    spec = {"config": str(args.config), "sets": sets, "workers": args.policy_workers, "backend": args.policy_backend,
            "max_memory_gb": args.max_memory_gb, "profile_top": args.profile_top, "dense_map_gb": args.dense_map_gb}
    t0 = time.perf_counter()
    stopped, returncode, stdout, stderr = _child_run(spec, args.max_wall_s)
    if stopped:
        return {"steps": steps, "timed_out_after_s": args.max_wall_s, "ticks": ticks_of(stdout),
                "totals": totals_of(stdout)}
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    if returncode or not lines:
        return {"steps": steps, "failed": returncode, "stderr_tail": stderr[-2000:]}
    row = json.loads(lines[-1][7:])
    row["steps"], row["process_wall_s"] = steps, time.perf_counter() - t0
    row["ticks"], row["totals"] = ticks_of(stdout), totals_of(stdout)
    return row


def from_ticks(ticks: list[list[float]], full_run_steps: int | None) -> dict:
    """A stopped run's progress: steps and wall at its last tick, the wall per step over its second half, and with
    the whole run's steps an estimate of its end."""
    if len(ticks) < 2:
        return {}
    (s0, _, w0), (s1, done, w1) = ticks[(len(ticks) - 1) // 2], ticks[-1]
    per = (w1 - w0) / (s1 - s0)
    out = {"stopped_at_steps": int(s1), "stopped_requests_done": int(done), "stopped_wall_s": w1,
           "stopped_s_per_decode_step": per}
    if full_run_steps:
        out["stopped_full_run_estimate_s"] = w1 + per * max(full_run_steps - s1, 0)
    return out


def derive(cuts: list[dict], full_run_steps: int | None) -> dict:
    stopped = [c for c in cuts if c.get("timed_out_after_s") and len(c.get("ticks", [])) >= 2]
    out = from_ticks(stopped[-1]["ticks"], full_run_steps) if stopped else {}
    if stopped and stopped[-1].get("totals"):  # its hit rate and decode tok/s up to its last tick
        out["stopped_totals"] = stopped[-1]["totals"][-1]
    return {**out, **_from_cuts(cuts, full_run_steps)}


def _from_cuts(cuts: list[dict], full_run_steps: int | None) -> dict:
    ok = [c for c in cuts if "wall_s" in c and c.get("steps")]
    if len(ok) < 2:
        return {}
    a, b = ok[0], ok[-1]
    extra = b["decode_steps"] - a["decode_steps"]
    if extra <= 0:
        return {}
    per = (b["wall_s"] - a["wall_s"]) / extra
    out = {"s_per_decode_step": per, "from_cuts": [a["steps"], b["steps"]]}
    if full_run_steps:
        out["full_run_steps"] = full_run_steps
        out["full_run_estimate_s"] = a["wall_s"] + per * (full_run_steps - a["decode_steps"])
        out["target_s"] = 600.0
    return out


def _drain(result: dict, args) -> dict:
    """bench/drain_estimate.py's estimate of a stopped whole run ({} when there is none to estimate)."""
    from sim.config import build, load_config

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # (bench/ holds scripts, not a package)
    from drain_estimate import for_stopped

    try:
        num_requests = build(load_config(args.config, FULL + list(args.sets))).workload.num_requests
        return for_stopped(result, args.reference, num_requests)
    except (OSError, KeyError, ValueError) as exc:  # (a missing or malformed reference: the run's figures stay)
        return {"drain_estimate_skipped": f"{type(exc).__name__}: {exc}"}


def _check(args) -> None:
    """Bad arguments as one ValueError before any cut starts (not as a traceback in each cut's row)."""
    from sim.config import build, load_config
    from sim.run import dense_map_bytes

    positive = {"--max-wall-s": args.max_wall_s, "--max-memory-gb": args.max_memory_gb,
                "--policy-workers": args.policy_workers, "--full-run-steps": args.full_run_steps}
    for flag, value in positive.items():
        if value is not None and not value > 0:  # (nan fails too)
            raise ValueError(f"{flag} must be > 0, got {value}")
    if any(s < 0 for s in args.steps) or args.profile_top < 0:
        raise ValueError("--steps and --profile-top must be >= 0")
    dense_map_bytes(args.dense_map_gb)
    build(load_config(args.config, FULL + list(args.sets)))  # (OSError or ValueError: the file, a key, a value)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", type=Path, default=ROOT / "configs" / "paper-h200-tp-specon.yaml")
    p.add_argument("--policy-backend", default="auto", choices=CHOICES)
    p.add_argument("--policy-workers", type=int, default=None,
                   help="processes for the groups (default: the usable cores; a device backend's split at full "
                        "fidelity)")
    p.add_argument("--steps", type=int, nargs="*", default=[2, 6],
                   help="decode-step cuts (0 = the whole run)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--full-run-steps", type=int, default=None, help="decode steps of the whole run (estimate)")
    p.add_argument("--reference", type=Path, default=None, metavar="JSON",
                   help="a whole run of the config from this bench at another fidelity (its progress ticks): a "
                        "stopped run's end estimated from how its requests drain (bench/drain_estimate.py)")
    p.add_argument("--max-wall-s", type=float, default=540.0, help="a cut that runs longer is stopped")
    p.add_argument("--max-memory-gb", type=float, default=None)
    p.add_argument("--dense-map-gb", type=float, default=None, metavar="GB",
                   help="TP address maps dense up to this size a cache (`ulacache replay --dense-map-gb`)")
    p.add_argument("--profile-top", type=int, default=0, metavar="N",
                   help="profile each cut (cProfile, main process) and keep its N functions with the most own time")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "full_fidelity.json")
    args = p.parse_args()
    try:
        _check(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    cuts = []
    for s in args.steps:
        row = run_cut(args, s or None)
        cuts.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "what": "full fidelity (policy_groups=0, request_fraction=1.0) replays cut at decode-step counts, each in a "
                "fresh process",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                     cwd=ROOT).stdout.strip() or None,
        "machine": {"host": platform.node(), "python": platform.python_version(), "cpus": usable_cores()},
        # library threads: $ULACACHE_THREADS as set (unset: ulacache/threads.py's default; a cut that ended has them
        # in its row's policy_threads)
        "ulacache_threads_env": os.environ.get(ENV_VAR) or None,
        "config": str(args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config),
        "sets": args.sets, "dense_map_gb": args.dense_map_gb, "cuts": cuts, "derived": derive(cuts, args.full_run_steps),
    }
    if args.reference is not None:
        result["derived"].update(_drain(result, args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["derived"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
