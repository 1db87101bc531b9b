"""Policy-library benchmark: one sparse access batch of ~2M references on 1M GPU slots over 10M CPU slots.

Workload (issue 2): 256 requests x 4 query tokens x 2048 selections. Each request's 4 query tokens draw their 2048
positions from a per-request candidate set of 3600 history positions, so about half the references are duplicates
(the union of speculative query tokens). A warm-up batch (untimed) fills the GPU pool; the timed batch keeps 44% of
each request's candidates (the measured step-to-step overlap of DeepSeek-V3.2, docs/architecture.md) and draws the rest anew.
Timed: `access` (dedup -> translate -> hits -> recency -> replacement -> plan) and `access + commit`, numpy backend,
one thread, medians over fresh caches. Also measured: the pb-lru vs exact-lru hit-rate gap on locality-rich
multi-step workloads (ulacache.workload.LocalityWorkload).

    .venv/bin/python bench/policy_bench.py [--quick] [--profile]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import cProfile  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

# ULACACHE_BENCH_LIB=DIR measures another copy of the package (e.g. `git archive` of an older commit) for "before".
sys.path.insert(0, os.environ.get("ULACACHE_BENCH_LIB") or str(Path(__file__).resolve().parents[1]))
from ulacache import CacheConfig, UlaCache  # noqa: E402
from ulacache.workload import LocalityWorkload  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "policy.json"


def candidate_sets(rng, hist_len: int, num_req: int, size: int, prev: np.ndarray | None, keep: float) -> np.ndarray:
    """(num_req, size) distinct history positions per request; `keep` of them carried over from `prev`."""
    fresh = rng.random((num_req, hist_len)).argsort(axis=1)[:, :size] if prev is None else None
    if prev is None:
        return fresh
    n_keep = int(size * keep)
    out = np.empty_like(prev)
    out[:, :n_keep] = prev[:, :n_keep]
    for i in range(num_req):  # set-up only (not timed)
        pool = np.setdiff1d(np.arange(hist_len), prev[i], assume_unique=True)
        out[i, n_keep:] = rng.choice(pool, size - n_keep, replace=False)
    return rng.permuted(out, axis=1)


def batch(rng, addrs: np.ndarray, cands: np.ndarray, q: int, k: int) -> np.ndarray:
    """(R, q, k) logical addresses: each query token picks k of its request's candidates."""
    num_req, size = cands.shape
    pick = rng.random((num_req, q, size)).argsort(axis=2)[:, :, :k]
    pos = np.take_along_axis(np.broadcast_to(cands[:, None, :], (num_req, q, size)), pick, axis=2)
    return np.take_along_axis(addrs, pos.reshape(num_req, -1), axis=1).reshape(num_req, q, k)


def run_big(policy: str, gpu: int, cpu: int, num_req: int, q: int, k: int, cand: int, seed: int,
            profile: bool) -> dict:
    rng = np.random.default_rng(seed)
    cache = UlaCache(CacheConfig(gpu_slots=gpu, cpu_slots=cpu, policy=policy))
    hist = (gpu + cpu) // num_req
    addrs = cache.alloc_many(np.arange(num_req), np.full(num_req, hist)).reshape(num_req, hist)
    c0 = candidate_sets(rng, hist, num_req, cand, None, 0.0)
    cache.commit(cache.access(batch(rng, addrs, c0, q, k)))  # warm-up: fills the GPU pool with the working set
    c1 = candidate_sets(rng, hist, num_req, cand, c0, 0.44)
    sel = batch(rng, addrs, c1, q, k)
    if profile:  # an extra, unrecorded trial: cProfile of the timed access + commit itself
        pr = cProfile.Profile()
        pr.enable()
        cache.commit(cache.access(sel))
        pr.disable()
        print(f"--- cProfile of {policy} access + commit ---")
        pstats.Stats(pr).sort_stats("tottime").print_stats(15)
        return {}
    c0 = time.process_time()  # CPU time of this (single-threaded) process: robust to other jobs on the machine
    t0 = time.perf_counter()
    plan = cache.access(sel)
    t1, c1 = time.perf_counter(), time.process_time()
    cache.commit(plan)
    t2, c2 = time.perf_counter(), time.process_time()
    return {
        "policy": policy, "refs": plan.num_refs, "unique": plan.num_unique, "hits": plan.num_hits,
        "misses": plan.num_misses, "exchanges": plan.num_exchanges,
        "access_s": t1 - t0, "commit_s": t2 - t1, "access_commit_s": t2 - t0,
        "access_cpu_s": c1 - c0, "access_commit_cpu_s": c2 - c0,
        "access_refs_per_s": plan.num_refs / (t1 - t0), "access_commit_refs_per_s": plan.num_refs / (t2 - t0),
    }


def hit_rate(policy: str, gpu: int, num_recent: int, seed: int, steps: int) -> float:
    """Hit rate (hits / unique references after 10 warm-up steps) on a LocalityWorkload (ulacache/workload.py)."""
    num_req, hist = 16, 8192
    wl = LocalityWorkload(num_req, hist, top_k=256, candidates=512, num_query=2, keep=0.5, hot=0.5, seed=seed)
    cache = UlaCache(CacheConfig(gpu_slots=gpu, cpu_slots=num_req * hist, policy=policy, num_recent_buckets=num_recent))
    addrs = cache.alloc_many(np.arange(num_req), np.full(num_req, hist)).reshape(num_req, hist)
    hits = uniq = 0
    for step in range(steps):
        pos = wl.step().reshape(num_req, -1)
        plan = cache.access(np.take_along_axis(addrs, pos, axis=1))
        cache.commit(plan)
        if step >= 10:
            hits, uniq = hits + plan.num_hits, uniq + plan.num_unique
    return hits / uniq


def hit_rate_gap(steps: int, seeds: int) -> list[dict]:
    """pb-lru vs exact lru on the same locality-rich workloads: GPU pools holding ~4 to ~20 steps of new entries,
    the default number of recent buckets and smaller ones (to show what the buckets buy)."""
    rows = []
    default_k = CacheConfig().num_recent_buckets
    for gpu in (16384, 32768, 65536):
        for k in sorted({4, 16, default_k}):
            for seed in range(seeds):
                pb, lru = hit_rate("pb-lru", gpu, k, seed, steps), hit_rate("lru", gpu, k, seed, steps)
                rows.append({"gpu_slots": gpu, "num_recent_buckets": k, "seed": seed, "pb_lru_hit_rate": pb,
                             "lru_hit_rate": lru, "gap_points": 100 * (lru - pb), "steps": steps})
    return rows


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 10x smaller pool and batch (smoke run)")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one access+commit")
    ap.add_argument("--trials", type=int, default=5, help="fresh caches per policy (medians reported)")
    ap.add_argument("--out", type=Path, default=OUT)
    return ap


def main() -> int:
    ap = _parser()
    args = ap.parse_args()
    if args.trials < 1:
        ap.error(f"--trials must be at least 1, got {args.trials}")
    load_before = os.getloadavg()
    scale = 10 if args.quick else 1
    gpu, cpu, num_req = 1_000_000 // scale, 10_000_000 // scale, 256 // scale
    if args.profile:
        for p in ("pb-lru", "lru"):
            run_big(p, gpu, cpu, num_req, 4, 2048, 3600, seed=0, profile=True)
    runs = [run_big(p, gpu, cpu, num_req, 4, 2048, 3600, seed=trial, profile=False)
            for trial in range(args.trials) for p in ("pb-lru", "lru")]
    for r in runs:
        print(f"{r['policy']:7s} refs={r['refs']:,} unique={r['unique']:,} hits={r['hits']:,} "
              f"access {r['access_s'] * 1e3:.1f} ms = {r['access_refs_per_s'] / 1e6:.1f} M refs/s; "
              f"access+commit {r['access_commit_s'] * 1e3:.1f} ms = {r['access_commit_refs_per_s'] / 1e6:.1f} M refs/s")
    summary = {}
    for p in ("pb-lru", "lru"):
        mine = [r for r in runs if r["policy"] == p]
        refs = mine[0]["refs"]
        summary[p] = {f"{stat}_{k}": float(fn([r[k] for r in mine])) for stat, fn in (("median", np.median),
                      ("best", np.min)) for k in ("access_s", "access_commit_s", "access_cpu_s", "access_commit_cpu_s")}
        for key in list(summary[p]):
            summary[p][key.replace("_s", "_refs_per_s").replace("_cpu_refs", "_cpu_refs")] = refs / summary[p][key]
        m = summary[p]
        print(f"{p:7s} {len(mine)} trials, M refs/s (median / best): access wall "
              f"{m['median_access_refs_per_s'] / 1e6:.1f} / {m['best_access_refs_per_s'] / 1e6:.1f}, cpu "
              f"{m['median_access_cpu_refs_per_s'] / 1e6:.1f} / {m['best_access_cpu_refs_per_s'] / 1e6:.1f}; "
              f"access+commit wall {m['median_access_commit_refs_per_s'] / 1e6:.1f} / "
              f"{m['best_access_commit_refs_per_s'] / 1e6:.1f}, cpu {m['median_access_commit_cpu_refs_per_s'] / 1e6:.1f}"
              f" / {m['best_access_commit_cpu_refs_per_s'] / 1e6:.1f}")
    gap = hit_rate_gap(steps=30 if args.quick else 80, seeds=1 if args.quick else 2)
    default_k = CacheConfig().num_recent_buckets
    for row in gap:
        print(f"gpu {row['gpu_slots']:6d} K={row['num_recent_buckets']:2d} seed {row['seed']}: "
              f"pb-lru {row['pb_lru_hit_rate']:.4f} lru {row['lru_hit_rate']:.4f} gap {row['gap_points']:+.3f} points")
    worst = max(abs(r["gap_points"]) for r in gap if r["num_recent_buckets"] == default_k)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "machine": {"platform": platform.platform(), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "numpy": np.__version__, "threads": 1},
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
        "library": os.environ.get("ULACACHE_BENCH_LIB") or "this checkout",
        "config": {"gpu_slots": gpu, "cpu_slots": cpu, "num_requests": num_req, "query_tokens": 4, "top_k": 2048,
                   "candidates_per_request": 3600, "backend": "numpy", "quick": args.quick},
        "runs": runs,
        "summary": summary,
        "hit_rate_gap": gap,
        "hit_rate_gap_worst_points_default_buckets": worst,
        "default_num_recent_buckets": default_k,
        "target_refs_per_s": 20e6,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
