"""`ulacache demo`: the main job on the embedded default, end to end.

1. generate a small Multi-LexSum-shaped trace (`ulacache trace gen`) and print its statistics (`trace inspect`);
2. replay SGLang (GPU-resident), HiSparse (fixed per-request quota) and UlaCache on it over a grid of concurrency
   caps, plus UlaCache with exact LRU, as one resumable sweep (`ulacache sweep`, local Ray workers);
3. write the comparison report (`ulacache report`) and print where it is.
Each step is the same sub-command a user would type, so the demo exercises exactly what the README documents.
"""
from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"
SYSTEMS = "sglang,hisparse,ulacache"
CONCURRENCY_CAPS = "1,4,12,24,48"


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="generate a trace, replay the three systems, write the report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("out/demo"), help="output directory (default: out/demo)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="replay config (default: configs/demo.yaml)")
    p.add_argument("--num-requests", type=int, default=48, help="requests in the demo trace")
    p.add_argument("--workers", type=int, default=2, help="parallel replays (1 = in-process, no Ray)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_demo)


def _step(title: str, argv: list[str]) -> None:
    from rich.console import Console

    from ulacache_cli.main import main

    Console().rule(f"[bold]{title}")
    print("$ ulacache " + " ".join(argv), flush=True)
    status = main(argv)
    if status != 0:
        raise RuntimeError(f"demo step failed ({title}): ulacache {' '.join(argv)} exited {status}")


def _demo(args: argparse.Namespace) -> int:
    if not args.config.is_file():
        raise FileNotFoundError(f"demo config not found: {args.config}")
    if args.num_requests < 1 or args.workers < 1:
        raise ValueError("--num-requests and --workers must be >= 1")
    out: Path = args.out
    trace, sweep, report = out / "trace", out / "sweep", out / "report"
    caps = ",".join(c for c in CONCURRENCY_CAPS.split(",") if int(c) <= args.num_requests)
    _step("1/4 generate the trace", ["trace", "gen", "--profile", "small", "--num-requests", str(args.num_requests),
                                     "--seed", str(args.seed), "--out", str(trace), "--force"])
    _step("2/4 inspect the trace", ["trace", "inspect", str(trace)])
    base = [str(args.config), "--set", f"workload.trace={trace}", "--set", f"workload.seed={args.seed}",
            "--set", f"workload.num_requests={args.num_requests}", "--workers", str(args.workers)]
    resume = ["--resume"] if (sweep / "sweep.yaml").exists() else []
    _step("3/4 replay sglang, hisparse, ulacache (pb-lru and exact lru) over concurrency caps",
          ["sweep", *base, "--grid", f"system={SYSTEMS}", "--grid", f"workload.max_concurrency={caps}",
           "--grid", "policy=pb-lru,lru", "--out", str(sweep), *resume])
    _step("4/4 write the report", ["report", str(out), "--out", str(report)])
    print(f"\nreport: {(report / 'index.html').resolve()}")
    return 0
