"""Write docs/performance.md from the benchmark results in bench/results/ (`make bench` refreshes them; `make docs`
rewrites this page). Every figure on the page is read from a committed JSON, which records its date, command and
machine; nothing here is typed by hand.

    python docs/gen_performance.py [--out docs/performance.md] [--check]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from page_main import page_main  # docs/page_main.py: docs/ is sys.path[0] when this script runs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _f(value, digits: int = 1, scale: float = 1.0) -> str:
    return "—" if value is None else f"{value * scale:,.{digits}f}"


def _machine(data: dict) -> str:
    m = data.get("machine") or {}
    if isinstance(m, str):
        return m
    if not m:
        found = _latest_label(data, "machine")
        m = found[1]["machine"] if found else {}
    cpus = m.get("cpus") or m.get("num_cpus")
    return f"{cpus} CPUs" if cpus else ""


def _when(data: dict) -> str:
    """The result's date; for labelled results (runs side by side under labels), the latest label's."""
    date = data.get("date") or data.get("date_utc") or max(
        (v.get("date", "") for v in data.values() if isinstance(v, dict)), default="")
    return str(date)[:16].replace("T", " ")


def _latest_label(data: dict, has: str) -> tuple[str, dict] | None:
    """Labelled results (`--label` / `--tag` runs side by side): the most recent label that has `has`."""
    labels = [(v.get("date", ""), k, v) for k, v in data.items() if isinstance(v, dict) and v.get(has)]
    return max(labels)[1:] if labels else None


def policy(d: dict) -> list[str]:
    s, c = d["summary"], d["config"]
    rows = [f"One access batch of {c['num_requests']} requests x {c['query_tokens']} query tokens x top-{c['top_k']} "
            f"(~{c['num_requests'] * c['query_tokens'] * c['top_k'] / 1e6:.1f} M references) on {c['gpu_slots']:,} GPU "
            f"/ {c['cpu_slots']:,} CPU slots, {c['backend']} backend, one thread; medians over fresh caches.", "",
            "| policy | access, M refs/s (wall / CPU) | access + commit, M refs/s (wall / CPU) |", "|---|---|---|"]
    for name, v in s.items():
        rows.append(f"| `{name}` | {_f(v['median_access_refs_per_s'], 1, 1e-6)} / "
                    f"{_f(v['median_access_cpu_refs_per_s'], 1, 1e-6)} | {_f(v['median_access_commit_refs_per_s'], 1, 1e-6)}"
                    f" / {_f(v['median_access_commit_cpu_refs_per_s'], 1, 1e-6)} |")
    rows += ["", f"Target: {_f(d.get('target_refs_per_s'), 0, 1e-6)} M refs/s. PB-LRU vs exact LRU hit rate on "
             f"locality-rich multi-step workloads, {d.get('default_num_recent_buckets')} recent buckets: worst gap "
             f"{_f(d.get('hit_rate_gap_worst_points_default_buckets'), 4)} points."]
    return rows


def pool_scale(d: dict) -> list[str]:
    f = d["figures"]
    return ["Time and memory follow the entries held and touched, not the budgets (small pool vs one 32x larger).", "",
            "| what | figure |", "|---|---|",
            f"| build, 6.4M GPU / 64M CPU slots per rank, DP-1 / TP-4 | {_f(f['build_dp1_large_s'], 2, 1e3)} / "
            f"{_f(f['build_tp4_large_s'], 2, 1e3)} ms |",
            f"| resident access batch, 32x pool / small pool (CPU time) | {_f(f['resident_ratio_access_cpu'], 2)}x |",
            f"| access batch with misses, 32x CPU pool / small (CPU time) | {_f(f['misses_ratio_access_cpu'], 2)}x |",
            f"| TP-4 access + commit, 2M references, small / large pools | {_f(f['tp4_small_access_commit_s'], 2)} / "
            f"{_f(f['tp4_large_access_commit_s'], 2)} s |",
            f"| peak RSS of the whole benchmark | {_f(f['peak_rss_mb'], 0)} MB |",
            "", f"Targets: ratio <= {d['targets']['ratio']}, build <= {d['targets']['build_s']} s."]


def dedup(d: dict) -> list[str]:
    rows = ["Where sorting a batch beats the marker scan over the address storage (the library picks by ratio).", "",
            "| marker size (addresses) | largest batch where sort wins |", "|---|---|"]
    rows += [f"| {int(k):,} | {int(v):,} |" for k, v in d["largest_batch_sort_wins"].items()]
    return rows


def trace(d: dict) -> list[str]:
    g, b, st = d["generation"], d["bytes"], d["statistics"].get("glm-5.2", {})
    return [f"Synthetic selections: {g['num_requests']} requests x {g['num_steps']} steps x {g['num_query_tokens']} "
            f"query tokens x {g['num_groups']} groups x top-{g['top_k']} ({g['selected_positions'] / 1e9:.1f} G "
            "positions).", "", "| what | figure |", "|---|---|",
            f"| generation wall / CPU | {_f(g['wall_s'])} s / {_f(g['process_cpu_s'])} s (target {g['target_wall_s']} s) |",
            f"| generation rate | {_f(g['positions_per_s'], 0, 1e-6)} M positions/s |",
            f"| captured format, 1 / 4 query tokens | {b['query_tokens_1']['bytes_per_selection']} / "
            f"{b['query_tokens_4']['bytes_per_selection']} bytes per selected position |",
            f"| step-to-step overlap, deep / early groups (glm-5.2) | {_f(st.get('step_overlap_deep_mean'), 3)} / "
            f"{_f(st.get('step_overlap_early_mean'), 3)} |",
            f"| overlap between speculative tokens / adjacent groups | {_f(st.get('spec_overlap_deep_mean'), 3)} / "
            f"{_f(st.get('adjacent_overlap_deep_mean'), 3)} |"]


def sim(d: dict) -> list[str]:
    m = d.get("metrics", {})
    return [f"The paper-scale replay `{d['config']}` at its default fidelity "
            f"({d.get('policy_groups_simulated')} indexer groups through the policy, 1 request in "
            f"{d.get('request_sample_stride')}).", "", "| what | figure |", "|---|---|",
            f"| wall / CPU | {_f(d['wall_s'])} s / {_f(d['process_cpu_s'])} s (target {d['target_wall_s']} s) |",
            f"| simulated decode tokens per wall second | {_f(d['sim_decode_tokens_per_wall_s'], 0)} |",
            f"| decode steps / simpy events | {d['decode_steps']:,} / {d['simpy_events']:,} |",
            f"| result: decode tok/s, TPOT p50, GPU hit rate | {_f(m.get('decode_throughput_tok_s'), 0)} tok/s, "
            f"{_f(m.get('tpot_ms_p50'))} ms, {_f(m.get('gpu_hit_rate'), 3)} |"]


def sweep(d: dict) -> list[str]:
    rows = ["The same sweep of small replays with one in-process worker and with Ray workers.", "",
            "| workers | executor | points | wall s | executor start s | points/min (with start) |",
            "|---|---|---|---|---|---|"]
    rows += [f"| {r['workers']} | {r['executor']} | {r['num_ok']}/{r['num_points']} | {_f(r['wall_s'])} | "
             f"{_f(r.get('ray_start_s'))} | {_f(r['points_per_min'])} ({_f(r.get('points_per_min_incl_ray_start'))}) |"
             for r in d["runs"]]
    return rows + ["", f"Speed-up 2 vs 1 workers: {d['speedup_2_vs_1_workers']}x "
                   f"({d['speedup_2_vs_1_workers_incl_ray_start']}x with Ray's start-up)."]


def footprint(d: dict) -> list[str]:
    tag = max(d["summary"], key=lambda t: max((r[t].get("date", "") for r in d["runs"].values() if t in r),
                                              default=""))
    s = d["summary"][tag]
    return ["The peak-memory estimate a replay checks before it starts, divided by the replay's measured peak RSS "
            "(>= 1 means a run that would not fit is refused before it starts, never killed midway).", "",
            "| runs | min | median | max | below 1 |", "|---|---|---|---|---|",
            f"| {s['runs']} | {s['min_ratio']} | {s['median_ratio']} | {s['max_ratio']} | {s['below_1']} |"]


def pblru_gap(d: dict) -> list[str]:
    found = _latest_label(d, "runs")
    if not found:
        return ["No paired replay recorded."]
    label, v = found
    c = v["config"]
    rows = [f"The same replay under both policies (`{label}`): {c['system']} {c['attention']}, "
            f"{c['hardware']['preset']} x {c['hardware']['num_gpus']}, {c['model']['preset']}, "
            f"{c['spec']['draft_tokens']} draft tokens, {c['workload']['num_requests']} requests at concurrency "
            f"{c['workload']['max_concurrency']}.", "",
            "| policy | GPU hit rate | decode tok/s | wall s |", "|---|---|---|---|"]
    rows += [f"| `{r['policy']}` | {_f(r['gpu_hit_rate'], 4)} | {_f(r['decode_throughput_tok_s'], 0)} | "
             f"{_f(r['wall_s'])} |" for r in v["runs"]]
    return rows + ["", f"Gap: {_f(v.get('gap_points'), 3)} points (requirement: within 0.1)."]


def scale(d: dict) -> list[str]:
    rows = ["Replays each alone in a fresh process, against their targets.", "",
            "| section | runs | within target | max wall s | max peak GB | target |", "|---|---|---|---|---|---|"]
    for name, s in d["sections"].items():
        runs = list((s.get("runs") or {}).values())
        ok = sum(1 for r in runs if r.get("meets_target"))
        peak = s.get("max_peak_gb", s.get("max_peak_rss_gb"))
        target = ", ".join(f"{k} {v}" for k, v in (s.get("target") or {}).items() if v is not None)
        rows.append(f"| {name} | {len(runs)} | {ok} | {s.get('max_wall_s')} | {peak} | {target} |")
    speed = d.get("machine_speed") or {}
    if speed:
        rows += ["", f"Machine speed probe (CPU-s of a fixed workload, lower is faster) before / after: "
                 f"{speed.get('before_s')} / {speed.get('after_s')}."]
    return rows


def paper_configs() -> tuple[str, list[str]] | None:
    """The most recent `paper_configs_<label>.json`: each system's peak decode throughput per paper config."""
    files = sorted(RESULTS.glob("paper_configs_*.json"))
    found = [(json.loads(p.read_text()), p) for p in files]
    found = [(d, p) for d, p in found if d.get("table")]
    if not found:
        return None
    d, path = max(found, key=lambda dp: dp[0].get("meta", {}).get("date", ""))
    rows = ["| hardware | attention | spec | system | peak decode tok/s (cap) | batch-1 TPOT ms | admitted @256 |",
            "|---|---|---|---|---|---|---|"]
    for r in d["table"]:
        cap = r.get("peak_decode_throughput_tok_s_cap")
        rows.append(f"| {r['hardware']} | {r['attention']} | {r['spec']} | {r['system']} | "
                    f"{_f(r.get('peak_decode_throughput_tok_s'), 0)} ({cap}) | {_f(r.get('batch1_tpot_ms'), 2)} | "
                    f"{_f(r.get('admitted_at_cap256'), 0)} |")
    meta = d.get("meta", {})
    note = (f"Label `{meta.get('label')}`, model `{meta.get('settings', {}).get('model', meta.get('model', '?'))}`, "
            f"{_when(meta)} UTC, {_machine(meta)}; the peak is over caps 1/16/64/256 (and 512 on B300 where run); "
            f"definitions and every run's record are in the JSON, the table beside it in `{path.stem}.md`.")
    return path.name, [note, ""] + rows


def fidelity_error(d: dict) -> list[str]:
    """Default vs full fidelity per paper config (reduced scale: the JSON's `meta.scale`)."""
    rows = [f"Reduced scale: {d.get('meta', {}).get('scale', {}).get('summary', '?')}. Error = default - full.", "",
            "| config | hit rate default / full | error (points) | steady tok/s default / full | error | "
            "paper-matched sample: error points / tok/s | wall s default / full |", "|---|---|---|---|---|---|---|"]
    for r in d.get("table", []):
        rows.append(f"| {r['config']} | {_f(r.get('hit_rate_default'), 3)} / {_f(r.get('hit_rate_full'), 3)} | "
                    f"{_f(r.get('hit_rate_error_points'), 1)} | {_f(r.get('tok_s_default'), 0)} / "
                    f"{_f(r.get('tok_s_full'), 0)} | {_f(r.get('tok_s_error_pct'), 1)}% | "
                    f"{_f(r.get('hit_rate_error_points_matched'), 1)} / {_f(r.get('tok_s_error_pct_matched'), 1)}% | "
                    f"{_f(r.get('sim_wall_s_default'), 1)} / {_f(r.get('sim_wall_s_full'), 0)} |")
    return rows + ["", "Paper-matched: the default's groups and pilot with as many requests sampled per space as the "
                   "paper default takes (`--add matched`; docs/cost-model.md \"Sampling error of default fidelity\")."]


SUITE = (  # (title, script, result file, renderer)
    ("Policy library: access batch speed and hit-rate gap", "policy_bench.py", "policy.json", policy),
    ("Policy library: pools follow use, not budgets", "pool_scale_bench.py", "pool_scale.json", pool_scale),
    ("Policy library: dedup crossover", "dedup_crossover.py", "dedup_crossover.json", dedup),
    ("Traces: selection generation and format", "trace_bench.py", "trace.json", trace),
    ("Simulator: paper-scale replay speed", "sim_bench.py", "sim.json", sim),
    ("Sweeps: one worker vs Ray workers", "sweep_bench.py", "sweep.json", sweep),
    ("Simulator: peak-memory estimate accuracy", "footprint_accuracy.py", "footprint_accuracy.json", footprint),
    ("Simulator: PB-LRU vs exact LRU in a replay", "pblru_gap.py", "pblru_gap.json", pblru_gap),
    ("Simulator: scale targets", "scale_bench.py", "scale.json", scale),
    ("Simulator: sampling error of default fidelity", "fidelity_error.py", "fidelity_error.json", fidelity_error),
)


def render() -> str:
    out = ["# Performance", "",
           "Generated by `docs/gen_performance.py` from `bench/results/` (`make bench` refreshes the results, "
           "`make docs` this page). Each section names its benchmark and result file; the file records the date, "
           "exact command and machine. The development box has 2 shared cores: wall times move with its load, so "
           "CPU seconds are given beside them where recorded. GPU figures: [gpu.md](gpu.md).", "",
           "| benchmark | script | result | date (UTC) | machine |", "|---|---|---|---|---|"]
    loaded = [(title, script, name, fn, _load(name)) for title, script, name, fn in SUITE]
    out += [f"| {t} | `bench/{s}` | `bench/results/{n}` | {_when(d)} | {_machine(d)} |"
            for t, s, n, _, d in loaded if d]
    for title, script, name, fn, data in loaded:
        out += ["", f"## {title}", "", f"`bench/{script}` → `bench/results/{name}` ({_when(data) if data else 'not run'})", ""]
        out += fn(data) if data else ["No result yet: run `make bench`."]
    paper = paper_configs()
    out += ["", "## Paper configurations: peak decode throughput", "",
            "`bench/paper_configs.py` (`make bench-paper`; 108 replays, about 6 minutes with 2 jobs on 2 cores for glm-5.2) → "
            f"`bench/results/{paper[0] if paper else 'paper_configs_<label>.json'}`", ""]
    out += paper[1] if paper else ["No result yet."]
    others = sorted(p.name for p in RESULTS.glob("*.json") if p.name not in {n for _, _, n, _ in SUITE}
                    and not p.name.startswith("paper_configs_"))
    if others:
        out += ["", "## Other recorded measurements", "", "One-off measurements that the cost model "
                "([cost-model.md](cost-model.md)) or the code cite as the source of a constant; each JSON records "
                "its command.", ""]
        out += [f"- `bench/results/{n}` ({_when(_load(n))})" for n in others]
    return "\n".join(out) + "\n"


def main() -> int:
    return page_main(__doc__.splitlines()[0], ROOT / "docs" / "performance.md", render)


if __name__ == "__main__":
    sys.exit(main())
