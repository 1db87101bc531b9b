"""Host <-> backend traffic of a replay on a device policy backend (issue 29), measured on the CPU.

With `--policy-backend cupy` the cache facade keeps its state on the host and hands each primitive its operands
through `asarray` / `to_numpy`; on a GPU every such call is a PCIe copy. This bench replays a config with the torch
backend on the CPU (the same facade code path as cupy), counts the bytes and calls that cross those two conversions,
attributed to the facade function that made them, and writes JSON: bytes per policy call, the largest callers, and
what that traffic would cost at a given host link rate (a floor on the device path's copy time, not a timing).

    python bench/backend_traffic.py [config] [--set KEY=VALUE ...] [--out bench/results/backend_traffic.json]
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# A reduced config under cache pressure with every group and request simulated (tests/test_policy_backend_replay.py)
REDUCED = ["workload.num_requests=6", "workload.max_concurrency=3", "workload.max_steps=12",
           "fidelity.policy_groups=0", "fidelity.request_fraction=1.0", "memory.gpu_kv_bytes_per_gpu=0.5e9",
           "spec.draft_tokens=2"]
FULL = ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0"]
LINK_BYTES_PER_S = 25e9  # a pageable host<->device copy rate assumed for the floor below (H200 PCIe Gen5 x16 ~ 55)


def _caller() -> str:
    """The first frame outside the backend module: the facade function that asked for the conversion."""
    f = sys._getframe(2)
    while f is not None and "backends" in f.f_code.co_filename:
        f = f.f_back
    if f is None:
        return "?"
    return f"{Path(f.f_code.co_filename).relative_to(ROOT)}:{f.f_code.co_name}"


def measure(config: str, sets: list[str]) -> dict:
    import torch

    import sim
    from ulacache.backends.torch_backend import TorchBackend

    traffic = collections.defaultdict(lambda: [0, 0, 0, 0])  # caller -> [h2d calls, h2d bytes, d2h calls, d2h bytes]
    to_dev, to_host = TorchBackend.asarray, TorchBackend.to_numpy

    def asarray(self, a):
        t = traffic[_caller()]
        t[0] += 1
        t[1] += int(getattr(a, "nbytes", 0))
        return to_dev(self, a)

    def to_numpy(self, a):
        out = to_host(self, a)
        t = traffic[_caller()]
        t[2] += 1
        t[3] += int(getattr(out, "nbytes", 0))
        return out

    TorchBackend.asarray, TorchBackend.to_numpy = asarray, to_numpy
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    try:
        m = sim.replay(str(ROOT / config), None, overrides=sets, policy_backend="torch")
    finally:
        TorchBackend.asarray, TorchBackend.to_numpy = to_dev, to_host
    wall_s = time.perf_counter() - t0
    calls = max(int(m["policy_calls"]), 1)
    rows = sorted(({"caller": k, "h2d_calls": v[0], "h2d_bytes": v[1], "d2h_calls": v[2], "d2h_bytes": v[3]}
                   for k, v in traffic.items()), key=lambda r: -(r["h2d_bytes"] + r["d2h_bytes"]))
    total = sum(r["h2d_bytes"] + r["d2h_bytes"] for r in rows)
    conversions = sum(r["h2d_calls"] + r["d2h_calls"] for r in rows)
    return {
        "policy_calls": int(m["policy_calls"]), "decode_steps": int(m.get("decode_steps", 0)),
        "gpu_hit_rate": m["gpu_hit_rate"], "wall_s": wall_s,
        "bytes_total": total, "bytes_per_policy_call": total / calls,
        "conversions_per_policy_call": conversions / calls,
        "copy_floor_s_per_policy_call": total / calls / LINK_BYTES_PER_S,
        "link_bytes_per_s_assumed": LINK_BYTES_PER_S, "callers": rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="configs/demo.yaml")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="after the reduced overrides")
    ap.add_argument("--attention", action="append", default=[], help="runs per attention (default: tp and dp)")
    ap.add_argument("--no-reduced", action="store_true", help="the config's own scale: only --set and full fidelity")
    ap.add_argument("--out", default=str(ROOT / "bench/results/backend_traffic.json"))
    args = ap.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("backend_traffic: needs torch (pip install '.[torch]')", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    runs = {}
    for att in args.attention or ["tp", "dp"]:
        base = FULL if args.no_reduced else REDUCED
        sets = base + [f"attention={att}"] + args.set
        try:
            r = measure(args.config, sets)
        except (ValueError, OSError) as e:  # a bad config, key or path: one line (sim's errors are ValueErrors)
            print(f"backend_traffic: {e}", file=sys.stderr)
            return 2
        runs[att] = {"overrides": sets, **r}
        print(f"{att}: {r['policy_calls']} policy calls, {r['bytes_per_policy_call'] / 1e6:.2f} MB and "
              f"{r['conversions_per_policy_call']:.1f} conversions per call "
              f"(>= {r['copy_floor_s_per_policy_call'] * 1e3:.2f} ms at {LINK_BYTES_PER_S / 1e9:.0f} GB/s); top: "
              + ", ".join(f"{c['caller']} {(c['h2d_bytes'] + c['d2h_bytes']) / 1e6:.1f} MB"
                          for c in r["callers"][:3]))
    out = {"date": datetime.date.today().isoformat(), "commit": commit, "config": args.config,
           "command": "python bench/backend_traffic.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "runs": runs}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
