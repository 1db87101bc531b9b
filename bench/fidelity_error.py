"""What default fidelity costs in accuracy (issue 29 item 3): each of the 8 paper configs replayed at its own
sampled fidelity ("default") and unsampled ("full": fidelity.policy_groups=0, fidelity.request_fraction=1.0), both
at the same reduced scale and seed; the differences are the sampling error of a default run.

Reduced scale (a full paper-scale run takes hours on 16 cores; this runs on a 2-core box): every config's
concurrency cap is cut from its own to --cap, its request count and both KV budgets per GPU (GPU and CPU, the
defaults HBM - weights - reserve and host x fraction / GPUs) by the same factor cap / paper cap, so the pools hold the
same slots per running request as at paper scale (same pressure, same admitted share); the run is cut at --steps-on /
--steps-off decode steps (spec on / off), past the first completion; 2 x cap requests (the B300 configs' own
ratio; the H200 configs draw 256 at cap 256) so that requests wait and a steady window exists in every config. Each replay runs in
its own interpreter (peak RSS is that process's), --jobs at once.

Usage: python bench/fidelity_error.py [--cap 64] [--steps-on 160] [--steps-off 320] [--seed 0] [--jobs 2]
                                      [--only NAMES] [--out FILE] [--write-table]
       python bench/fidelity_error.py --add groups_all,requests_all --only NAMES   (one-knob variants, or a rerun
                                      of default/full replays at this commit, into the JSON)
       python bench/fidelity_error.py --summarize [--write-table]   (rebuild the table from the JSON only)
       python bench/fidelity_error.py --paper --only NAMES [--policy-workers N] [--full-from JSON...]   (paper
                                      scale, unscaled whole runs; full ones from bench/full_fidelity.py whole runs)
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from hw.measurements import read_json_limited
from sim.footprint import mem_available_bytes
from traces.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "bench" / "results" / "fidelity_error.json"
OUT_PAPER = ROOT / "bench" / "results" / "fidelity_error_paper.json"
TABLE = ROOT / "sim" / "data" / "sampling_error.json"
TABLE_PAPER = ROOT / "sim" / "data" / "sampling_error_paper.json"
CONFIGS = tuple(f"paper-{hw}-{att}-spec{spec}" for hw in ("h200", "b300") for att in ("dp", "tp")
                for spec in ("on", "off"))
FULL = ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0"]
# One knob at a time (--attribute): every group with the default's request sample; every request with its groups.
VARIANTS = {"groups_all": ["fidelity.policy_groups=0"], "requests_all": ["fidelity.request_fraction=1.0"],
            # the default's groups with a 4x larger request sample (k = 4): 8 requests a DP rank at admission, not 2
            "fraction_4": ["fidelity.request_fraction=0.25"]}
KEEP = ("gpu_hit_rate", "decode_throughput_tok_s", "run_throughput_tok_s", "steady_window_steps", "tpot_ms_p50",
        "tpot_source", "sim_wall_s", "peak_rss_bytes", "est_peak_memory_bytes", "decode_steps", "completed_requests",
        "max_admitted_concurrency", "steady_mean_concurrency", "request_sample_stride", "policy_groups_simulated",
        "hardware", "attention", "draft_tokens", "system", "num_requests")


def scale_overrides(config: Path, cap: int, steps_on: int, steps_off: int, seed: int = 0) -> tuple[list[str], dict]:
    """The --set overrides that scale one paper config down to `cap`, and what they did (for the JSON)."""
    from sim.config import build, load_config
    from sim.systems import budget_for

    cfg = build(load_config(config, []))
    budget = budget_for(cfg)
    if not cap:  # --paper: the config as committed, its whole run (only the seed named)
        return [f"workload.seed={seed}"], {"factor": 1.0, "paper": {"fidelity": cfg.raw["fidelity"]},
                                           "overrides": [f"workload.seed={seed}"]}
    factor = cap / cfg.workload.max_concurrency
    steps = steps_on if cfg.spec.draft_tokens > 0 else steps_off
    requests = 2 * cap  # requests wait at any admission ceiling, so each run has a steady window
    sets = [f"workload.max_concurrency={cap}", f"workload.num_requests={requests}", f"workload.max_steps={steps}",
            f"workload.seed={seed}",
            f"memory.gpu_kv_bytes_per_gpu={budget.gpu_kv_bytes_per_gpu * factor!r}",
            f"memory.cpu_kv_bytes_per_gpu={budget.cpu_kv_bytes_per_gpu * factor!r}"]
    paper = {"max_concurrency": cfg.workload.max_concurrency, "num_requests": cfg.workload.num_requests,
             "gpu_kv_bytes_per_gpu": budget.gpu_kv_bytes_per_gpu, "cpu_kv_bytes_per_gpu": budget.cpu_kv_bytes_per_gpu,
             "fidelity": cfg.raw["fidelity"]}
    return sets, {"factor": factor, "paper": paper, "overrides": sets}


def matched_overrides(per_config: dict) -> list[str]:
    """The "matched" replay: the paper config's own fidelity but a request sample that takes as many requests per
    admission space as the default does at paper scale. The reduced scale cuts a space's running requests and its
    pools by the same factor, so request_fraction / factor (capped at 1) samples the paper default's count per space
    with the paper default's pool slots per sampled request (cap 64: 1/16 -> 1/4)."""
    frac = per_config["paper"]["fidelity"].get("request_fraction")
    frac = 1.0 / 16 if frac is None else float(frac)  # (the configs name it; none = auto, 1/16 at 256 requests)
    return [f"fidelity.request_fraction={min(1.0, frac / per_config['factor'])!r}"]


def child(payload: str) -> int:
    """One replay in this process: prints the kept metrics as one JSON line."""
    import sim

    args = json.loads(payload)
    m = sim.replay(args["config"], overrides=args["overrides"], policy_workers=args.get("workers", 1))
    print("RESULT " + json.dumps({k: m.get(k) for k in KEEP}), flush=True)
    return 0


def _start(key: str, config: Path, sets: list[str], workers: int = 1) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "RAY_ADDRESS": ""}
    payload = json.dumps({"config": str(config), "overrides": sets, "workers": workers})
    proc = subprocess.Popen([sys.executable, __file__, "--child", payload], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return {"key": key, "proc": proc, "t0": time.perf_counter(), "overrides": sets}


def _finish(job: dict) -> dict:
    out, _ = job["proc"].communicate()
    rec = {"wall_s": round(time.perf_counter() - job["t0"], 2), "overrides": job["overrides"]}
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if job["proc"].returncode == 0 and lines:
        return rec | {"status": "ok", "metrics": json.loads(lines[-1][7:])}
    return rec | {"status": "error", "error": f"exit {job['proc'].returncode}", "log_tail": out.splitlines()[-5:]}


def run_all(todo: list[tuple[str, Path, list[str]]], jobs: int, min_free_gb: float, on_record,
            workers: int = 1) -> None:
    """Run the replays `jobs` at a time (a second starts only while `min_free_gb` is available), each with its
    policy groups over `workers` processes."""
    queue, running = list(todo), []
    while queue or running:
        while queue and len(running) < jobs and (not running or mem_available_bytes() / 1e9 >= min_free_gb):
            running.append(_start(*queue.pop(0), workers))
        for job in list(running):
            if job["proc"].poll() is not None:
                running.remove(job)
                on_record(job["key"], _finish(job))
        time.sleep(0.5)


# ----------------------------------------------------------------------------------------------- the table
def _pct(a, b):
    return None if a is None or b in (None, 0) else (a / b - 1.0) * 100.0


def _sampled_per_space(dm: dict, fm: dict) -> int:
    """Requests the default simulates per admission space in the steady window: max(1, round(n / k)) of the n a
    space runs (sim/systems.RunBound.stride), n = steady running / spaces (DP: the paper configs' 8 ranks)."""
    n = fm["steady_mean_concurrency"] / (8 if fm["attention"] == "dp" else 1)
    return max(1, int(n / dm["request_sample_stride"] + 0.5))


def table_rows(records: dict) -> list[dict]:
    """One row per config with both replays ok: default and full figures, and default - full."""
    rows = []
    for name in CONFIGS:
        d, f = records.get(f"{name}/default", {}), records.get(f"{name}/full", {})
        if d.get("status") != "ok" or f.get("status") != "ok":
            continue
        dm, fm = d["metrics"], f["metrics"]
        rows.append({
            "config": name, "hardware": fm["hardware"], "attention": fm["attention"],
            "spec": fm["draft_tokens"] > 0, "system": fm["system"],
            "hit_rate_default": dm["gpu_hit_rate"], "hit_rate_full": fm["gpu_hit_rate"],
            "hit_rate_error_points": (dm["gpu_hit_rate"] - fm["gpu_hit_rate"]) * 100.0,
            "tok_s_default": dm["decode_throughput_tok_s"], "tok_s_full": fm["decode_throughput_tok_s"],
            "tok_s_error_pct": _pct(dm["decode_throughput_tok_s"], fm["decode_throughput_tok_s"]),
            "tpot_p50_ms_default": dm["tpot_ms_p50"], "tpot_p50_ms_full": fm["tpot_ms_p50"],
            "tpot_p50_error_pct": _pct(dm["tpot_ms_p50"], fm["tpot_ms_p50"]),
            "steady_window_steps": fm["steady_window_steps"], "tok_s_source": fm["tpot_source"],
            "running_full": fm["steady_mean_concurrency"], "request_sample_stride_default":
                dm["request_sample_stride"], "sampled_per_space_default": _sampled_per_space(dm, fm),
            "policy_groups_default": dm["policy_groups_simulated"],
            "sim_wall_s_default": dm["sim_wall_s"], "sim_wall_s_full": fm["sim_wall_s"],
            "peak_rss_bytes_default": dm["peak_rss_bytes"], "peak_rss_bytes_full": fm["peak_rss_bytes"],
            **_matched_columns(records.get(f"{name}/matched", {}), fm)})
    return rows


def _matched_columns(rec: dict, fm: dict) -> dict:
    """The "matched" replay's figures and errors against full (`matched_overrides`), when it ran."""
    if rec.get("status") != "ok":
        return {}
    mm = rec["metrics"]
    return {"request_sample_stride_matched": mm["request_sample_stride"],
            "sampled_per_space_matched": _sampled_per_space(mm, fm),
            "hit_rate_matched": mm["gpu_hit_rate"], "tok_s_matched": mm["decode_throughput_tok_s"],
            "hit_rate_error_points_matched": (mm["gpu_hit_rate"] - fm["gpu_hit_rate"]) * 100.0,
            "tok_s_error_pct_matched": _pct(mm["decode_throughput_tok_s"], fm["decode_throughput_tok_s"]),
            "tpot_p50_error_pct_matched": _pct(mm["tpot_ms_p50"], fm["tpot_ms_p50"])}


def _variant_figures(records: dict, variants: tuple[str, ...]):
    """(config, its records, hit rates, tok/s) of each config with every one of `variants` replayed ok."""
    for name in CONFIGS:
        recs = {v: records.get(f"{name}/{v}", {}) for v in variants}
        if all(r.get("status") == "ok" for r in recs.values()):
            yield (name, recs, {v: r["metrics"]["gpu_hit_rate"] for v, r in recs.items()},
                   {v: r["metrics"]["decode_throughput_tok_s"] for v, r in recs.items()})


def attribution_rows(records: dict) -> list[dict]:
    """Per config with the one-knob variants: how much of the hit-rate error each sampled knob alone makes."""
    return [{"config": name, **{f"hit_rate_{v}": h for v, h in hit.items()},
             "hit_error_groups_only_points": (hit["requests_all"] - hit["full"]) * 100.0,
             "hit_error_requests_only_points": (hit["groups_all"] - hit["full"]) * 100.0,
             "hit_error_both_points": (hit["default"] - hit["full"]) * 100.0,
             "tok_s_error_groups_only_pct": _pct(tok["requests_all"], tok["full"]),
             "tok_s_error_requests_only_pct": _pct(tok["groups_all"], tok["full"])}
            for name, _, hit, tok in _variant_figures(records, ("default", "full", "groups_all", "requests_all"))]


def larger_sample_rows(records: dict) -> list[dict]:
    """Per config with a `fraction_4` replay: the default's error and the error with a 4x larger request sample."""
    return [{"config": name, "wall_s_default": recs["default"]["wall_s"], "wall_s_fraction_4": recs["fraction_4"]["wall_s"],
             "hit_error_default_points": (hit["default"] - hit["full"]) * 100.0,
             "hit_error_fraction_4_points": (hit["fraction_4"] - hit["full"]) * 100.0,
             "tok_s_error_default_pct": _pct(tok["default"], tok["full"]),
             "tok_s_error_fraction_4_pct": _pct(tok["fraction_4"], tok["full"])}
            for name, recs, hit, tok in _variant_figures(records, ("default", "full", "fraction_4"))]


def _larger_sample_md(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", "Request sample 4x larger (`--add fraction_4`: request_fraction 1/4, the default's groups): error "
             "against the same full run.", "",
             "| config | default: Δ hit / Δ tok/s | 1/4 of the requests: Δ hit / Δ tok/s | wall s default / 1/4 |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['hit_error_default_points']:+.1f} / {_f(r['tok_s_error_default_pct'], '+.1f')}% "
                     f"| {r['hit_error_fraction_4_points']:+.1f} / {_f(r['tok_s_error_fraction_4_pct'], '+.1f')}% "
                     f"| {r['wall_s_default']:.0f} / {r['wall_s_fraction_4']:.0f} |")
    return lines


def _attribution_md(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", "Attribution (`--add groups_all,requests_all`): each sampled knob alone, the other at full (hit-rate error in points, "
             "tok/s error in %).", "",
             "| config | groups sampled only: Δ hit / Δ tok/s | requests sampled only: Δ hit / Δ tok/s | both "
             "(default): Δ hit |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['hit_error_groups_only_points']:+.1f} / "
                     f"{_f(r['tok_s_error_groups_only_pct'], '+.1f')}% | {r['hit_error_requests_only_points']:+.1f} / "
                     f"{_f(r['tok_s_error_requests_only_pct'], '+.1f')}% | {r['hit_error_both_points']:+.1f} |")
    return lines


def _matched_md(rows: list[dict]) -> list[str]:
    rows = [r for r in rows if "hit_rate_matched" in r]
    if not rows:
        return []
    lines = ["", "Paper-matched request sample (`matched`: the default's groups and pilot, a request sample taking as "
             "many requests per space as the default does at paper scale, with its pool slots per sampled request):",
             "", "| config | k / sampled per space | hit rate matched → full | Δ hit (pts) | Δ tok/s | Δ TPOT |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['request_sample_stride_matched']} / {r['sampled_per_space_matched']} | "
                     f"{r['hit_rate_matched']:.3f} → {r['hit_rate_full']:.3f} | "
                     f"{r['hit_rate_error_points_matched']:+.1f} | {_f(r['tok_s_error_pct_matched'], '+.1f')}% | "
                     f"{_f(r['tpot_p50_error_pct_matched'], '+.1f')}% |")
    return lines


def _f(v, fmt):
    return "—" if v is None else format(v, fmt)


def markdown(data: dict) -> str:
    meta = data["meta"]
    commits = sorted({r.get("commit", meta["commit"]) for r in data["records"].values()})
    label = meta["scale"].get("label", "reduced scale")
    lines = [f"# Sampling error of default fidelity ({label}; records from commit {', '.join(commits)})", "",
             f"{meta['date']} · `{meta['command']}` · {meta['machine']}", ""]
    lines += [f"Then {c['date']} · `{c['command']}` (commit {c['commit']})" for c in meta.get("later_calls", [])]
    lines += ["", meta["scale"]["description"], "",
             "Error = default − full (hit rate in points, tok/s and TPOT p50 in %). Steady tok/s = "
             "`decode_throughput_tok_s` over the steady window (`steady_window_steps`).", "",
             "| config | running | k / sampled per space / groups (default) | hit rate default → full | Δ hit (pts) | steady tok/s "
             "default → full | Δ tok/s | TPOT p50 ms default → full | Δ TPOT | window steps | wall s default / full "
             "| peak RSS GB default / full |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["table"]:
        lines.append(
            f"| {r['config']} | {_f(r['running_full'], '.0f')} | {r['request_sample_stride_default']} / "
            f"{r['sampled_per_space_default']} / "
            f"{r['policy_groups_default']} | {r['hit_rate_default']:.3f} → {r['hit_rate_full']:.3f} | "
            f"{r['hit_rate_error_points']:+.1f} | {_f(r['tok_s_default'], ',.0f')} → {_f(r['tok_s_full'], ',.0f')} | "
            f"{_f(r['tok_s_error_pct'], '+.1f')}% | {_f(r['tpot_p50_ms_default'], '.2f')} → "
            f"{_f(r['tpot_p50_ms_full'], '.2f')} | {_f(r['tpot_p50_error_pct'], '+.1f')}% | "
            f"{r['steady_window_steps']} | {r['sim_wall_s_default']:.1f} / {r['sim_wall_s_full']:.1f} | "
            f"{r['peak_rss_bytes_default'] / 1e9:.2f} / {r['peak_rss_bytes_full'] / 1e9:.2f} |")
    lines += _hit_rows_md(data.get("hit_table", []))
    lines += _matched_md(data["table"])
    lines += _attribution_md(data.get("attribution", []))
    lines += _larger_sample_md(data.get("larger_sample", []))
    for key, olds in sorted(data.get("superseded", {}).items()):
        lines += [""] if key == min(data["superseded"]) else []
        lines += [f"Superseded: {key} at commit {o['commit']}: hit {o['metrics']['gpu_hit_rate']:.3f}, steady tok/s "
                  f"{o['metrics']['decode_throughput_tok_s']:,.0f} (replaced by a rerun at commit "
                  f"{data['records'][key].get('commit')}; {meta.get('superseded_note', '')})" for o in olds]
    bad = {k: v for k, v in data["records"].items() if v.get("status") != "ok"}
    if bad:
        lines += ["", "Replays without a result:", ""] + [f"- {k}: {v.get('error')}" for k, v in sorted(bad.items())]
    return "\n".join(lines) + "\n"


def _other_seeds(extra: list[Path]) -> dict:
    """config -> the errors of the same study at other seeds (--table-extra files), for the table's spread."""
    out: dict = {}
    for path in extra:
        other = read_json_limited(path, "--table-extra")
        for r in other["table"]:
            out.setdefault(r["config"], []).append(
                {"seed": other["meta"]["scale"].get("seed"), "source": str(path.resolve().relative_to(ROOT)),
                 **{k: r[k] for k in ("hit_rate_error_points", "tok_s_error_pct", "tpot_p50_error_pct",
                                      "hit_rate_error_points_matched", "tok_s_error_pct_matched",
                                      "tpot_p50_error_pct_matched") if k in r}})
    return out


def write_table(data: dict, path: Path, extra: list[Path] = (), source: Path = OUT) -> None:
    """The lookup table sim/sampling_error.py reads: per config its match keys, errors and provenance."""
    meta = data["meta"]
    others = _other_seeds(list(extra))
    keep = ("hardware", "attention", "spec", "system", "config", "hit_rate_error_points", "tok_s_error_pct",
            "tpot_p50_error_pct", "hit_rate_default", "hit_rate_full", "tok_s_default", "tok_s_full",
            "steady_window_steps", "request_sample_stride_default", "sampled_per_space_default",
            "policy_groups_default")
    matched = ("hit_rate_error_points_matched", "tok_s_error_pct_matched", "tpot_p50_error_pct_matched",
               "request_sample_stride_matched", "sampled_per_space_matched")
    commits = sorted({r.get("commit", meta["commit"]) for r in data["records"].values()})
    date = max([meta["date"]] + [c["date"] for c in meta.get("later_calls", [])])  # the last call that ran replays
    table = {"source": str(source.resolve().relative_to(ROOT)), "date": date, "commit": ", ".join(commits),
             "scale": meta["scale"]["summary"],
             "definition": "error = default-fidelity figure - full-fidelity figure of the same run (the scale: `scale`): "
                           "hit rate in points, steady tok/s and TPOT p50 in percent",
             "rows": [{**{k: r[k] for k in keep}, **{k: r[k] for k in matched if k in r},
                       "default_fidelity": meta["scale"]["per_config"][r["config"]]["paper"]["fidelity"],
                       **({"measured_workload": _workload_of(r["config"], meta["scale"]["seed"])}
                          if not meta["scale"]["cap"] else {}),
                       "other_seeds": others.get(r["config"], []), **({"hit_rate_only": True}
                                                                       if r.get("hit_rate_only") else {})}
                      for r in data["table"] + data.get("hit_table", [])]}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(table, indent=1) + "\n")


def _workload_of(name: str, seed: int) -> dict:
    """The workload a paper-scale row was measured on (the config as committed, at the study's seed): a run with
    this workload is the measured run (sim/sampling_error.py then states the paper-scale error first)."""
    from sim.config import build, load_config

    wl = build(load_config(ROOT / "configs" / f"{name}.yaml", [])).workload
    return {"profile": wl.profile, "trace": wl.trace, "num_requests": wl.num_requests,
            "max_concurrency": wl.max_concurrency, "max_steps": wl.max_steps, "seed": seed}


def save(data: dict, out: Path) -> None:
    data["table"] = table_rows(data["records"])
    data["attribution"] = attribution_rows(data["records"])
    data["larger_sample"] = larger_sample_rows(data["records"])
    data["hit_table"] = hit_rows(data["records"])
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(data, indent=1) + "\n")
    atomic_write_text(out.with_suffix(".md"), markdown(data))


# ----------------------------------------------------------------------------------------------- main
def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _scale_text(args) -> tuple[str, str, str]:
    """(label, summary, description) of the study's scale."""
    if args.paper:
        summary = (f"paper scale: each config as committed, its whole run, seed {args.seed}, "
                   f"{args.policy_workers} policy process(es) per replay")
        return "paper scale", summary, (summary[0].upper() + summary[1:] + ". Full replays measured on another "
                                        "machine come from bench/full_fidelity.py whole runs (--full-from).")
    summary = (f"cap {args.cap} (paper 256), {2 * args.cap} requests, GPU/CPU KV budgets per GPU x {args.cap}/256, "
               f"max_steps {args.steps_on} (spec on) / {args.steps_off} (off), seed {args.seed}, "
               f"{args.policy_workers} policy process(es) per replay")
    return "reduced scale", summary, ("Reduced scale, not the paper scale: " + summary + ". Why: a full-fidelity replay at paper scale takes "
            "~2.2 h on 16 cores; scaling the cap and both KV budgets by the same factor keeps the pool "
            "slots per running request (the cache pressure) and the share admitted as at paper scale; 2 x cap "
            "requests (B300's own ratio; H200's configs draw 256 at cap 256, which at this scale would all be "
            "admitted at once in 3 of 4 H200 configs) make requests wait, and the step bound keeps each run past its "
            "first completion, so a steady window exists. What it does not keep: the running requests per admission "
            "space, so the default samples max(1, round(n / 16)) of a space's n: here 1 per DP rank (n = 8) and 2-4 "
            "under TP (n = 36-64); at paper scale a space runs up to 4x as many, and the default samples up to 4x as "
            "many requests per space.")


def _meta(args, scales: dict) -> dict:
    label, summary, desc = _scale_text(args)
    return {"bench": "fidelity_error",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", "bench/fidelity_error.py", *sys.argv[1:]]), "commit": _commit(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1),
                        "load_avg_before": os.getloadavg()},
            "scale": {"label": label, "summary": summary, "description": desc, "cap": args.cap, "steps_on": args.steps_on,
                      "steps_off": args.steps_off, "seed": args.seed, "per_config": scales},
            "full_overrides": FULL}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", type=int, default=64, help="concurrency cap of every replay (paper: 256)")
    ap.add_argument("--steps-on", type=int, default=160, help="max_steps with draft tokens")
    ap.add_argument("--steps-off", type=int, default=320, help="max_steps without draft tokens")
    ap.add_argument("--seed", type=int, default=0, help="workload.seed of every replay (the configs': 0)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--min-free-gb", type=float, default=10.0, help="start another replay only above this free")
    ap.add_argument("--only", default="", help="comma-separated config names (default: all 8)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--summarize", action="store_true", help="rebuild the table from --out only")
    ap.add_argument("--table-extra", action="append", default=[], type=Path,
                    help="with --write-table: the same study at another seed, listed per row as other_seeds")
    ap.add_argument("--add", default="", help="comma-separated replays of --only's configs (default, full, "
                    "groups_all, requests_all, matched) to (re)run into --out, which must hold the study (its scale; "
                    "a config new to it joins at that scale; --full-from records join too)")
    ap.add_argument("--write-table", action="store_true", help=f"also write {TABLE.relative_to(ROOT)} (--paper: "
                    f"{TABLE_PAPER.relative_to(ROOT)})")
    ap.add_argument("--paper", action="store_true", help=f"no scale-down: each config's whole run (out: "
                    f"{OUT_PAPER.relative_to(ROOT)}; no matched replays)")
    ap.add_argument("--policy-workers", type=int, default=1, help="processes for each replay's policy groups")
    ap.add_argument("--full-from", nargs="*", type=Path, default=[], metavar="JSON",
                    help="take the full replays from bench/full_fidelity.py whole runs (e.g. a device machine's) "
                         "instead of running them")
    ap.add_argument("--hits-from", nargs="*", type=Path, default=[], metavar="JSON",
                    help="a config's full-fidelity hit rate from bench/full_fidelity_by_group.py (where no whole "
                         "full replay exists: the table's row has the hit rate's error only, or every figure where "
                         "the JSON holds a playback of the groups' ratios, --ratios)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child)
    if args.paper:
        args.cap = 0
        args.out = str(OUT_PAPER) if args.out == str(OUT) else args.out
    out = Path(args.out)
    if args.summarize:
        try:
            data = json.loads(out.read_text())
        except (OSError, ValueError) as e:  # missing or not JSON: one line, not a traceback
            print(f"fidelity_error: cannot summarize {out}: {e}", file=sys.stderr)
            return 2
    else:
        try:
            _check(args)
            data = run_added(args, out) if args.add or args.full_from or args.hits_from else run_study(args, out)
        except (OSError, ValueError, KeyError) as e:  # a bad argument or input file: one line, not a traceback
            print(f"fidelity_error: {e if not isinstance(e, KeyError) else f'an input file lacks the key {e}'}",
                  file=sys.stderr)
            return 2
    save(data, out)
    if args.write_table:
        write_table(data, TABLE_PAPER if args.paper else TABLE, args.table_extra, out)
    print(out.with_suffix(".md").read_text())
    return 0


def _check(args) -> None:
    """Bad arguments as one ValueError before any replay starts."""
    names = [n for n in args.only.split(",") if n]
    if set(names) - set(CONFIGS):
        raise ValueError(f"--only: unknown config {sorted(set(names) - set(CONFIGS))[0]!r} (the paper configs: "
                         f"{', '.join(CONFIGS)})")
    adds = {"default", "full", "matched", *VARIANTS}
    if {v for v in args.add.split(",") if v} - adds:
        raise ValueError(f"--add takes {', '.join(sorted(adds))}, got {args.add!r}")
    counts = {"--jobs": args.jobs, "--policy-workers": args.policy_workers, "--steps-on": args.steps_on,
              "--steps-off": args.steps_off}
    for flag, value in counts.items():
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if args.cap < 0 or not args.min_free_gb >= 0:
        raise ValueError("--cap and --min-free-gb must be >= 0")
    for path in [*args.full_from, *args.hits_from, *args.table_extra]:
        if not path.is_file():
            raise ValueError(f"{path}: no such file")


def run_study(args, out: Path) -> dict:
    """Every config's default and full replay, full ones first (the longest), saved as each ends."""
    names = [n for n in args.only.split(",") if n] or list(CONFIGS)
    scales = {n: scale_overrides(ROOT / "configs" / f"{n}.yaml", args.cap, args.steps_on, args.steps_off, args.seed)
              for n in names}
    data = {"meta": _meta(args, {n: s[1] for n, s in scales.items()}), "records": full_records(args.full_from)}
    todo = [(f"{n}/full", ROOT / "configs" / f"{n}.yaml", scales[n][0] + FULL)
            for n in sorted(names, key=lambda n: "b300" not in n)  # B300 admits more: the longest first
            if f"{n}/full" not in data["records"]]
    todo += [(f"{n}/default", ROOT / "configs" / f"{n}.yaml", scales[n][0]) for n in names]
    todo += [(f"{n}/matched", ROOT / "configs" / f"{n}.yaml", scales[n][0] + matched_overrides(scales[n][1]))
             for n in names if not args.paper]  # (at paper scale it is the default)

    def on_record(key: str, rec: dict) -> None:
        data["records"][key] = rec | {"commit": _commit()}
        data["meta"]["load_avg_after"] = os.getloadavg()
        save(data, out)
        m = rec.get("metrics", {})
        print(f"{key:28s} {rec['status']:6s} {rec['wall_s']:7.1f} s  hit {m.get('gpu_hit_rate', 0) or 0:.3f}  "
              f"tok/s {m.get('decode_throughput_tok_s', 0) or 0:8.0f}  window {m.get('steady_window_steps')}  "
              f"rss {(m.get('peak_rss_bytes') or 0) / 1e9:.2f} GB {rec.get('error', '')}", flush=True)

    run_all(todo, args.jobs, args.min_free_gb, on_record, args.policy_workers)
    return data


def full_records(paths: list[Path]) -> dict:
    """`<config>/full` records from bench/full_fidelity.py JSONs: each one's whole run (a cut of 0 steps that
    ended), of a paper config with no other --set, its commit and machine named."""
    from sim.config import build, load_config

    out = {}
    for path in paths:
        data = read_json_limited(path, "--full-from")
        name = Path(data["config"]).stem
        whole = [c for c in data["cuts"] if c.get("steps") is None and "wall_s" in c]
        if name not in CONFIGS or data.get("sets") or not whole:
            raise ValueError(f"{path}: not a whole full-fidelity run of a paper config without --set")
        cfg = build(load_config(ROOT / data["config"], []))
        fields = {"hardware": cfg.hardware.name, "attention": cfg.attention, "draft_tokens": cfg.spec.draft_tokens,
                  "system": cfg.system, "num_requests": cfg.workload.num_requests}
        out[f"{name}/full"] = {"status": "ok", "wall_s": whole[-1]["wall_s"], "overrides": FULL,
                               "metrics": {**{k: whole[-1].get(k) for k in KEEP}, **fields},
                               "commit": data.get("tree") or data.get("git_commit"), "source": str(path),
                               "machine": data.get("device_kind") or data.get("machine")}
    return out


def hit_records(paths: list[Path]) -> dict:
    """`<config>/full_hits` records from bench/full_fidelity_by_group.py JSONs: a paper config's full-fidelity hit
    rate from every group's replay alone (no throughput), with its commit and machine."""
    out = {}
    for path in paths:
        data = read_json_limited(path, "--hits-from")
        name = Path(data.get("config", "")).stem
        comb = data.get("combined") or {}
        if name not in CONFIGS or data.get("sets") or comb.get("groups") != comb.get("of_groups") \
                or not comb.get("same_batches"):
            raise ValueError(f"{path}: not every group of a paper config without --set, with the same batches")
        out[f"{name}/full_hits"] = {"status": "ok", "overrides": FULL + ["fidelity.only_group=<each>"],
                                    "metrics": {k: comb[k] for k in ("gpu_hit_rate", "decode_steps", "decode_tokens")},
                                    "commit": data.get("tree"), "source": str(path), "machine": data.get("machine")}
        played = data.get("played") or {}
        if played.get("hit_rate_matches_combined"):  # every group's ratios played back: the whole full run
            out[f"{name}/full"] = _played_record(data, played, path)
    return out


def _played_record(data: dict, played: dict, path: Path) -> dict:
    """A `<config>/full` record from a by-group JSON's playback (sim/ratio_replay.py): the full run's metrics; its
    wall time and memory are those of all the replays it took (the groups' summed, the largest peak). A playback
    that streamed beside the groups counts its CPU seconds (its wall time is mostly waiting for them)."""
    groups = data["groups"].values()
    metrics = {k: played.get(k) for k in KEEP}
    play_s = played.get("cpu_s", 0.0 if played.get("streamed") else played["wall_s"])
    metrics["sim_wall_s"] = sum(g["wall_s"] for g in groups) + play_s
    metrics["peak_rss_bytes"] = max([g["peak_rss_bytes"] for g in groups] + [played["peak_rss_bytes"]])
    return {"status": "ok", "wall_s": metrics["sim_wall_s"], "played": True,
            "overrides": FULL + ["fidelity.only_group=<each>, ratios played back"], "metrics": metrics,
            "commit": data.get("tree"), "source": str(path), "machine": data.get("machine")}


def hit_rows(records: dict) -> list[dict]:
    """Configs with a default replay and a by-group full hit rate but no whole full replay: the hit rate's error only
    (the default's decode steps must be the groups' own: the same batches)."""
    rows = []
    for name in CONFIGS:
        d, h = records.get(f"{name}/default", {}), records.get(f"{name}/full_hits", {})
        if d.get("status") != "ok" or h.get("status") != "ok" or records.get(f"{name}/full", {}).get("status") == "ok":
            continue
        dm, hm = d["metrics"], h["metrics"]
        if dm["decode_steps"] != hm["decode_steps"]:
            continue
        rows.append({"config": name, "hardware": dm["hardware"], "attention": dm["attention"],
                     "spec": dm["draft_tokens"] > 0, "system": dm["system"], "hit_rate_only": True,
                     "hit_rate_default": dm["gpu_hit_rate"], "hit_rate_full": hm["gpu_hit_rate"],
                     "hit_rate_error_points": (dm["gpu_hit_rate"] - hm["gpu_hit_rate"]) * 100.0,
                     "tok_s_error_pct": None, "tpot_p50_error_pct": None, "tok_s_default": dm["decode_throughput_tok_s"],
                     "tok_s_full": None, "steady_window_steps": dm["steady_window_steps"],
                     "request_sample_stride_default": dm["request_sample_stride"], "sampled_per_space_default": None,
                     "policy_groups_default": dm["policy_groups_simulated"], "source_full": h["source"]})
    return rows


def _hit_rows_md(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = ["", "Hit rate only (the full run's hit rate from every group's replay alone, "
             "bench/full_fidelity_by_group.py, without --ratios: no throughput):", "",
             "| config | hit rate default → full | Δ hit (pts) | source |", "|---|---|---|---|"]
    return lines + [f"| {r['config']} | {r['hit_rate_default']:.3f} → {r['hit_rate_full']:.3f} | "
                    f"{r['hit_rate_error_points']:+.1f} | `{r['source_full']}` |" for r in rows]


def _simulated(rec: dict) -> dict:
    """A record's simulated figures (what a rerun at the same commit reproduces: not wall time or memory)."""
    return {k: v for k, v in (rec.get("metrics") or {}).items()
            if k not in ("sim_wall_s", "peak_rss_bytes", "est_peak_memory_bytes")}


def _merge(data: dict, key: str, rec: dict) -> None:
    """Put `rec` into the study; a rerun whose simulated results moved keeps the old record, named."""
    old = data["records"].get(key)
    if old and _simulated(old) != _simulated(rec):
        data.setdefault("superseded", {}).setdefault(key, []).append(
            old | {"commit": old.get("commit", data["meta"]["commit"])})
    data["records"][key] = rec


def run_added(args, out: Path) -> dict:
    """Replays of the named configs (a one-knob variant, or a rerun at this commit) merged into the study in --out
    at the scale it ran; each record names its commit."""
    if not out.is_file():
        raise ValueError(f"{out}: no study to add to (--add, --full-from and --hits-from merge into one; run the "
                         "study first)")
    data = read_json_limited(out, "--out")
    scale = data["meta"]["scale"]
    extras = {"default": [], "full": FULL, **VARIANTS}
    todo = []
    for key, rec in {**full_records(args.full_from), **hit_records(args.hits_from)}.items():  # made elsewhere
        _merge(data, key, rec)
    for name in [n for n in args.only.split(",") if n] or list(CONFIGS):
        if name not in scale["per_config"]:  # a config new to the study: at the study's own scale
            scale["per_config"][name] = scale_overrides(ROOT / "configs" / f"{name}.yaml", scale["cap"],
                                                        scale["steps_on"], scale["steps_off"], scale["seed"])[1]
        per = scale["per_config"][name]
        extras["matched"] = matched_overrides(per)
        todo += [(f"{name}/{v}", ROOT / "configs" / f"{name}.yaml", per["overrides"] + extras[v])
                 for v in args.add.split(",") if v]
    data["meta"].setdefault("later_calls", []).append(
        {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": _commit(),
         "command": " ".join(["python", "bench/fidelity_error.py", *sys.argv[1:]]), "load_avg_before": os.getloadavg()})

    def on_record(key: str, rec: dict) -> None:
        _merge(data, key, rec | {"commit": _commit()})
        save(data, out)
        print(f"{key:34s} {rec['status']:6s} {rec['wall_s']:7.1f} s  hit "
              f"{rec.get('metrics', {}).get('gpu_hit_rate', 0) or 0:.3f}", flush=True)

    run_all(todo, args.jobs, args.min_free_gb, on_record, args.policy_workers)
    return data


if __name__ == "__main__":
    sys.exit(main())
