"""A full-fidelity hit rate from one indexer group at a time (issue 29 item 3, where a whole run does not fit).

The policy's groups are independent caches, and on a config whose decode batches do not depend on the hits (every
request's steps and tokens are fixed by the workload; check `decode_tokens` below) a full run's step sums each
group's hits and unique references weighted by its layers (sim/engine.py `_link_totals`). A replay with
`fidelity.only_group=g` at full request fraction runs group g's cache exactly as the full run does, standing for
all L layers, so over the run

    hits_full = sum_g (layers_g / L) * hits_g        unique_full = sum_g (layers_g / L) * unique_g

with hits_g = gpu_hit_rate_g * unique_ref_fraction_g * refs (refs, every run's references, is the same in each).
Each group's replay needs one cache's memory (~1.4 GB for a paper TP group), not all 21 at once, and the groups run
in parallel processes. The hit rate combines in closed form; the timing does not (a step's time depends on all
groups' hits at once). With `--ratios DIR` each group's replay also records its ratios step by step
(sim/ratio_replay.py, DIR/group_NN.npz), and the full-fidelity replay is run with all of them played back
(`played`: every metric of the full run, tok/s included, exactly; its hit rate is checked against the
combination's). The playback runs in one more process beside the groups' replays, reading what they stream
(sim/ratio_stream.py, DIR/group_NN.stream while they run), so it ends just after the slowest group; a rerun with
every log there plays them back from the files.

`--check-full` also runs the full-fidelity replay whole (a small config only) and states both: the decomposition's
check. Finished groups are kept in --out as they end; a rerun with the same --out skips them (a killed run resumes).

Usage: python bench/full_fidelity_by_group.py configs/paper-h200-tp-specon.yaml [--set KEY=VALUE] [--processes 2]
           [--groups 0 1 ...] [--check-full] [--ratios DIR] --out bench/results/full_fidelity_by_group_h200-tp-specon.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import multiprocessing.connection
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from traces.atomic import atomic_write_text  # noqa: E402

FULL = ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0", "fidelity.step_stride=1"]
# A group's process holds one group's caches, not all 21: its TP maps stay dense (paper-h200-tp-specoff group 0:
# 323 s, 2.5 GB peak RSS, against ~543 s for its first 600 of 6,000 steps on the library's rule, hashed).
DENSE_MAP_GB = 8.0
KEEP = ("decode_steps", "decode_tokens", "completed_requests", "gpu_hit_rate", "unique_ref_fraction",
        "decode_throughput_tok_s", "peak_rss_bytes", "sim_wall_s")


def _replay(job: dict) -> dict:
    """One group's (or the whole) replay in this (forked) process: the metrics kept. With `log`, its ratios are
    recorded there at its end, and with `stream` also streamed as they are made (for a playback running meanwhile)."""
    import sim
    from sim.ratio_replay import RatioLog

    log = RatioLog(stream=job.get("stream")) if job.get("log") else None
    t0 = time.perf_counter()
    m = sim.replay(job["config"], None, overrides=job["sets"], policy_workers=1, policy_backend="numpy",
                   ratio_log=log, dense_map_gb=job.get("dense_map_gb"))
    if log is not None:
        log.save(job["log"])
    return {**{k: m[k] for k in KEEP}, "wall_s": time.perf_counter() - t0}


def play(config: str, sets: list[str], sources: list[tuple[str, Path]]) -> dict:
    """The full-fidelity replay with every group's recorded ratios played back: all its metrics, and its wall time.
    `sources`: ("log", a finished log's .npz) or ("stream", a stream its replay is writing now: read as it grows)."""
    import sim
    from sim.ratio_replay import RatioLog, RatioPlayer
    from sim.ratio_stream import RatioStream

    t0, c0 = time.perf_counter(), time.process_time()
    player = RatioPlayer([RatioLog.load(p) if kind == "log" else RatioStream(p) for kind, p in sources])
    m = sim.replay(config, None, overrides=FULL + sets, ratio_player=player)
    return {**m, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "ratio_logs": [str(p) for _, p in sources],
            "streamed": any(kind == "stream" for kind, _ in sources)}


def _play_job(job: dict) -> dict:
    """A playback in a forked process; a playback that fails is reported, not raised (the groups go on)."""
    try:
        return play(job["config"], job["sets"], job["sources"])
    except ValueError as e:
        return {"play_error": str(e)}


def _child(job: dict, conn) -> None:
    try:
        conn.send((_play_job if job.get("play") else _replay)(job))
    except BaseException as e:  # (the parent states it)
        conn.send({"error": f"{type(e).__name__}: {e}"})


def in_processes(jobs: list, processes: int):
    """(index, metrics) of each job as it ends, at most `processes` forked replays at once (each a fresh process:
    its memory goes back at its end; forked, so the function is not pickled)."""
    ctx = mp.get_context("fork")
    pending, running = list(enumerate(jobs)), {}
    while pending or running:
        while pending and len(running) < max(1, processes):
            i, job = pending.pop(0)
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(job, send))
            proc.start()
            send.close()
            running[recv] = (i, proc)
        for recv in mp.connection.wait(list(running)):
            i, proc = running.pop(recv)
            try:
                row = recv.recv()
            except EOFError:
                row = {"error": f"the replay's process ended with code {proc.exitcode}"}
            proc.join()
            if "error" in row:
                for _, other in running.values():
                    other.kill()
                raise ValueError(f"job {i}: {row['error']}")
            yield i, row


def combine(rows: dict[int, dict], layers: list[int]) -> dict:
    """The full run's hit rate from every group's own replay (`rows`: group -> metrics), weighted by its layers."""
    total = float(sum(layers))
    hits = sum(layers[g] / total * r["gpu_hit_rate"] * r["unique_ref_fraction"] for g, r in rows.items())
    unique = sum(layers[g] / total * r["unique_ref_fraction"] for g, r in rows.items())
    tokens = {r["decode_tokens"] for r in rows.values()}
    steps = {r["decode_steps"] for r in rows.values()}
    return {"gpu_hit_rate": hits / unique if unique else 1.0, "unique_ref_fraction": unique,
            "groups": len(rows), "of_groups": len(layers),
            "same_batches": len(tokens) == 1 and len(steps) == 1,  # every group saw the same decode steps and tokens
            "decode_steps": min(steps), "decode_tokens": min(tokens)}


def _load(out: Path) -> dict:
    if not out.exists():
        return {}
    try:
        return json.loads(out.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _save(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=1) + "\n")


def _layers(config: str, sets: list[str]) -> list[int]:
    from sim.config import build, load_config

    return [int(x) for x in build(load_config(Path(config), sets)).model.group_sizes()]


def _ratio_path(args, g: int, ext: str) -> Path:
    return args.ratios / f"group_{g:02d}.{ext}"


def _jobs(args, config: str, layers: list[int], groups: list[int], rows: dict) -> list[dict]:
    """The replays of the groups to run (not in --out, or without their ratio log); with --ratios and every
    group either logged or to be replayed now, a playback first that reads the new ones' streams as they grow."""
    logged = {g: _ratio_path(args, g, "npz").exists() for g in range(len(layers))} if args.ratios else {}
    todo = [g for g in groups if g not in rows or (args.ratios and not logged[g])]
    jobs = [{"group": g, "config": config, "sets": FULL + args.sets + [f"fidelity.only_group={g}"],
             "dense_map_gb": args.dense_map_gb,
             "log": _ratio_path(args, g, "npz") if args.ratios else None,
             "stream": _ratio_path(args, g, "stream") if args.ratios else None} for g in todo]
    for job in jobs:  # a stream left by a killed run is not read as this one's
        if job["stream"] is not None:
            job["stream"].unlink(missing_ok=True)
    if args.ratios and todo and all(logged[g] or g in todo for g in logged):
        sources = [("stream", _ratio_path(args, g, "stream")) if g in todo else ("log", _ratio_path(args, g, "npz"))
                   for g in range(len(layers))]
        jobs.insert(0, {"play": True, "config": config, "sets": args.sets, "sources": sources})
    return jobs


def _played(result: dict, row: dict) -> None:
    if "play_error" in row:
        result.pop("played", None)
        result["play_error"] = row["play_error"]
        print(f"playback: {row['play_error']}", flush=True)
    else:
        result.pop("play_error", None)
        result["played"] = row


def _check(args, num_groups: int) -> None:
    """Bad arguments as one ValueError before any replay starts (not as a failed job's error after others ran)."""
    from sim.run import dense_map_bytes

    if args.processes < 1:
        raise ValueError(f"--processes must be at least 1, got {args.processes}")
    dense_map_bytes(args.dense_map_gb)
    bad = sorted({g for g in args.groups or [] if not 0 <= g < num_groups})
    if bad:
        raise ValueError(f"--groups {' '.join(map(str, bad))}: this config has groups 0-{num_groups - 1}")
    if args.ratios is not None:
        try:
            args.ratios.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--ratios {args.ratios}: cannot create the directory ({e.strerror})") from None


def run(args) -> dict:
    config = str(args.config)
    layers = _layers(config, FULL + args.sets)
    _check(args, len(layers))
    groups = sorted(set(args.groups)) if args.groups else list(range(len(layers)))
    result = _load(args.out)
    if result.get("config") != config or result.get("sets") != args.sets:
        result = {}
    result.update({
        "what": "full-fidelity figures from one indexer group at a time (fidelity.only_group): the hit rate weighted "
                "by layers (combined); with --ratios every metric, the groups' ratios played back (played)",
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "config": config, "sets": args.sets,
        "machine": {"host": platform.node(), "python": platform.python_version(), "processes": args.processes,
                    "dense_map_gb": args.dense_map_gb},
        "layers": layers})
    rows = {int(g): r for g, r in result.get("groups", {}).items()}
    jobs = _jobs(args, config, layers, groups, rows)
    for i, row in in_processes(jobs, args.processes + (1 if jobs and jobs[0].get("play") else 0)):
        if jobs[i].get("play"):  # (it waits for the slowest group: the last to end)
            _played(result, row)
            continue
        g = jobs[i]["group"]
        rows[g] = row
        result["groups"] = {str(k): rows[k] for k in sorted(rows)}
        result["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        _save(args.out, result)
        print(f"group {g}: hit rate {row['gpu_hit_rate']:.4f} in {row['wall_s']:.1f} s", flush=True)
    result["combined"] = combine(rows, layers)
    logs = [_ratio_path(args, g, "npz") for g in range(len(layers))] if args.ratios else []
    if logs and all(p.exists() for p in logs) and not (jobs and jobs[0].get("play")):
        _played(result, play(config, args.sets, [("log", p) for p in logs]))  # (from finished logs: a rerun)
    if "played" in result:
        result["played"]["hit_rate_matches_combined"] = abs(
            result["played"]["gpu_hit_rate"] - result["combined"]["gpu_hit_rate"]) < 1e-9
    for p in logs:  # a finished group's stream is its log's copy
        if p.exists():
            p.with_suffix(".stream").unlink(missing_ok=True)
    if args.check_full:
        result["full_run"] = _replay({"config": config, "sets": FULL + args.sets})
    _save(args.out, result)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", type=Path)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--groups", type=int, nargs="*", default=None, help="these groups only (default: all)")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--check-full", action="store_true", help="also the full replay whole (small configs)")
    p.add_argument("--ratios", type=Path, default=None, metavar="DIR",
                   help="record each group's ratios here and play them back together: the full run's tok/s")
    p.add_argument("--dense-map-gb", type=float, default=DENSE_MAP_GB, metavar="GB",
                   help="each group's TP address maps dense up to this size a cache (`ulacache replay --dense-map-gb`; "
                   f"default {DENSE_MAP_GB:g}: one group a process affords it)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    try:
        result = run(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shown = {k: result[k] for k in ("combined", "full_run") if k in result}
    if "played" in result:
        shown["played"] = {k: result["played"][k] for k in KEEP + ("hit_rate_matches_combined", "wall_s")}
    print(json.dumps(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
