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


_FORCE_HELP = "replace an existing output file, only one this command wrote (its manifest beside it)"


def register(subparsers) -> None:
    hw = subparsers.add_parser("hw", help="GPU kernels, calibration and validation on a CUDA host")
    sub = hw.add_subparsers(dest="hw_command", metavar="HW_COMMAND")
    sub.required = True

    b = sub.add_parser("bench", help="access-batch rate, row exchange and peer gather bandwidths -> JSON")
    b.add_argument("--out", default="hw/results/bench.json", help="JSON file to write")
    b.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    b.add_argument("--sections", default="", help="comma list of ceilings,access,exchange,peer (default all)")
    b.add_argument("--force", action="store_true", help=_FORCE_HELP)
    b.set_defaults(func=_bench)

    c = sub.add_parser("calibrate", help="measure the simulator's cost-model keys -> calibration YAML")
    c.add_argument("--out", default="hw/calibration/h200.yaml", help="calibration YAML to write")
    c.add_argument("--json", default="", help="also write the raw measurements here")
    c.add_argument("--hisparse-json", default="", help="merge the HiSparse swap-in keys of this `hw hisparse` JSON")
    c.add_argument("--from-json", default="", help="no GPU: re-derive the calibration from this raw JSON (--json)")
    c.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    c.add_argument("--force", action="store_true", help=_FORCE_HELP)
    c.set_defaults(func=_calibrate)

    h = sub.add_parser("hisparse", help="HiSparse swap-in kernel: check vs numpy, time per batch -> JSON")
    h.add_argument("--out", default="hw/results/hisparse_swapin.json", help="JSON file to write")
    h.add_argument("--batches", default="", help="comma list of batch sizes (default 1,4,16,64,256)")
    h.add_argument("--block", type=_positive_int, default=960,
                   help="threads per block (one block per request; default SGLang's 960), the calibrated table")
    h.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    h.add_argument("--force", action="store_true", help=_FORCE_HELP)
    h.set_defaults(func=_hisparse)

    _register_validate(sub)


def _register_validate(sub) -> None:
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
    v.add_argument("--force", action="store_true", help=_FORCE_HELP)
    v.set_defaults(func=_validate)


def _write_staged(args, command: str, run, extra_names=(), json_attr: str | None = None) -> int:
    """Run `run(args)` with args.out (and args.<json_attr>) pointed at temporary files beside the real ones, then
    check what it wrote and rename it into place (traces.atomic: fsynced, a manifest beside each file). An existing
    output is refused without --force, and with it unless this command wrote it; nothing is written on failure."""
    from contextlib import ExitStack
    from pathlib import Path

    from traces.atomic import StagedFile, check_out_file

    out = Path(args.out)
    for name in extra_names:  # files the command may write beside --out (calibrate's _single_gpu twin)
        check_out_file(out.with_name(name), args.force, command)
    with ExitStack() as stack:
        stage = stack.enter_context(StagedFile(out, command, replace=args.force))
        raw = None
        if json_attr and getattr(args, json_attr, ""):
            raw = stack.enter_context(StagedFile(getattr(args, json_attr), command, replace=args.force))
            setattr(args, json_attr, str(raw.path))
        args.out = str(stage.path)
        try:
            status = run(args)
            _check_written(stage.stage)
        except ValueError as exc:  # name the output, not its temporary
            raise ValueError(str(exc).replace(str(stage.path), str(out))) from None
        stage.publish()
        if raw is not None:
            raw.publish()
    print(f"in place: {out}" + "".join(f", {out.with_name(n)}" for n in extra_names if out.with_name(n).exists()))
    return status


def _check_written(stage) -> None:
    """Refuse to publish a calibration whose values the simulator would refuse (NaN, a negative time...)."""
    for path in sorted(stage.iterdir()):
        if path.suffix in (".yaml", ".yml"):
            from sim.calibration import read

            read(path, where=path.name)


def _bench(args) -> int:
    from hw import bench

    return _write_staged(args, "hw bench", bench.main)


def _calibrate(args) -> int:
    from pathlib import Path

    from hw import calibrate
    from hw.measurements import read_measurement_json

    for attr in ("from_json", "hisparse_json"):
        if getattr(args, attr, ""):
            read_measurement_json(getattr(args, attr), f"--{attr.replace('_', '-')}")
    out = Path(args.out)
    twin = out.stem + "_single_gpu" + out.suffix
    return _write_staged(args, "hw calibrate", calibrate.main, extra_names=(twin,), json_attr="json")


def _hisparse(args) -> int:
    from hw import hisparse_bench

    return _write_staged(args, "hw hisparse", hisparse_bench.main)


def _validate(args) -> int:
    if args.from_json:
        if args.trace is not None:
            raise ValueError("hw validate: give a trace or --from-json, not both")
        from pathlib import Path

        from hw import repredict

        if not args.out:  # --out '': print the figures only
            return repredict.main(args)
        if any(Path(args.out).resolve() == Path(p).resolve() for p in args.from_json):
            raise ValueError(f"--out {args.out} is one of the runs to re-predict: it would be overwritten")
        return _write_staged(args, "hw validate", repredict.main)
    if args.trace is None:
        raise ValueError("hw validate: a trace directory or 'synthetic' is required (or --from-json RUN_JSON)")
    if args.cost or args.after_exchange_from:
        raise ValueError("hw validate: --cost and --after-exchange-from are only for --from-json re-predictions")
    from hw import validate

    return _write_staged(args, "hw validate", validate.main)
