"""Capacity planning: per system, the peak decode throughput that meets a TPOT SLO, found by searching concurrency.

`search_peak` is pure (any `evaluate(c)`); `run_plan` drives it with real replays (`sim.replay`), one replay dir per
evaluated cap under OUT/runs/<system>/c<cap>/, and writes OUT/plan.json and OUT/plan.png.

Search assumptions, which hold for decode serving: TPOT does not fall as the concurrency cap rises (so the
SLO-feasible caps are an interval [1, c_slo]); throughput over that interval is unimodal (rises, then may fall once
misses thrash); a cap above the admission ceiling admits no more requests than the ceiling. The search
1. brackets c_slo exponentially (1, 2, 4, ...), stopping at an infeasible cap, the admission ceiling or the limit;
2. binary-searches the SLO edge inside the last bracket;
3. golden-section-searches throughput between the neighbours of the best point evaluated so far.
Evaluations are memoized; the answer is the best feasible evaluated point (ties: the smaller cap).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

INV_PHI = (math.sqrt(5) - 1) / 2
CONCURRENCY_KEY = "workload.max_concurrency"
# plan flag (GB per GPU) -> the simulator's config key (bytes per GPU)
BUDGET_KEYS = {"gpu_kv_gb": "memory.gpu_kv_bytes_per_gpu", "cpu_kv_gb": "memory.cpu_kv_bytes_per_gpu"}


@dataclasses.dataclass(frozen=True)
class Evaluation:
    concurrency: int  # the cap given (workload.max_concurrency)
    throughput_tok_s: float
    tpot_ms: float
    admitted: int  # the most requests that ran at once
    ok: bool = True  # the replay ran
    error: str = ""
    steady_window_steps: int = -1  # steps of the replay's steady window (0: whole-run figures; -1: not reported)

    def feasible(self, slo_ms: float) -> bool:
        return self.ok and math.isfinite(self.tpot_ms) and self.tpot_ms <= slo_ms


@dataclasses.dataclass
class SearchResult:
    best: Evaluation | None
    evaluations: list[Evaluation]  # sorted by concurrency
    slo_edge: int | None  # largest feasible cap found
    ceiling: int | None  # admission ceiling seen (None: not reached)
    reason: str  # why the bracket stopped


class _Memo:
    def __init__(self, evaluate: Callable[[int], Evaluation]):
        self.evaluate, self.cache = evaluate, {}

    def __call__(self, c: int) -> Evaluation:
        if c not in self.cache:
            self.cache[c] = self.evaluate(c)
        return self.cache[c]


def search_peak(evaluate: Callable[[int], Evaluation], slo_ms: float, limit: int,
                rel_tol: float = 0.0) -> SearchResult:
    """Find the feasible cap with the highest throughput; `evaluate(c)` runs one replay at cap c."""
    if limit < 1:
        raise ValueError(f"concurrency limit must be >= 1, got {limit}")
    ev = _Memo(evaluate)
    if not ev(1).feasible(slo_ms):
        reason = f"replay failed at concurrency 1: {ev(1).error}" if not ev(1).ok else "SLO missed at concurrency 1"
        return SearchResult(None, list(ev.cache.values()), None, None, reason)

    lo, hi, ceiling, reason = 1, None, None, f"reached the search limit {limit}"
    while lo < limit:
        c = min(2 * lo, limit)
        if not ev(c).feasible(slo_ms):
            hi, reason = c, "SLO edge bracketed"
            break
        lo = c
        if ev(c).admitted < c:  # admission ceiling: a higher cap admits no more
            ceiling, reason = ev(c).admitted, f"admission ceiling {ev(c).admitted}"
            break
    if hi is not None:  # largest feasible cap in (lo, hi)
        while hi - lo > max(1, int(rel_tol * lo)):
            mid = (lo + hi) // 2
            if ev(mid).feasible(slo_ms):
                lo = mid
            else:
                hi = mid
    # above an admission ceiling every cap admits the same requests: refine only up to the ceiling
    _golden_refine(ev, slo_ms, min(lo, ceiling) if ceiling else lo, rel_tol)
    feasible = [e for e in ev.cache.values() if e.feasible(slo_ms)]
    best = max(feasible, key=lambda e: (e.throughput_tok_s, -e.concurrency))
    return SearchResult(best, sorted(ev.cache.values(), key=lambda e: e.concurrency), lo, ceiling, reason)


def _golden_refine(ev: _Memo, slo_ms: float, edge: int, rel_tol: float) -> None:
    """Golden-section search of throughput on the interval around the best feasible point evaluated so far
    (down to a bracket of rel_tol of its upper end; 0 = exact)."""
    def score(c: int) -> float:
        e = ev(c)
        return e.throughput_tok_s if e.feasible(slo_ms) else -math.inf

    done = sorted(c for c in ev.cache if c <= edge)
    best = max(done, key=lambda c: (score(c), -c))
    i = done.index(best)
    a = done[i - 1] if i > 0 else 1
    b = done[i + 1] if i + 1 < len(done) else edge
    if rel_tol and b - a <= rel_tol * b:
        return
    while b - a > max(2, int(rel_tol * b)):
        x1 = a + round((1 - INV_PHI) * (b - a))
        x2 = max(a + round(INV_PHI * (b - a)), x1 + 1)
        if score(x1) >= score(x2):
            b = x2
        else:
            a = x1
    if b - a <= 2:
        for c in range(a, b + 1):
            score(c)


# ----------------------------------------------------------------------------------------------- real replays
def default_config() -> Path:
    """configs/demo.yaml in the working dir, else beside the installed packages."""
    for root in (Path.cwd(), Path(__file__).resolve().parent.parent):
        path = root / "configs" / "demo.yaml"
        if path.is_file():
            return path
    raise ValueError("configs/demo.yaml not found; pass --config BASE.yaml")


def _evaluation(c: int, metrics: dict | None, slo_metric: str, error: str = "") -> Evaluation:
    if metrics is None:
        return Evaluation(c, 0.0, math.inf, 0, ok=False, error=error)
    tpot = metrics.get(slo_metric)
    if tpot is None or not math.isfinite(float(tpot)):  # no request completed: TPOT unknown, not a feasible point
        return Evaluation(c, float(metrics.get("decode_throughput_tok_s") or 0.0), math.inf,
                          int(metrics.get("max_admitted_concurrency") or 0), ok=False,
                          error=f"{slo_metric} missing (no request completed; run requests to completion)")
    return Evaluation(c, float(metrics.get("decode_throughput_tok_s") or 0.0), float(tpot),
                      int(metrics.get("max_admitted_concurrency") or 0),
                      steady_window_steps=int(metrics.get("steady_window_steps", -1)))


def unsteady_caps(entry: dict, min_steps: int = 32) -> list[int]:
    """Caps whose replay had no steady window or one of fewer than `min_steps` steps: their throughput is the whole
    run's (warm-up and drain in) or a handful of steps, not comparable with the others' steady figures. Nothing
    waits when a cap's requests all fit at once (`--requests-per-cap 1` below the admission ceiling), and only
    cap - admitted requests wait above it."""
    return [e["concurrency"] for e in entry["evaluations"]
            if e["ok"] and 0 <= e.get("steady_window_steps", -1) < min_steps]


def run_plan(*, model: str, hardware: str, num_gpus: int, slo_tpot_ms: float, systems: list[str],
             attention: str, out_dir, gpu_kv_gb: float | None = None, cpu_kv_gb: float | None = None,
             slo_metric: str = "tpot_ms_p50", config=None, sets=(), max_concurrency: int | None = None,
             rel_tol: float = 0.0, requests_per_cap: int = 0, workers: int = 1, progress: bool = False,
             buffer_fractions=()) -> dict:
    """Search each system (in parallel processes when workers > 1); writes OUT/plan.json and OUT/plan.png;
    returns the plan dict. `buffer_fractions`: UlaCache under TP is also searched with each of these shares of the
    GPU KV budget for its local buffer (`ulacache.local_buffer_fraction`), as entries `ulacache@buffer=F` beside
    the default split; `split_choice` names the best."""
    from sim.studies.sweep import _override, parse_sets, sim_resolve

    out_dir = Path(out_dir)
    config_path = Path(config) if config is not None else default_config()
    if not config_path.is_file():
        raise ValueError(f"{config_path}: config file not found")
    base = parse_sets(sets) + [f"model.preset={model}", f"hardware.preset={hardware}",
                               f"hardware.num_gpus={num_gpus}", f"attention={attention}"]
    for flag, value in (("gpu_kv_gb", gpu_kv_gb), ("cpu_kv_gb", cpu_kv_gb)):
        if value is not None:
            base.append(_override(BUDGET_KEYS[flag], float(value) * 1e9))
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = {"model": model, "hardware": hardware, "num_gpus": num_gpus, "attention": attention,
            "gpu_kv_gb": gpu_kv_gb, "cpu_kv_gb": cpu_kv_gb, "slo_tpot_ms": slo_tpot_ms, "slo_metric": slo_metric,
            "config": str(config_path), "set": list(sets), "requests_per_cap": requests_per_cap, "systems": {}}
    fractions = [float(f) for f in buffer_fractions]
    variants = [(s, [f"system={s}"]) for s in systems] + _buffer_variants(systems, attention, fractions)
    jobs = []
    for system, chosen in variants:
        overrides = base + chosen
        resolved = sim_resolve(config_path, overrides)  # bad keys/values fail here, before any replay
        wl = resolved["workload"]  # num_requests None: each cap draws 2 x cap requests (config.default_num_requests)
        limit = max_concurrency or (0 if requests_per_cap else int(wl["num_requests"] or wl["max_concurrency"]))
        if limit < 1:
            raise ValueError("--requests-per-cap needs --max-concurrency (the upper end of the search)")
        jobs.append(dict(system=system, config_path=config_path, overrides=overrides, limit=limit,
                         requests_per_cap=requests_per_cap, slo_tpot_ms=slo_tpot_ms, slo_metric=slo_metric,
                         rel_tol=rel_tol, out_dir=out_dir, progress=progress))
    if workers > 1 and len(jobs) > 1:  # one process per system search
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
            entries = list(pool.map(_search_system, jobs))
    else:
        entries = [_search_system(job) for job in jobs]
    for job, entry in zip(jobs, entries):
        plan["systems"][job["system"]] = entry
    if fractions:
        plan["buffer_fractions"] = fractions
        plan["split_choice"] = _best_split(plan["systems"])
    _add_speedups(plan)
    _write_json(out_dir / "plan.json", plan)
    plot_plan(plan, out_dir / "plan.png")
    plan["plot"] = str(out_dir / "plan.png")
    return plan


def _buffer_variants(systems: list[str], attention: str, buffer_fractions) -> list[tuple[str, list[str]]]:
    """(entry name `S@buffer=F`, its overrides) for each system among `systems` with a TP local buffer (a System's
    `local_buffer_key`) and each share F of the GPU KV budget for it."""
    from sim.systems import SYSTEMS

    fractions = [float(f) for f in buffer_fractions]
    if not fractions:
        return []
    buffered = [name for name, cls in SYSTEMS.items() if cls.local_buffer_key]
    titles = " or ".join(SYSTEMS[name].title for name in buffered)
    if attention != "tp":
        raise ValueError(f"--buffer-fractions: {titles} has a local buffer only under TP attention (--attention tp)")
    if not set(buffered) & set(systems):
        raise ValueError(f"--buffer-fractions searches {titles}'s split: add {' or '.join(buffered)} to --systems")
    return [(f"{s}@buffer={f:g}", [f"system={s}", f"{SYSTEMS[s].local_buffer_key}={f!r}"])
            for s in systems if s in buffered for f in fractions]


def _search_system(job: dict) -> dict:
    """One system's search over real replays (top-level so a process pool can run it)."""
    from sim.studies.sweep import run_point, sim_replay, sim_resolve

    system, out_dir, slo_metric = job["system"], Path(job["out_dir"]), job["slo_metric"]
    say = _printer(job["progress"])

    def evaluate(c: int) -> Evaluation:
        extra = [f"{CONCURRENCY_KEY}={c}"]
        if job["requests_per_cap"]:
            extra.append(f"workload.num_requests={job['requests_per_cap'] * c}")
        cfg = sim_resolve(job["config_path"], job["overrides"] + extra)
        run_dir = out_dir / "runs" / system.replace("@buffer=", "-buffer") / f"c{c}"
        outcome = run_point(sim_replay, cfg, str(run_dir))
        e = _evaluation(c, outcome["metrics"] if outcome["status"] == "ok" else None, slo_metric,
                        outcome.get("error", ""))
        say(f"plan {system}: cap {c} -> {e.throughput_tok_s:,.0f} tok/s, {slo_metric} {e.tpot_ms:.2f} ms, "
            f"admitted {e.admitted}" + ("" if e.ok else f" (error: {e.error})"))
        return e

    start = time.perf_counter()
    result = search_peak(evaluate, job["slo_tpot_ms"], job["limit"], job["rel_tol"])
    return {"best": dataclasses.asdict(result.best) if result.best else None,
            "slo_edge": result.slo_edge, "ceiling": result.ceiling, "reason": result.reason,
            "search_limit": job["limit"], "num_replays": len(result.evaluations),
            "search_wall_s": time.perf_counter() - start,
            "evaluations": [dataclasses.asdict(e) for e in result.evaluations]}


def _best_split(entries: dict) -> str | None:
    """The entry of a system with a local buffer (default split or `S@buffer=F`: UlaCache's) with the highest
    feasible peak."""
    from sim.systems import SYSTEMS

    found = {n: e["best"] for n, e in entries.items()
             if getattr(SYSTEMS.get(n.split("@")[0]), "local_buffer_key", None) and e["best"]}
    return max(found, key=lambda n: found[n]["throughput_tok_s"]) if found else None


def _add_speedups(plan: dict) -> None:
    """Each entry's peak over the baseline system's (`System.speedup_baseline`: HiSparse), as speedup_vs_hisparse."""
    from sim.systems import SYSTEMS

    baseline = next((name for name, cls in SYSTEMS.items() if cls.speedup_baseline), None)
    ref = (plan["systems"].get(baseline) or {}).get("best")
    for entry in plan["systems"].values():
        best = entry["best"]
        entry["speedup_vs_hisparse"] = (best["throughput_tok_s"] / ref["throughput_tok_s"]
                                        if best and ref and ref["throughput_tok_s"] > 0 else None)


def _write_json(path: Path, data: dict) -> None:
    import os

    def finite(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: finite(x) for k, x in v.items()}
        if isinstance(v, list):
            return [finite(x) for x in v]
        return v

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(finite(data), indent=2, default=str))
    os.replace(tmp, path)


def _printer(enabled: bool):
    if not enabled:
        return lambda text: None
    from rich.console import Console

    console = Console(stderr=True)
    return lambda text: console.print(text, markup=False, highlight=False)


def print_plan(plan: dict) -> None:
    """Rich table of the per-system answers."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"peak decode throughput with {plan['slo_metric']} <= {plan['slo_tpot_ms']} ms "
                        f"({plan['model']}, {plan['num_gpus']}x{plan['hardware']}, {plan['attention']} attention)")
    for col in ("system", "peak tok/s", "at cap", "admitted", "TPOT ms", "vs HiSparse", "replays", "search stop"):
        table.add_column(col, justify="left" if col in ("system", "search stop") else "right")
    for name, entry in plan["systems"].items():
        best = entry["best"]
        if best is None:
            table.add_row(name, "-", "-", "-", "-", "-", str(entry["num_replays"]), entry["reason"])
            continue
        speed = entry.get("speedup_vs_hisparse")
        table.add_row(name, f"{best['throughput_tok_s']:,.0f}", str(best["concurrency"]), str(best["admitted"]),
                      f"{best['tpot_ms']:.2f}", f"{speed:.2f}x" if speed else "-", str(entry["num_replays"]),
                      entry["reason"])
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    console.print(table)
    plot = Path(plan.get("plot", "plan.png"))
    for name, entry in plan["systems"].items():
        caps = unsteady_caps(entry)
        if caps:
            console.print(f"note: {name}: caps {caps} had a steady window under 32 steps (whole-run or few-step "
                          f"figures, not comparable); more requests per cap (--requests-per-cap 2, or a config "
                          f"without workload.num_requests) give every cap one", markup=False, highlight=False)
    console.print(f"plan: {plot.with_name('plan.json')}, {plot}", markup=False, highlight=False)


def plot_plan(plan: dict, path: Path) -> None:
    """Throughput and TPOT vs concurrency cap per system: SLO-feasible region shaded, chosen points starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    slo = plan["slo_tpot_ms"]
    fig, (ax_t, ax_l) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, entry) in enumerate(plan["systems"].items()):
        color = colors[i % len(colors)]
        evals = [e for e in entry["evaluations"] if e["ok"]]
        xs = [e["concurrency"] for e in evals]
        ok = [e["tpot_ms"] <= slo for e in evals]
        ax_t.plot(xs, [e["throughput_tok_s"] for e in evals], "-", color=color, alpha=0.5)
        ax_t.scatter([x for x, f in zip(xs, ok) if f], [e["throughput_tok_s"] for e, f in zip(evals, ok) if f],
                     color=color, label=f"{name} (meets SLO)")
        ax_t.scatter([x for x, f in zip(xs, ok) if not f],
                     [e["throughput_tok_s"] for e, f in zip(evals, ok) if not f],
                     facecolors="none", edgecolors=color, label=f"{name} (misses SLO)")
        ax_l.plot(xs, [e["tpot_ms"] for e in evals], "o-", color=color, label=name)
        if entry["slo_edge"]:
            ax_t.axvspan(0.8, entry["slo_edge"], color=color, alpha=0.07)
        if entry.get("ceiling"):
            ax_t.axvline(entry["ceiling"], color=color, ls=":", label=f"{name} admission ceiling "
                                                                     f"{entry['ceiling']} requests")
        best = entry["best"]
        if best:
            ax_t.scatter([best["concurrency"]], [best["throughput_tok_s"]], marker="*", s=300, color=color,
                         edgecolors="black", zorder=5, label=f"{name} peak: {best['throughput_tok_s']:,.0f} tok/s "
                                                             f"@ cap {best['concurrency']}")
            ax_l.scatter([best["concurrency"]], [best["tpot_ms"]], marker="*", s=300, color=color,
                         edgecolors="black", zorder=5)
    ax_l.axhline(slo, color="red", ls="--", label=f"SLO {slo} ms")
    ymax = ax_l.get_ylim()[1]
    ax_l.axhspan(0, slo, color="green", alpha=0.08, label="SLO-feasible")
    ax_l.set_ylim(0, max(ymax, slo * 1.2))
    ax_t.set_xscale("log", base=2)
    ax_t.set_ylabel("decode throughput (tokens/s)")
    ax_t.set_title(f"plan: {plan['model']} on {plan['num_gpus']}x{plan['hardware']} ({plan['attention']} attention)"
                   f", {plan['slo_metric']} <= {slo} ms\nshaded: caps that meet the SLO; star: chosen point")
    ax_l.set_xlabel("concurrency cap (workload.max_concurrency, requests)")
    ax_l.set_ylabel(f"{plan['slo_metric']} (ms)")
    ax_t.legend(fontsize=7, loc="best")
    ax_l.legend(fontsize=7, loc="best")
    ax_t.grid(alpha=0.3)
    ax_l.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
