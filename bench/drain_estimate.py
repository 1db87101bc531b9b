"""The end of a stopped whole run, estimated from how its requests drain (bench/full_fidelity.py `--reference`).

A full-fidelity run stopped at --max-wall-s keeps progress ticks: (decode steps, requests done, wall s) every 100
steps. A step's cost falls as requests finish (a paper run admits ~145 of its 256 at once and then drains), so
extrapolating the last ticks' seconds a step overstates the rest: paper-h200-tp-specon's device run went from 0.65 s
a step (steps 200-400) to 0.19 (steps 1,000-1,100). What the rest costs needs two things the stopped run lacks:

- how many requests run in each later window: from a *reference* whole run of the same config at another fidelity
  (its ticks; e.g. the default-fidelity replay, seconds instead of minutes). Decode steps and completions do not
  depend on the policy's hits (requests end by tokens decoded), so its curve continues the stopped run's: checked
  where both have ticks (`curve_mismatch_requests`: 0 for the paper run above, step 100 to 1,100);
- what a window costs per running request: a line `wall per step = a + b x running` fitted by least squares to the
  stopped run's second half of windows (a: the step's fixed part).

    running(window) = min(admitted peak, requests - done at the window's middle)
    estimate = stopped wall + sum over the reference's later windows of steps x (a + b x running)

A reference (a paper config's default fidelity, whole run; bench/full_fidelity_device.sh passes
bench/results/drain_reference_<name>.json where one exists):
    python bench/full_fidelity.py configs/paper-NAME.yaml --policy-backend numpy --policy-workers 1 --steps 0 \
        --set fidelity.policy_groups=2 --set fidelity.request_fraction=0.0625 \
        --out bench/results/drain_reference_NAME.json
A stopped run estimated afterwards: python bench/drain_estimate.py STOPPED.json --reference REF.json
    --num-requests 256 [--write]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hw.measurements import read_json_limited


def _running(done: np.ndarray, num_requests: int, admitted: int) -> np.ndarray:
    return np.minimum(float(admitted), num_requests - done)


def _windows(ticks: list[list[float]], start_steps: float = 0.0, start_done: float = 0.0):
    """(steps, running-at-middle's done, wall) of each window between consecutive ticks (from the run's start)."""
    t = np.array([[start_steps, start_done, 0.0], *ticks], dtype=float)
    return np.diff(t[:, 0]), (t[1:, 1] + t[:-1, 1]) / 2, np.diff(t[:, 2])


def fit_cost(ticks: list[list[float]], num_requests: int, admitted: int) -> tuple[float, float]:
    """(a, b) of `wall per step = a + b x running` over the second half of the ticks' windows (at least 2; a
    negative intercept is refitted through the origin: a run still full of requests says little about its floor)."""
    steps, mid_done, wall = _windows(ticks)
    half = len(steps) // 2
    x = _running(mid_done[half:], num_requests, admitted)
    y = wall[half:] / steps[half:]
    if len(y) < 2:
        raise ValueError("a drain estimate needs at least 4 progress ticks")
    if np.ptp(x) > 0:
        b, a = np.polyfit(x, y, 1)
        if a >= 0 and b >= 0:
            return float(a), float(b)
    return 0.0, float((x * y).sum() / max((x * x).sum(), 1e-12))


def estimate(ticks: list[list[float]], ref_ticks: list[list[float]], ref_steps: int, num_requests: int,
             admitted: int) -> dict:
    """The stopped run's whole wall, from its ticks and a reference whole run's ticks and decode steps."""
    a, b = fit_cost(ticks, num_requests, admitted)
    s1, done1, w1 = ticks[-1]
    ref = {int(t[0]): t[1] for t in ref_ticks}
    mismatch = [abs(ref[int(t[0])] - t[1]) for t in ticks if int(t[0]) in ref]
    later = [t for t in ref_ticks if t[0] > s1] + [[float(ref_steps), float(num_requests), 0.0]]
    steps, mid_done, _ = _windows([t for t in later if t[0] <= ref_steps], s1, done1)
    keep = steps > 0  # (a run stopped at or past the reference's end has nothing left)
    rest = float((steps[keep] * (a + b * _running(mid_done[keep], num_requests, admitted))).sum())
    return {"drain_estimate_s": w1 + rest, "drain_rest_s": rest, "drain_fit_a_s": a, "drain_fit_b_s": b,
            "drain_reference_steps": int(ref_steps), "curve_mismatch_requests": max(mismatch, default=None)}


def reference_of(path: Path) -> tuple[list[list[float]], int, int]:
    """(ticks, decode steps, admitted peak) of a whole run in a bench/full_fidelity.py JSON."""
    data = read_json_limited(path, "--reference")
    whole = [c for c in data.get("cuts", []) if c.get("steps") is None and "decode_steps" in c and c.get("ticks")]
    if not whole:
        raise ValueError(f"{path}: no whole run with progress ticks")
    c = whole[-1]
    return c["ticks"], int(c["decode_steps"]), int(c["max_admitted_concurrency"])


def for_stopped(data: dict, reference: Path, num_requests: int) -> dict:
    """`estimate` for the stopped whole-run cut of a bench/full_fidelity.py result."""
    stopped = [c for c in data["cuts"] if c.get("timed_out_after_s") and len(c.get("ticks", [])) >= 4]
    if not stopped:
        raise ValueError("no stopped cut with at least 4 progress ticks")
    ref_ticks, ref_steps, admitted = reference_of(reference)
    return estimate(stopped[-1]["ticks"], ref_ticks, ref_steps, num_requests, admitted) | {
        "drain_reference": str(reference)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stopped", type=Path, help="a bench/full_fidelity.py JSON with a stopped whole run")
    ap.add_argument("--reference", type=Path, required=True, help="a whole run's JSON of the same config")
    ap.add_argument("--num-requests", type=int, required=True)
    ap.add_argument("--write", action="store_true", help="add the estimate to the stopped JSON's `derived`")
    args = ap.parse_args(argv)
    if args.num_requests < 1:
        ap.error(f"--num-requests must be at least 1, got {args.num_requests}")
    try:
        data = read_json_limited(args.stopped, "stopped")
        got = for_stopped(data, args.reference, args.num_requests)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(got))
    if args.write:
        data.setdefault("derived", {}).update(got)
        args.stopped.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
