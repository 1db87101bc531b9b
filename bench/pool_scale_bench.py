"""Pool-scale benchmark (issue 10): the library's time and memory must follow the entries it holds and touches, not
the GPU/CPU budgets.

Measured, numpy backend, one thread, medians over fresh caches:
- build: `UlaCache(CacheConfig(...))` for a 0.2M GPU / 2M CPU slot pool and one 32x larger (6.4M / 64M), DP 1 rank
  and TP 4 ranks (target <= 0.1 s each).
- resident: 16 requests x 12,288 history tokens (all GPU-resident in both pools, so both do the same work), a
  warm-up batch, then a timed batch of 16 requests x 4 query tokens x 2048 selections (44% of each request's
  candidates carried over): access and access + commit, small vs 32x pool (target ratio <= 1.3).
- misses: 16 requests x 65,536 history tokens (the GPU pool overflows into the CPU pool), same batch shape, GPU
  0.2M with CPU 2M vs CPU 64M: the replacement path (victim search, exchanges) under a 32x larger CPU budget.
- tp: 4 ranks, 256 requests x 4 x 2048 (2M references), 700K local-buffer slots per rank, over 250K GPU + 2.5M
  CPU slots per rank and over 6.4M + 64M: access + commit of one batch after three warm-up batches (steady state).
  Before issue 10, the larger budget put the local-buffer maps on hash tables (their dense table was sized by the
  budget); now the dense table follows the addresses in use.
- peak RSS of the process (ru_maxrss) after each part. Times are wall and CPU (process_time: robust while other
  jobs share the machine); ratios are given for both.

    prlimit --as=8000000000 -- .venv/bin/python bench/pool_scale_bench.py [--trials N] [--quick]
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

# ULACACHE_BENCH_LIB=DIR measures another copy of the package (e.g. `git archive` of an older commit) for "before".
sys.path.insert(0, os.environ.get("ULACACHE_BENCH_LIB") or str(Path(__file__).resolve().parents[1]))
from ulacache import CacheConfig, UlaCache  # noqa: E402

sys.path.insert(1, str(Path(__file__).resolve().parent))
from policy_bench import batch  # noqa: E402  (the same batch shape: each query token picks k candidates)

OUT = Path(__file__).resolve().parent / "results" / "pool_scale.json"
SMALL, LARGE = (200_000, 2_000_000), (6_400_000, 64_000_000)
# The figures this benchmark replaces (issue 10, measured on main before the refactor).
REPLACES = {"access_ms_small": 9.0, "access_ms_large": 14.9, "ratio": 1.65, "build_large_s": 1.6,
            "tp4_batch_s": "0.4-0.7"}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cands(rng, hist: int, num_req: int, size: int, prev: np.ndarray | None, keep: float) -> np.ndarray:
    """(num_req, size) distinct history positions per request; `keep` of them carried over from `prev`."""
    if prev is None:
        return np.stack([rng.choice(hist, size, replace=False) for _ in range(num_req)])
    n_keep = int(size * keep)
    out = np.empty_like(prev)
    for i in range(num_req):  # set-up only (not timed)
        fresh = rng.choice(hist, 2 * size, replace=False)
        fresh = fresh[~np.isin(fresh, prev[i])][: size - n_keep]
        out[i] = np.concatenate([prev[i, :n_keep], fresh])
    return rng.permuted(out, axis=1)


def build_s(cfg: CacheConfig) -> float:
    t0 = time.perf_counter()
    UlaCache(cfg)
    return time.perf_counter() - t0


def access_run(cfg: CacheConfig, num_req: int, hist: int, seed: int, q: int = 4, k: int = 2048,
               cand_size: int = 3600, warm: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    cache = UlaCache(cfg)
    addrs = cache.alloc_many(np.arange(num_req), np.full(num_req, hist)).reshape(num_req, hist)
    c0 = cands(rng, hist, num_req, cand_size, None, 0.0)
    for _ in range(warm):  # warm-up batches
        cache.commit(cache.access(batch(rng, addrs, c0, q, k)))
        c0 = cands(rng, hist, num_req, cand_size, c0, 0.44)
    sel = batch(rng, addrs, c0, q, k)
    c0, t0 = time.process_time(), time.perf_counter()
    plan = cache.access(sel)
    c1, t1 = time.process_time(), time.perf_counter()
    cache.commit(plan)
    c2, t2 = time.process_time(), time.perf_counter()
    return {"refs": plan.num_refs, "unique": plan.num_unique, "hits": plan.num_hits, "misses": plan.num_misses,
            "exchanges": plan.num_exchanges, "local_hits": plan.num_local_hits,
            "peer_fetches": plan.num_peer_fetches, "access_s": t1 - t0, "access_commit_s": t2 - t0,
            "access_cpu_s": c1 - c0, "access_commit_cpu_s": c2 - c0}


def median_runs(fn, trials: int) -> dict:
    runs = [fn(seed) for seed in range(trials)]
    out = dict(runs[0])
    for key in ("access_s", "access_commit_s", "access_cpu_s", "access_commit_cpu_s"):
        out[key] = float(np.median([r[key] for r in runs]))
        out[key + "_all"] = [r[key] for r in runs]
    return out


def figures(res: dict) -> dict:
    """The headline figures of a result (for before/after comparisons)."""
    out = {f"build_{k}_s": v for k, v in res.get("build_s", {}).items()}
    for part in ("resident", "misses"):
        p = res.get(part, {})
        out.update({f"{part}_{k}": p[k] for k in ("ratio_access", "ratio_access_cpu", "ratio_access_commit_cpu")
                    if k in p})
        for name, r in p.items():
            if isinstance(r, dict):
                out[f"{part}_{name}_access_cpu_ms"] = r.get("access_cpu_s", float("nan")) * 1e3
    for name, r in res.get("tp4", {}).items():
        out[f"tp4_{name}_access_commit_s"] = r["access_commit_s"]
        out[f"tp4_{name}_access_commit_cpu_s"] = r.get("access_commit_cpu_s")
    out["peak_rss_mb"] = max(res.get("rss_mb", {0: 0}).values())
    return out


def before_figures() -> dict:
    """Figures of the same benchmark run on the library before issue 10 (results/pool_scale_before_issue10.json)."""
    path = OUT.parent / "pool_scale_before_issue10.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {"file": str(path.relative_to(OUT.parents[2])), "date": data["date"], "library": data.get("library"),
            "load_avg_before": data.get("load_avg_before"), **figures(data)}


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    except OSError:
        return ""


def main() -> int:
    """Measure every part, print the summary, write the result JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="skip the TP part")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.trials < 1:
        ap.error(f"--trials must be at least 1, got {args.trials}")
    load_before = os.getloadavg()
    res = measure(args.trials, tp=not args.quick)
    print_summary(res)
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
        "git_commit": git_commit(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "threads": 1},
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
        "library": os.environ.get("ULACACHE_BENCH_LIB") or "this checkout",
        "pools": {"small": SMALL, "large": LARGE}, "trials": args.trials,
        "targets": {"ratio": 1.3, "build_s": 0.1},
        "replaces": REPLACES,
        "replaces_measured": before_figures(),
        **res,
    }
    result["figures"] = figures(res)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


def measure(trials: int, tp: bool) -> dict:
    """build, resident, misses (with their large/small ratios) and, with `tp`, the TP part; peak RSS after each."""
    res: dict = {"build_s": {}, "resident": {}, "misses": {}, "rss_mb": {}}
    for name, (g, c) in (("small", SMALL), ("large", LARGE)):
        for mode, ranks in (("dp", 1), ("tp", 4)):
            cfg = CacheConfig(mode=mode, num_ranks=ranks, gpu_slots=g, cpu_slots=c)
            res["build_s"][f"{mode}{ranks}_{name}"] = float(np.median([build_s(cfg) for _ in range(3)]))
    res["rss_mb"]["after_build"] = rss_mb()
    for name, (g, c) in (("small", SMALL), ("large", LARGE)):
        cfg = CacheConfig(gpu_slots=g, cpu_slots=c)
        res["resident"][name] = median_runs(lambda s, cfg=cfg: access_run(cfg, 16, 12_288, s), trials)
    res["rss_mb"]["after_resident"] = rss_mb()
    for name, c in (("small", SMALL[1]), ("large_cpu", LARGE[1])):
        cfg = CacheConfig(gpu_slots=SMALL[0], cpu_slots=c)
        res["misses"][name] = median_runs(lambda s, cfg=cfg: access_run(cfg, 16, 65_536, s), trials)
    res["rss_mb"]["after_misses"] = rss_mb()
    for part in ("resident", "misses"):
        a, b = res[part].values()
        for key in ("access_s", "access_commit_s", "access_cpu_s", "access_commit_cpu_s"):
            res[part]["ratio_" + key[:-2]] = b[key] / a[key]
    if tp:
        res["tp4"] = {}
        for name, (g, c) in (("small", (250_000, 2_500_000)), ("large", LARGE)):
            cfg = CacheConfig(mode="tp", num_ranks=4, gpu_slots=g, cpu_slots=c, local_buffer_slots=700_000)
            res["tp4"][name] = median_runs(lambda s, cfg=cfg: access_run(cfg, 256, 10_000, s, warm=3),
                                           max(1, trials // 2))
            res["rss_mb"][f"after_tp4_{name}"] = rss_mb()
    return res


def print_summary(res: dict) -> None:
    """One line per build, per measured pool and ratio, per TP run, and the peak RSS."""
    for key, val in res["build_s"].items():
        print(f"build {key:10s} {val * 1e3:8.1f} ms")
    for part in ("resident", "misses"):
        for name, r in res[part].items():
            if isinstance(r, dict):
                print(f"{part:8s} {name:9s} unique {r['unique']:,} hits {r['hits']:,}: access "
                      f"{r['access_s'] * 1e3:.1f} ms (cpu {r['access_cpu_s'] * 1e3:.1f}), access+commit "
                      f"{r['access_commit_s'] * 1e3:.1f} ms (cpu {r['access_commit_cpu_s'] * 1e3:.1f})")
        p = res[part]
        print(f"{part:8s} ratio access {p['ratio_access']:.2f}x (cpu {p['ratio_access_cpu']:.2f}x), access+commit "
              f"{p['ratio_access_commit']:.2f}x (cpu {p['ratio_access_commit_cpu']:.2f}x)")
    for name, r in res.get("tp4", {}).items():
        print(f"tp4 {name:5s} refs {r['refs']:,} unique {r['unique']:,} local hits {r['local_hits']:,} peer "
              f"{r['peer_fetches']:,}: access {r['access_s']:.3f} s, access+commit {r['access_commit_s']:.3f} s "
              f"(cpu {r['access_commit_cpu_s']:.3f} s)")
    print(f"peak RSS {res['rss_mb']}")


if __name__ == "__main__":
    sys.exit(main())
