"""`ulacache hw bench|calibrate|hisparse|validate`: the real-hardware validator's commands (cheap to import: work is in handlers)."""
from __future__ import annotations

import argparse


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v}")
    return v


def register(subparsers) -> None:
    hw = subparsers.add_parser("hw", help="GPU kernels, calibration and validation on a CUDA host")
    sub = hw.add_subparsers(dest="hw_command", metavar="HW_COMMAND")
    sub.required = True

    b = sub.add_parser("bench", help="access-batch rate, row exchange and peer gather bandwidths -> JSON")
    b.add_argument("--out", default="hw/results/bench.json", help="JSON file to write")
    b.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    b.add_argument("--sections", default="", help="comma list of ceilings,access,exchange,peer (default all)")
    b.set_defaults(func=_bench)

    c = sub.add_parser("calibrate", help="measure the simulator's cost-model keys -> calibration YAML")
    c.add_argument("--out", default="hw/calibration/h200.yaml", help="calibration YAML to write")
    c.add_argument("--json", default="", help="also write the raw measurements here")
    c.add_argument("--hisparse-json", default="", help="merge the HiSparse swap-in keys of this `hw hisparse` JSON")
    c.add_argument("--from-json", default="", help="no GPU: re-derive the calibration from this raw JSON (--json)")
    c.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    c.set_defaults(func=_calibrate)

    h = sub.add_parser("hisparse", help="HiSparse swap-in kernel: check vs numpy, time per batch -> JSON")
    h.add_argument("--out", default="hw/results/hisparse_swapin.json", help="JSON file to write")
    h.add_argument("--batches", default="", help="comma list of batch sizes (default 1,4,16,64,256)")
    h.add_argument("--block", type=_positive_int, default=960,
                   help="threads per block (one block per request; default SGLang's 960), the calibrated table")
    h.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    h.set_defaults(func=_hisparse)

    v = sub.add_parser("validate", help="replay a trace on the GPU and in the cost model; per-step error -> JSON")
    v.add_argument("trace", nargs="?", default=None,
                   help="trace directory (requests.parquet + trace.yaml) or 'synthetic' (not with --from-json)")
    v.add_argument("--ranks", type=_positive_int, default=1, help="ranks, one GPU each")
    v.add_argument("--mode", choices=("dp", "tp"), default=None, help="attention mode (default: tp when ranks > 1)")
    v.add_argument("--calibration", default="hw/calibration/h200.yaml", help="calibration YAML for the cost model")
    v.add_argument("--steps", type=_positive_int, default=40, help="decode steps to replay")
    v.add_argument("--warmup-steps", type=int, default=2, help="first steps left out of the error figures")
    v.add_argument("--requests", type=_positive_int, default=64, help="running requests (first N of the trace)")
    v.add_argument("--history", type=_positive_int, default=16384, help="tokens of history per request (cap)")
    v.add_argument("--gpu-slots", type=_positive_int, default=1 << 18, help="GPU pool slots per rank")
    v.add_argument("--local-buffer-slots", type=int, default=0,
                   help="TP local buffer slots per rank (0 = the selections' working set, rounded up to 4096)")
    v.add_argument("--row-bytes", type=_positive_int, default=656, help="KV row bytes (656 FP8 MLA, 1152 BF16)")
    v.add_argument("--draft-tokens", type=int, default=3, help="speculative draft tokens (query tokens = 1 + this)")
    v.add_argument("--backend", choices=("cupy", "numpy"), default="cupy",
                   help="cupy: real GPU run; numpy: CPU dry run of the same logic (no timings)")
    v.add_argument("--reverse-launch", action="store_true",
                   help="diagnostic: enqueue the ranks' transfers last rank first (does a rank's time follow order?)")
    v.add_argument("--exchange-kernel", choices=("device", "grid"), default=None,
                   help="device: the pipeline's exchange from its device lists (GPU r > 0 copies its slice from GPU "
                        "0 first); grid: the calibrated exchange_rows with each rank's lists on its GPU (as a "
                        "per-rank deployment has them). Default: device with one rank, grid with several")
    v.add_argument("--from-json", action="append", default=[], metavar="RUN_JSON",
                   help="no GPU: re-predict this stored validate JSON (repeatable) with --calibration; --out gets "
                        "the before/after errors")
    v.add_argument("--cost", action="append", default=[], metavar="KEY=VALUE",
                   help="with --from-json: override a cost key (a sensitivity; recorded in the output)")
    v.add_argument("--after-exchange-from", default="", metavar="RUN_JSON",
                   help="with --from-json: set peer_after_exchange_latency_s from this TP run's per-rank gather "
                        "timings (gather_r*) minus the warm peer model (a sensitivity, recorded in the output)")
    v.add_argument("--out", default="validate.json", help="JSON file to write")
    v.set_defaults(func=_validate)


def _bench(args) -> int:
    from hw import bench

    return bench.main(args)


def _calibrate(args) -> int:
    from hw import calibrate

    return calibrate.main(args)


def _hisparse(args) -> int:
    from hw import hisparse_bench

    return hisparse_bench.main(args)


def _validate(args) -> int:
    if args.from_json:
        if args.trace is not None:
            raise ValueError("hw validate: give a trace or --from-json, not both")
        from hw import repredict

        return repredict.main(args)
    if args.trace is None:
        raise ValueError("hw validate: a trace directory or 'synthetic' is required (or --from-json RUN_JSON)")
    if args.cost or args.after_exchange_from:
        raise ValueError("hw validate: --cost and --after-exchange-from are only for --from-json re-predictions")
    from hw import validate

    return validate.main(args)
