"""Synthetic selections drawn on the host vs on a CUDA device (traces/synthetic/device.py), at a paper config's
decode batch: per call, the milliseconds of `select_groups` (the device's including the copy back to the host, which
the replay's facade needs), and whether the positions are equal. Needs cupy and a GPU.

Usage: python bench/device_selections.py [--rows 145] [--q 4] [--groups 1] [--reps 20] [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from traces.synthetic.device import DeviceSelections  # noqa: E402
from traces.synthetic.source import SyntheticSelections  # noqa: E402
from traces.synthetic.spec import SelectionSpec  # noqa: E402


def _time(fn, reps: int) -> tuple[float, object]:
    out = fn()  # (warm: tables, kernel build)
    t0 = time.perf_counter()
    for _ in range(reps):
        out = fn()
    return (time.perf_counter() - t0) / reps * 1e3, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=145, help="requests in the batch (paper H200 TP: 145 admitted)")
    ap.add_argument("--q", type=int, default=4, help="query tokens a request (drafts on: 4)")
    ap.add_argument("--groups", type=int, default=1, help="groups per call (the replay's per-call share)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "device_selections.json")
    args = ap.parse_args()
    if min(args.rows, args.q, args.groups, args.reps) < 1:
        ap.error("--rows, --q, --groups and --reps must be at least 1")
    try:
        import cupy
    except ImportError:
        ap.error("needs cupy and a CUDA device (cupy-cuda13x is not in the CPU install)")

    spec = SelectionSpec.from_dict({"num_groups": 21, "top_k": 2048})  # GLM-5.2: 21 indexer groups, top-k 2048
    host, dev = SyntheticSelections(spec, 0), DeviceSelections(spec, 0)
    rng = np.random.default_rng(0)
    rid = rng.integers(0, 1 << 40, args.rows)
    hist = rng.integers(20_000, 120_000, args.rows)
    step = rng.integers(0, 3000, args.rows)
    rows = []
    for first in range(0, 21, args.groups):
        groups = list(range(first, min(first + args.groups, 21)))
        host_ms, want = _time(lambda: host.select_groups(rid, hist, step, groups, args.q), args.reps)
        dev_ms, got = _time(lambda: dev.select_groups(rid, hist, step, groups, args.q), args.reps)
        rows.append({"groups": groups, "host_ms": host_ms, "device_ms": dev_ms,
                     "equal": all(np.array_equal(a, b) for a, b in zip(want, got))})
        print(f"groups {groups}: host {host_ms:7.2f} ms  device {dev_ms:7.2f} ms  equal {rows[-1]['equal']}")
    props = cupy.cuda.runtime.getDeviceProperties(0)
    result = {"what": __doc__.splitlines()[0], "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": " ".join(["python", *sys.argv]), "device_name": props["name"].decode(),
              "machine": {"python": platform.python_version()}, "rows": args.rows, "q": args.q,
              "top_k": spec.top_k, "device_calls": dev.device_calls, "host_calls": dev.host_calls,
              "host_ms_mean": float(np.mean([r["host_ms"] for r in rows])),
              "device_ms_mean": float(np.mean([r["device_ms"] for r in rows])),
              "all_equal": all(r["equal"] for r in rows), "per_call": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"mean: host {result['host_ms_mean']:.2f} ms, device {result['device_ms_mean']:.2f} ms a call; "
          f"all equal {result['all_equal']}")
    return 0 if result["all_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
