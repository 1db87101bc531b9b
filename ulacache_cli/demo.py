"""`ulacache demo`: the main job on the embedded default, end to end.

1. generate a small Multi-LexSum-shaped trace (`ulacache trace gen`) and print its statistics (`trace inspect`);
2. replay SGLang (GPU-resident), HiSparse (fixed per-request quota) and UlaCache on it over concurrency caps, and
   UlaCache's PB-LRU against exact LRU over GPU pool sizes: the resumable sweeps of
   `sim.studies.sweep.DEMO_SWEEPS` on a local Ray (`--workers 1` runs them in-process);
3. replay one layer group's reference stream of the trace through our pb-lru and lru and libCacheSim's LRU,
   S3-FIFO, ARC and Belady's optimum (`ulacache policy-compare`; peers only with the `peers` extra), cut to
   POLICY_COMPARE_ARGS (128 engine steps, 16 of them warm-up, at 20K/40K/80K GPU slots: ~20 s of CPU, ~40 s wall on
   2 loaded cores, against ~37 s / ~66 s for its defaults of 256 steps), so the report's miss-ratio figure shows
   how far each policy is from the offline optimum;
4. search each system's peak throughput under a TPOT SLO (`ulacache plan`);
5. write the comparison report (`ulacache report`), with the sim-vs-hardware figure drawn from the committed
   H200 measurements of `ulacache hw validate` (hw/results/validate*.json), and print where it is.
Steps 1, 3, 4 and 5 run the very sub-commands a user types, so the demo exercises what the README documents.
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "configs" / "demo.yaml"
HW_RESULTS = ROOT / "hw" / "results"
# `policy-compare` cut to demo time (its defaults replay 256 steps); the sizes span the trace's LRU knee
POLICY_COMPARE_ARGS = ["--max-steps", "128", "--warmup-steps", "16", "--gpu-slots", "20000,40000,80000"]


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="generate a trace, replay the three systems, write the report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("out/demo"), help="output directory (default: out/demo)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="replay config (default: configs/demo.yaml)")
    p.add_argument("--num-requests", type=int, default=48, help="requests in the demo trace")
    p.add_argument("--workers", type=int, default=2, help="parallel replays (1 = in-process, no Ray)")
    p.add_argument("--slo-tpot-ms", type=float, default=25.0, help="TPOT SLO of the plan step")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)


def _rule(title: str) -> None:
    from rich.console import Console

    Console().rule(f"[bold]{title}")


def _step(title: str, argv: list[str]) -> None:
    from ulacache_cli.main import main

    _rule(title)
    print("$ ulacache " + " ".join(argv), flush=True)
    status = main(argv)
    if status != 0:
        raise RuntimeError(f"demo step failed ({title}): ulacache {' '.join(argv)} exited {status}")


def _demo(args: argparse.Namespace) -> int:
    if not args.config.is_file():
        raise FileNotFoundError(f"demo config not found: {args.config}")
    if args.num_requests < 16 or args.workers < 1:
        raise ValueError("--num-requests must be >= 16 and --workers >= 1")
    out: Path = args.out
    trace = out / "trace"
    _step("1/6 generate the trace", ["trace", "gen", "--profile", "small", "--num-requests", str(args.num_requests),
                                     "--seed", str(args.seed), "--out", str(trace), "--force"])
    _step("2/6 inspect the trace", ["trace", "inspect", str(trace)])

    from sim.studies.sweep import DEMO_SWEEPS, run_demo_sweeps

    _rule("3/6 replay sglang / hisparse / ulacache over concurrency caps; pb-lru vs lru over GPU pool sizes")
    on_trace = [f"workload.trace={trace}", f"workload.seed={args.seed}"]
    sweeps = {name: (grid, [*sets, *on_trace]) for name, (grid, sets) in DEMO_SWEEPS.items()}
    for name, (grid, sets) in sweeps.items():
        print(f"sweep {name}: grid {' '.join(grid)}; set {' '.join(sets)}")
    resume = all((out / name / "sweep.yaml").exists() for name in sweeps)
    results = run_demo_sweeps(args.config, out, workers=args.workers, resume=resume, sweeps=sweeps)
    failed = {name: int((df["status"] != "ok").sum()) for name, df in results.items()}
    if any(failed.values()):
        raise RuntimeError(f"demo sweep points failed: {failed} (see {out}/*/results.csv)")

    _step("4/6 policy-compare: our pb-lru / lru vs libCacheSim LRU, S3-FIFO, ARC and Belady on the trace",
          ["policy-compare", str(trace), "--out", str(out / "policy_compare"), *POLICY_COMPARE_ARGS, "--force"])

    _step("5/6 plan: peak decode throughput per system under the TPOT SLO",
          ["plan", "--model", "glm-5.2", "--hardware", "h200", "--num-gpus", "8", "--gpu-kv-gb", "2.5",
           "--cpu-kv-gb", "10", "--slo-tpot-ms", str(args.slo_tpot_ms), "--attention", "tp",
           "--config", str(args.config), "--set", f"workload.trace={trace}", "--max-concurrency", "32",
           "--requests-per-cap", "2", "--out", str(out / "plan"), "--force"])

    measured = sorted(HW_RESULTS.glob("validate*.json"))
    if measured:  # real H200 measurements committed with their provenance; never synthesised here
        from traces.atomic import atomic_write

        (out / "hw").mkdir(parents=True, exist_ok=True)
        for path in measured:  # temp name + rename: a report never reads a half-copied file
            atomic_write(out / "hw" / path.name, lambda tmp, src=path: shutil.copy2(src, tmp))
    _step("6/6 write the report", ["report", str(out), "--out", str(out / "report"), "--force"])
    print(f"\nreport: {(out / 'report' / 'index.html').resolve()}")
    return 0
