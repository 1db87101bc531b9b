"""`ulacache sweep` and `ulacache plan` sub-commands (cheap to import: the work is imported in the handlers)."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    sw = subparsers.add_parser(
        "sweep", help="run one replay per grid point (local Ray, a Ray cluster, or in-process); resumable",
        description="Run one replay per point of a grid; results go to OUT/results.parquet and OUT/results.csv "
        "as points finish. Example: ulacache sweep configs/demo.yaml --grid system=sglang,hisparse,ulacache "
        "--grid workload.max_concurrency=1,4,16 --out out/sweep")
    sw.add_argument("config", type=Path, help="base replay config (YAML)")
    sw.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="a dotted config key and its values, each typed as --set types it; repeat for a "
                    "cartesian product")
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="override a config key for every point; value read as YAML (8, true, 2.5e9, [0.5, 0.5], null for none), the same for replay, sweep and plan")
    sw.add_argument("--out", type=Path, required=True, help="sweep dir (must not exist unless --resume)")
    sw.add_argument("--workers", type=int, default=None,
                    help="parallel replays (default: CPU count); 1 runs in-process without Ray")
    sw.add_argument("--address", default=None, help="address of an existing Ray cluster (host:port or ray://host:10001); workers need "
                    "this package installed; the table and metrics.json are written by this process, per-point "
                    "timelines on the worker's disk unless the sweep dir is shared; Ray >= 2.5x token auth: the cluster's token must reach this process "
                    "(~/.ray/auth_token or RAY_AUTH_TOKEN)")
    sw.add_argument("--resume", action="store_true", help="continue a sweep dir, skipping finished points")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.set_defaults(func=_sweep)

    pl = subparsers.add_parser(
        "plan", help="find each system's peak decode throughput under a TPOT SLO by searching concurrency",
        description="For each system, search workload.max_concurrency (exponential bracket, binary search on "
        "the SLO edge, golden-section on throughput) over real replays; prints a table and writes "
        "OUT/plan.json and OUT/plan.png.")
    pl.add_argument("--model", required=True, help="model preset (glm-5, glm-5.2, deepseek-v3.2)")
    pl.add_argument("--hardware", required=True, help="hardware preset (h200, b300)")
    pl.add_argument("--num-gpus", type=int, default=8)
    pl.add_argument("--gpu-kv-gb", type=float, default=None, help="GPU KV budget per GPU in GB (default: preset)")
    pl.add_argument("--cpu-kv-gb", type=float, default=None, help="CPU KV budget per GPU in GB (default: preset)")
    pl.add_argument("--slo-tpot-ms", type=float, required=True, help="TPOT SLO in ms (on --slo-metric)")
    pl.add_argument("--slo-metric", default="tpot_ms_p50", choices=("tpot_ms_p50", "tpot_ms_mean"))
    pl.add_argument("--systems", default="sglang,hisparse,ulacache", help="comma-separated systems")
    pl.add_argument("--attention", default="dp", choices=("dp", "tp"))
    pl.add_argument("--config", type=Path, default=None,
                    help="base config for the workload and other keys (default: configs/demo.yaml)")
    pl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="extra config override for every replay; value read as YAML (8, true, 2.5e9, [0.5, 0.5], null for none), the same for replay, sweep and plan")
    pl.add_argument("--max-concurrency", type=int, default=None,
                    help="upper end of the search (default: workload.num_requests, else workload.max_concurrency)")
    pl.add_argument("--requests-per-cap", type=int, default=0,
                    help="replay N x cap requests at each cap (0 = the config's workload.num_requests; when it has "
                         "none, 2 x cap)")
    pl.add_argument("--buffer-fractions", default="", metavar="F1,F2,...",
                    help="TP: also search UlaCache with these shares of the GPU KV budget for its local buffer "
                         "(ulacache.local_buffer_fraction), beside its default split")
    pl.add_argument("--rel-tol", type=float, default=0.0,
                    help="stop the SLO-edge search when the bracket is within this fraction (0 = exact)")
    pl.add_argument("--workers", type=int, default=None,
                    help="systems searched in parallel processes (default: CPU count; 1 = one after another)")
    pl.add_argument("--out", type=Path, required=True, help="output dir for plan.json, plan.png and the replays")
    pl.add_argument("--force", action="store_true", help="replace an earlier plan in --out (only one `ulacache plan` "
                    "wrote: its manifest)")
    pl.set_defaults(func=_plan)


def _fractions(text: str) -> list[float]:
    """`--buffer-fractions 0.05,0.1` -> [0.05, 0.1]; each in [0, 1)."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            value = float(item)
        except ValueError:
            raise ValueError(f"--buffer-fractions: {item!r} is not a number") from None
        if not 0 <= value < 1:
            raise ValueError(f"--buffer-fractions: {value} must be in [0, 1)")
        out.append(value)
    return out


def _positive(name: str, value) -> None:
    import math

    if value is not None and not (value > 0 and math.isfinite(value)):  # nan and inf refused too
        raise ValueError(f"{name} must be > 0 (a finite number), got {value}")


def _sweep(args: argparse.Namespace) -> int:
    import os

    from rich.console import Console

    from sim.studies.sweep import parse_grid, run_sweep

    grid = parse_grid(args.grid)
    workers = args.workers if args.workers is not None else max(1, os.cpu_count() or 1)
    df = run_sweep(args.config, grid, args.out, sets=args.sets, workers=workers, address=args.address,
                   resume=args.resume, progress=not args.no_progress)
    num_ok = int((df["status"] == "ok").sum()) if len(df) else 0
    num_err = len(df) - num_ok
    console = Console(stderr=False)
    console.print(f"sweep: {num_ok} ok, {num_err} error -> {args.out / 'results.parquet'}")
    if num_err:
        for _, row in df[df["status"] != "ok"].head(5).iterrows():
            console.print(f"  error {row['point_id']}: {row['error']}", markup=False, highlight=False)
    return 0


def _plan(args: argparse.Namespace) -> int:
    from sim.studies.plan import print_plan, run_plan

    _positive("--num-gpus", args.num_gpus)
    _positive("--gpu-kv-gb", args.gpu_kv_gb)
    _positive("--cpu-kv-gb", args.cpu_kv_gb)
    _positive("--slo-tpot-ms", args.slo_tpot_ms)
    _positive("--max-concurrency", args.max_concurrency)
    if args.requests_per_cap < 0:
        raise ValueError(f"--requests-per-cap must be >= 0, got {args.requests_per_cap}")
    from sim.config import MAX_REQUESTS

    if (args.max_concurrency or 1) * max(1, args.requests_per_cap) > MAX_REQUESTS:
        raise ValueError(f"--max-concurrency x --requests-per-cap must be <= {MAX_REQUESTS:,} requests per replay "
                         f"(a replay simulates every request), got {args.max_concurrency:,} x "
                         f"{max(1, args.requests_per_cap):,}")
    if not 0 <= args.rel_tol < 1:
        raise ValueError(f"--rel-tol must be in [0, 1), got {args.rel_tol}")
    import os

    _positive("--workers", args.workers)
    workers = args.workers or max(1, os.cpu_count() or 1)
    systems = list(dict.fromkeys(s.strip() for s in args.systems.split(",") if s.strip()))
    if not systems:
        raise ValueError("--systems is empty")
    from traces.atomic import StagedDir, check_out_path

    # the plan (plan.json, plan.png, its replays) is built in a hidden sibling and renamed into place whole
    check_out_path(args.out, args.force, command="plan", what="plan")
    with StagedDir(args.out, command="plan", replace=args.force) as stage:
        result = run_plan(model=args.model, hardware=args.hardware, num_gpus=args.num_gpus,
                          gpu_kv_gb=args.gpu_kv_gb, cpu_kv_gb=args.cpu_kv_gb, slo_tpot_ms=args.slo_tpot_ms,
                          slo_metric=args.slo_metric, systems=systems, attention=args.attention, config=args.config,
                          sets=args.sets, max_concurrency=args.max_concurrency, rel_tol=args.rel_tol,
                          requests_per_cap=args.requests_per_cap, out_dir=stage.path, workers=workers,
                          progress=True, buffer_fractions=_fractions(args.buffer_fractions))
        stage.publish()
    result["plot"] = str(args.out / "plan.png")
    print_plan(result)
    return 0
