"""`ulacache trace gen | inspect | convert`: make, examine and import workload traces (cheap to import)."""
from __future__ import annotations

import argparse

MODELS = ("glm-5.2", "glm-5", "deepseek-v3.2")
# Limits with reasons (beyond them a value is a typo that would run for hours or exhaust memory):
MAX_QUERY_TOKENS = 16  # speculative verify tokens per step: SGLang's EAGLE/MTP recipes use 4 (as replay's limit)
MAX_CAPTURE_STEPS = (1 << 24) - 1  # decode steps a captured selection record can name (traces/captured.py _MAX_STEP)
MAX_SAMPLE_STEPS = 4096  # decode steps sampled per request for overlap statistics (a few dozen already converge)


def _check_range(name: str, value: int, lo: int, hi: int, why: str = "") -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi:,}]{f' ({why})' if why else ''}, got {value:,}")


def register(subparsers) -> None:
    p = subparsers.add_parser("trace", help="make, inspect and convert workload traces",
                              description="Workload traces: requests (lengths, arrivals) and sparse selections.")
    sub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    sub.required = True

    g = sub.add_parser("gen", help="generate a trace directory from a profile (or a CSV/JSONL of requests)")
    g.add_argument("--profile", default="multi-lexsum", help="profile name (multi-lexsum, small) or YAML path")
    g.add_argument("--num-requests", type=int, default=None, help="number of requests (required without --from-csv)")
    g.add_argument("--out", required=True, help="output trace directory")
    g.add_argument("--seed", type=int, default=0)
    m = g.add_mutually_exclusive_group()
    m.add_argument("--model", choices=MODELS, default=None, help="sets the number of indexer groups (default glm-5.2)")
    m.add_argument("--num-groups", type=int, default=None, help="indexer groups (layers that compute top-k)")
    g.add_argument("--arrival", choices=("closed", "poisson"), default=None, help="override the profile's arrivals")
    g.add_argument("--rate", type=float, default=None, help="poisson arrival rate in requests/s")
    g.add_argument("--from-csv", default=None, metavar="FILE", help="import requests from CSV or JSONL instead")
    g.add_argument("--capture-steps", type=int, default=0, metavar="N",
                   help="also materialize the first N decode steps of selections in the compact format")
    g.add_argument("--query-tokens", type=int, default=1, help="query tokens per step when materializing")
    g.add_argument("--force", action="store_true", help="replace a trace in --out that ulacache wrote (its manifest)")
    g.set_defaults(func=_gen)

    i = sub.add_parser("inspect", help="print counts, length percentiles, overlap statistics, bytes on disk")
    i.add_argument("path", help="trace directory")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--sample-requests", type=int, default=16)
    i.add_argument("--sample-steps", type=int, default=8)
    i.add_argument("--query-tokens", type=int, default=4, help="speculative query tokens per step to sample")
    i.add_argument("--tokens-per-step", type=int, default=1, help="history growth between sampled steps")
    i.add_argument("--seed", type=int, default=0)
    i.set_defaults(func=_inspect)

    c = sub.add_parser("convert", help="convert a captured selections file (JSONL or NPZ) to a compact trace")
    c.add_argument("capture", help="JSONL of {request, step, group|layer, positions[, history_len]} or NPZ")
    c.add_argument("--out", required=True, help="output trace directory")
    c.add_argument("--requests", default=None, metavar="FILE",
                   help="CSV/JSONL of the requests; default: derived from the capture")
    c.add_argument("--top-k", type=int, default=None, help="top-k of the capture (default: largest set size)")
    c.add_argument("--force", action="store_true", help="replace a trace in --out that ulacache wrote (its manifest)")
    c.set_defaults(func=_convert)


def _gen(args: argparse.Namespace) -> int:
    from traces.api import generate_trace

    _check_range("--query-tokens", args.query_tokens, 1, MAX_QUERY_TOKENS, "SGLang's EAGLE/MTP recipes use 4")
    _check_range("--capture-steps", args.capture_steps, 0, MAX_CAPTURE_STEPS, "the compact format's step field")

    path = generate_trace(args.out, profile=args.profile, num_requests=args.num_requests, seed=args.seed,
                          model=args.model, num_groups=args.num_groups, arrival=args.arrival, rate_per_s=args.rate,
                          from_csv=args.from_csv, capture_steps=args.capture_steps,
                          capture_query_tokens=args.query_tokens, overwrite=args.force)
    print(f"wrote trace {path}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import json

    from traces.api import inspect_trace

    for name in ("sample_requests", "sample_steps", "query_tokens", "tokens_per_step"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    _check_range("--sample-steps", args.sample_steps, 1, MAX_SAMPLE_STEPS, "a few dozen steps already converge")
    _check_range("--query-tokens", args.query_tokens, 1, MAX_QUERY_TOKENS, "SGLang's EAGLE/MTP recipes use 4")
    _check_range("--seed", args.seed, 0, 2**32 - 1)
    info = inspect_trace(args.path, num_requests=args.sample_requests, num_steps=args.sample_steps,
                         num_query_tokens=args.query_tokens, tokens_per_step=args.tokens_per_step, seed=args.seed)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(_format(info))
    return 0


def _format(info: dict) -> str:
    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [f"trace {info['path']} (schema {info['schema_version']}, profile {info['profile']}, seed {info['seed']})"]
    ls = info["lengths"]
    lines.append(f"requests: {ls['num_requests']} ({ls.get('arrival', 'n/a')} arrivals)")
    for col in ("input_tokens", "output_tokens"):
        d = ls[col]
        if d:
            lines.append(f"  {col}: p0 {d['p0']:.0f}  p10 {d['p10']:.0f}  p50 {d['p50']:.0f}  p90 {d['p90']:.0f}  "
                         f"p100 {d['p100']:.0f}  mean {d['mean']:.0f}")
    if "input_frac_at_max" in ls:
        lines.append(f"  inputs at the largest length: {pct(ls['input_frac_at_max'])}")
    s = info["selections"]
    lines.append(f"selections: {s['kind']}, {s['num_groups']} groups, top-{s['top_k']}")
    st = info.get("stats")
    if st:
        lines.append(f"  sampled {st['num_sampled_pairs']} (request, step) pairs, {st['num_query_tokens']} query tokens")
        lines.append(f"  step-to-step overlap: early groups {st['early_groups']} {pct(st['step_overlap_early_mean'])};"
                     f" deep groups mean {pct(st['step_overlap_deep_mean'])} (min {pct(st['step_overlap_deep_min'])},"
                     f" max {pct(st['step_overlap_deep_max'])})")
        lines.append(f"  speculative-token overlap (deep): {pct(st['spec_overlap_deep_mean'])};  adjacent-group "
                     f"overlap (deep): {pct(st['adjacent_overlap_deep_mean'])}")
        lines.append("  group  step-overlap  spec-overlap  adjacent")
        for r in st["per_group"]:
            lines.append(f"  {r['group']:5d}  {pct(r['step_overlap']):>12}  {pct(r['spec_overlap']):>12}  "
                         f"{pct(r['adjacent_overlap']):>8}")
    b = info["bytes_on_disk"]
    lines.append("bytes on disk: " + ", ".join(f"{k} {v:,}" for k, v in b["files"].items()) + f" (total {b['total']:,})")
    if b.get("bytes_per_selection") is not None:
        lines.append(f"  captured selections: {b['bytes_per_selection']:.3f} bytes per selected position")
    return "\n".join(lines)


def _convert(args: argparse.Namespace) -> int:
    from traces.api import convert_to_trace

    path = convert_to_trace(args.capture, args.out, requests_file=args.requests, top_k=args.top_k,
                            overwrite=args.force)
    print(f"wrote trace {path}")
    return 0
