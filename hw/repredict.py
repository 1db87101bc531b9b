"""`ulacache hw validate --from-json RUN.json ...`: re-predict stored validation runs with a calibration (no GPU).

A `hw validate` JSON keeps, per step, what the cost model needs (the plan's refs / unique / misses and every rank's
h2d, d2h and peer rows) beside the measured time, so a changed cost model or calibration is scored on the same
measurements offline: the same `predict_parts` as the live run. `--cost KEY=VALUE` overrides a cost key (a
sensitivity, never a calibration: the figures say which keys were overridden).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hw.gpu import command_line, utc_now


class _Plan:
    """The fields of a plan `predict_parts` reads, from one stored step."""

    def __init__(self, step: dict):
        self.num_refs, self.num_unique, self.num_misses = step["num_refs"], step["num_unique"], step["num_misses"]
        rows = step["rows_per_rank"]
        self.h2d_rows_per_rank, self.d2h_rows_per_rank = rows["h2d"], rows["d2h"]
        self.peer_rows_per_rank = rows["peer"]


def _summary(steps: list[dict], key: str) -> dict:
    errs = np.array([s[key] for s in steps])
    return {"median_abs": float(np.median(np.abs(errs))), "p90_abs": float(np.quantile(np.abs(errs), 0.9)),
            "median_signed": float(np.median(errs)), "max_abs": float(np.abs(errs).max()), "steps": int(errs.size)}


def _count(step: dict, key: str, where: str) -> int:
    v = step.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{where}: {key} must be an integer >= 0, got {v!r}")
    return v


def check_run(run: dict, where: str) -> None:
    """The fields `repredict` reads, checked first: a stored run with `measured_s: 0`, a missing or negative
    count or a non-numeric row list is one line naming the step and the key, not a ZeroDivisionError."""
    for key in ("row_bytes", "ranks"):
        v = run.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{where}: {key} must be an integer >= 1, got {v!r}")
    if not isinstance(run.get("per_step"), list):
        raise ValueError(f"{where}: per_step must be a list of steps")
    for i, s in enumerate(run["per_step"]):
        at = f"{where}: per_step[{i}]"
        if not isinstance(s, dict):
            raise ValueError(f"{at}: not an object")
        if s.get("warmup") or "measured_s" not in s:
            continue
        for key in ("measured_s", "predicted_s", "rel_err"):
            v = s.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"{at}: {key} must be a finite number, got {v!r}")
        if s["measured_s"] <= 0:
            raise ValueError(f"{at}: measured_s must be > 0 seconds (the errors are relative to it), "
                             f"got {s['measured_s']!r}")
        for key in ("num_refs", "num_unique", "num_misses"):
            _count(s, key, at)
        rows = s.get("rows_per_rank")
        if not isinstance(rows, dict):
            raise ValueError(f"{at}: rows_per_rank must be an object of h2d, d2h, peer lists")
        for key in ("h2d", "d2h", "peer"):
            v = rows.get(key)
            if not isinstance(v, list) or len(v) != run["ranks"] or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in _flat(v)):
                raise ValueError(f"{at}: rows_per_rank.{key} must list {run['ranks']} rank(s) of row counts >= 0")


def _flat(v):
    for x in v:
        if isinstance(x, list):
            yield from _flat(x)
        else:
            yield x


def repredict(run: dict, costs, node=None) -> dict:
    """Per timed step of a stored validation run: the stored and the re-predicted time and error; summaries."""
    from hw.validate import predict_parts

    rb, R = int(run["row_bytes"]), int(run["ranks"])
    steps = []
    for s in run["per_step"]:
        if s.get("warmup") or "measured_s" not in s:
            continue
        parts = predict_parts(costs, _Plan(s), rb, R, node)
        pred = sum(parts.values())
        steps.append({"step": s["step"], "measured_s": s["measured_s"], "predicted_s_stored": s["predicted_s"],
                      "predicted_s": pred, "predicted_parts_s": parts,
                      "rel_err_stored": s["rel_err"], "rel_err": (pred - s["measured_s"]) / s["measured_s"]})
    if not steps:
        raise ValueError("the run has no timed steps (a --backend numpy dry run?): nothing to re-predict")
    return {"before": _summary(steps, "rel_err_stored"), "after": _summary(steps, "rel_err"),
            "measured_s_median": float(np.median([s["measured_s"] for s in steps])),
            "predicted_s_median_stored": float(np.median([s["predicted_s_stored"] for s in steps])),
            "predicted_s_median": float(np.median([s["predicted_s"] for s in steps])),
            "predicted_parts_s_median": {k: float(np.median([s["predicted_parts_s"][k] for s in steps]))
                                         for k in steps[0]["predicted_parts_s"]},
            "per_step": steps}


def parse_cost_overrides(items: list[str]) -> dict:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--cost {item!r}: expected KEY=NUMBER") from None
        from sim.calibration import check_cost_value

        check_cost_value(key.strip(), out[key.strip()], "--cost")
    return out


def main(args) -> int:
    from hw.measurements import read_measurement_json
    from hw.validate import NODE_KEYS, load_costs

    calib = Path(args.calibration) if args.calibration else None
    if calib is not None and not calib.is_file():
        raise OSError(f"calibration file not found: {calib}")
    overrides = parse_cost_overrides(getattr(args, "cost", None))
    stored = {}
    for path in args.from_json:  # every run checked before any work
        run = read_measurement_json(path, "--from-json")
        if "per_step" not in run:
            raise ValueError(f"{path}: not a hw validate JSON (no per_step)")
        check_run(run, str(path))
        stored[str(path)] = run
    derived = None
    if getattr(args, "after_exchange_from", ""):  # sensitivity: the key from another run's gather timings
        from hw.nodefit import AFTER_EXCHANGE_KEY, after_exchange_from_parts

        diag = read_measurement_json(args.after_exchange_from, "--after-exchange-from")
        derived = after_exchange_from_parts(diag, load_costs(calib)[0])
        derived.update({"from": str(args.after_exchange_from), "run_date": diag.get("date"),
                        "run_command": diag.get("command")})
        overrides.setdefault(AFTER_EXCHANGE_KEY, derived[AFTER_EXCHANGE_KEY])
        print(f"{AFTER_EXCHANGE_KEY} = {derived[AFTER_EXCHANGE_KEY] * 1e6:.1f} us from the gather timings of "
              f"{args.after_exchange_from} ({derived['samples']} rank-steps; a sensitivity, not a calibration)")
    costs, node = load_costs(calib, overrides)
    runs = {}
    for path, run in stored.items():
        res = repredict(run, costs, node)
        res.update({"run_date": run.get("date"), "run_command": run.get("command"),
                    "device": (run.get("device") or {}).get("gpu"), "mode": run.get("mode"), "ranks": run["ranks"],
                    "calibration_stored": run.get("calibration")})
        runs[str(path)] = res
        b, a = res["before"], res["after"]
        print(f"{path}: median abs error {b['median_abs']:.3f} -> {a['median_abs']:.3f} (p90 {b['p90_abs']:.3f} -> "
              f"{a['p90_abs']:.3f}); measured {res['measured_s_median'] * 1e6:.0f} us, predicted "
              f"{res['predicted_s_median_stored'] * 1e6:.0f} -> {res['predicted_s_median'] * 1e6:.0f} us")
    devices = sorted({f"{r['device']} (run {r['run_date']})" for r in runs.values()})
    out = {"date": utc_now(), "command": command_line(),
           "device": {"runs": devices, "repredicted_on": "CPU (no GPU: stored measurements, cost model only)"},
           "calibration": str(calib) if calib else None,
           "cost_overrides": overrides, "after_exchange_from_parts": derived, "node_model": {k: node.values.get(k) for k in NODE_KEYS},
           "runs": runs}
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1, default=float))
        print(f"wrote {path}")
    return 0
