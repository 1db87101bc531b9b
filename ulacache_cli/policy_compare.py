"""`ulacache policy-compare TRACE --out DIR`: hit ratios of our policies and libCacheSim's on one layer group's
reference stream (cheap to import; the work is in sim.studies.policy_compare)."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

OUTPUTS = ("policy_compare.parquet", "policy_compare.csv", "policy_compare.json")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "policy-compare", help="our pb-lru/lru vs libCacheSim LRU, S3-FIFO, ARC, Belady on a trace's references",
        description="Replays one layer group's deduplicated reference stream (see sim/studies/policy_compare.py) through "
        "our pb-lru and lru and, when the 'peers' extra (libcachesim) is installed, libCacheSim's LRU, S3-FIFO, ARC "
        "and Belady's offline optimum, at each GPU pool size; writes policy_compare.parquet/.csv/.json to DIR.")
    p.add_argument("trace", type=Path, help="trace directory (ulacache trace gen)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--group", type=int, default=None, help="layer group (default: the middle one)")
    p.add_argument("--gpu-slots", default="20000,40000,80000", help="comma-separated GPU pool sizes (token slots)")
    p.add_argument("--warmup-steps", type=int, default=32, help="leading engine steps not counted")
    p.add_argument("--num-requests", type=int, default=None, help="first N requests of the trace (default all)")
    p.add_argument("--concurrency", type=int, default=8, help="requests decoding at once")
    p.add_argument("--query-tokens", type=int, default=1, help="selections per request and step (spec verify)")
    p.add_argument("--max-steps", type=int, default=256, help="engine steps replayed at most")
    p.add_argument("--no-peers", action="store_true", help="run only our policies")
    p.add_argument("--force", action="store_true", help="replace an earlier policy_compare in DIR (only files it wrote: their manifests)")
    p.set_defaults(func=_run)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--gpu-slots must be comma-separated integers, got {text!r}") from None
    if not sizes or len(sizes) > 32:
        raise ValueError(f"--gpu-slots needs 1 to 32 sizes, got {text!r}")
    return sorted(set(sizes))


def _run(args: argparse.Namespace) -> int:
    import pandas as pd

    from sim.studies.policy_compare import compare
    from traces.atomic import StagedFile, check_out_file

    out: Path = args.out
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"{out}: --out exists and is not a directory")
    for name in OUTPUTS:  # each file is replaced only with --force, and only if policy-compare wrote it
        check_out_file(out / name, args.force, command="policy-compare")
    t0 = time.perf_counter()
    rows, meta = compare(args.trace, _sizes(args.gpu_slots), args.group, args.warmup_steps, args.num_requests,
                         args.concurrency, args.query_tokens, args.max_steps, peers=not args.no_peers)
    meta.update({"command": " ".join(["ulacache", *sys.argv[1:]]), "date": dt.datetime.now(dt.timezone.utc)
                 .isoformat(timespec="seconds"), "machine": platform.node(), "load_avg": list(os.getloadavg()),
                 "wall_s": round(time.perf_counter() - t0, 2), "rows": rows})
    df = pd.DataFrame(rows)
    # staged in a fresh hidden dir made by mkdtemp inside --out (never a planted name), fsynced, renamed into place
    with StagedFile(out / OUTPUTS[0], command="policy-compare", replace=args.force) as stage:
        df.to_parquet(stage.path, index=False)
        df.to_csv(stage.sibling(OUTPUTS[1]), index=False)
        stage.sibling(OUTPUTS[2]).write_text(json.dumps(meta, indent=1) + "\n")
        stage.publish()
    show = df.assign(hit_ratio=df["hit_ratio"].round(4)).pivot(index="policy", columns="gpu_slots",
                                                                  values="hit_ratio")
    from sim.studies.peers import PEERS
    from sim.studies.policy_compare import OURS

    show = show.reindex([p for p in (*OURS, *PEERS) if p in show.index])
    print(f"policy-compare: group {meta['group']}, {meta['num_steps']} steps ({meta['warmup_steps']} warm-up), "
          f"{meta['num_requests']} requests at concurrency {meta['concurrency']}; hit ratio after warm-up:")
    print(show.to_string())
    if meta["note"]:
        print(f"note: {meta['note']}")
    print(f"wrote {out / 'policy_compare.parquet'} (+ .csv, .json)")
    return 0
