"""The 8 paper configs (issue 11 "Done when"): each system's peak decode throughput, batch-1 TPOT and admitted
concurrency, for one checkout of the simulator ("before" = an older tree via --tree, "after" = this one).

Grid: hardware h200|b300 x attention dp|tp x spec on (draft_tokens 4) / off (0), for sglang, hisparse, ulacache,
at concurrency caps 1/16/64/256. Every config holds the pinned keys (docs/architecture.md) only (glm-5, 8 GPUs, pb-lru, CPU
storage, seed 11) plus `workload.max_steps` (a time bound, stated in the output):
- cap 1:   1 request, run to completion (batch-1 TPOT = that request's `tpot_ms_mean`);
- cap C>1: `--requests-per-cap` x C requests (so requests wait and each finished one is refilled at once), the run
           cut at `--steps-on` / `--steps-off` decode steps (spec on / off): past the first completions, before the
           drain.
Figures per (config, system): peak over caps of the tree's own `decode_throughput_tok_s` (a tree without
`run_throughput_tok_s` only has the whole-run figure: tokens / busy time of every step run), the same peak of
`tail_throughput_tok_s` (tokens / busy time of the second half of the steps run, read from each run's timeline: one
definition for every tree), batch-1 TPOT, and `max_admitted_concurrency` at cap 256.

Each replay runs in its own interpreter (PYTHONPATH = the tree); --jobs run at once, started only while the sum of
their memory estimates fits --mem-budget-gb, and the largest is killed if the machine's available memory falls under
--mem-reserve-gb. CPU seconds and peak RSS come from os.wait4. Each record is written (atomically, into
--out-dir/paper_configs_<label>.json) as soon as its run ends; a rerun skips records already there (status ok).
Past --deadline-s the runs still going are killed and recorded as such. The markdown table goes beside the JSON.

Usage: python bench/paper_configs.py --label after [--tree DIR --commit SHA] [--jobs 16] [--only-caps 1,256]
       python bench/paper_configs.py --label before --summarize   (rebuild the table from the records only)
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim.footprint import mem_available_bytes

ROOT = Path(__file__).resolve().parents[1]
HARDWARE, ATTENTION, DRAFTS = ("h200", "b300"), ("dp", "tp"), (4, 0)
SYSTEMS, CAPS = ("sglang", "hisparse", "ulacache"), (1, 16, 64, 256)
SEED = 11
KEEP = ("decode_throughput_tok_s", "run_throughput_tok_s", "tpot_ms_mean", "tpot_ms_p50", "tpot_source",
        "steady_window_steps", "steady_mean_concurrency", "max_admitted_concurrency", "mean_concurrency",
        "num_requests", "completed_requests", "rejected_requests", "decode_steps", "decode_tokens", "gpu_hit_rate",
        "step_ms_mean", "request_sample_stride", "policy_groups_simulated", "est_peak_memory_bytes", "sim_wall_s")

# The child: one replay into a temp dir, then the metrics we keep and the timeline's tail figure, as one JSON line.
CHILD = r"""
import json, sys, tempfile
import pandas as pd
import sim
args = json.loads(sys.argv[1])
with tempfile.TemporaryDirectory() as tmp:
    m = sim.replay(args["config"], out_dir=__import__("pathlib").Path(tmp) / "run")
    tl = pd.read_parquet(__import__("pathlib").Path(tmp) / "run" / "timeline.parquet", columns=["step_s", "tokens"])
half = tl.iloc[len(tl) // 2:]
busy = float(half["step_s"].sum())
out = {k: m.get(k) for k in args["keep"] if k in m}
out["tail_throughput_tok_s"] = float(half["tokens"].sum()) / busy if busy > 0 else None
out["tail_steps"] = int(len(half))
with open(args["result"], "w") as fh:
    json.dump(out, fh)
"""


# ----------------------------------------------------------------------------------------------- the grid
def run_key(hw: str, att: str, draft: int, system: str, cap: int) -> str:
    return f"{hw}-{att}-{'specon' if draft else 'specoff'}-{system}-c{cap}"


def config_of(hw: str, att: str, draft: int, system: str, cap: int, requests_per_cap: int,
              steps_on: int, steps_off: int, model: str = "glm-5") -> dict:
    """Pinned keys only (docs/architecture.md), plus the step bound."""
    wl = {"num_requests": 1 if cap == 1 else requests_per_cap * cap, "max_concurrency": cap, "seed": SEED,
          "max_steps": 0 if cap == 1 else (steps_on if draft else steps_off)}
    return {"system": system, "attention": att, "hardware": {"preset": hw, "num_gpus": 8},
            "model": {"preset": model}, "policy": "pb-lru", "cpu_storage": True,
            "spec": {"draft_tokens": draft}, "workload": wl}


def run_config(run: dict, args) -> dict:
    return config_of(run["hardware"], run["attention"], run["draft_tokens"], run["system"], run["cap"],
                     args.requests_per_cap, args.steps_on, args.steps_off, getattr(args, "model", "glm-5"))


def grid(caps=CAPS, b300_extra_caps=()) -> list[dict]:
    """Every run, most wanted first: caps 256 (admission) and 1 (TPOT) before 64 and 16 (then B300's extra caps)."""
    order = {256: 0, 1: 1, 64: 2, 16: 3}
    runs = [{"key": run_key(hw, att, d, s, c), "hardware": hw, "attention": att, "draft_tokens": d, "system": s,
             "cap": c} for hw in HARDWARE for att in ATTENTION for d in DRAFTS for s in SYSTEMS
            for c in (tuple(caps) + (tuple(b300_extra_caps) if hw == "b300" else ()))]
    return sorted(runs, key=lambda r: order.get(r["cap"], 9))


def mem_estimate_gb(run: dict, table: dict) -> float:
    """Memory estimate of a run from `--mem-gb system[-attention[-cCAP]]=GB,...` (most specific key wins)."""
    for key in (f"{run['system']}-{run['attention']}-c{run['cap']}", f"{run['system']}-{run['attention']}",
                run["system"], "default"):
        if key in table:
            return table[key]
    return 4.0


# ----------------------------------------------------------------------------------------------- records
def load_records(path: Path) -> dict:
    if not path.is_file():
        return {"meta": {}, "records": {}}
    data = json.loads(path.read_text())
    data.setdefault("records", {})
    return data


def save(path: Path, data: dict) -> None:
    """Rewrite the JSON (temp file + os.replace) and the markdown table beside it."""
    data["table"] = table_rows(data["records"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    md = path.with_suffix(".md")
    tmp = md.with_name(f".{md.name}.tmp")
    tmp.write_text(markdown(data))
    os.replace(tmp, md)


def todo(runs: list[dict], records: dict, config_for=None) -> list[dict]:
    """Runs without an ok record (resume); with `config_for(run)`, also those whose record ran another config."""
    def done(run):
        rec = records.get(run["key"], {})
        return rec.get("status") == "ok" and (config_for is None or rec.get("config") == config_for(run))
    return [r for r in runs if not done(r)]


# ----------------------------------------------------------------------------------------------- the table
def _num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def table_rows(records: dict) -> list[dict]:
    """One row per (config, system): peaks over the caps that ran ok, batch-1 TPOT, admission at cap 256."""
    rows = []
    for hw in HARDWARE:
        for att in ATTENTION:
            for d in DRAFTS:
                for s in SYSTEMS:
                    caps = CAPS + tuple(c for c in (512,) if records.get(run_key(hw, att, d, s, c)))
                    recs = {c: records.get(run_key(hw, att, d, s, c)) for c in caps}
                    ok = {c: r["metrics"] for c, r in recs.items() if r and r.get("status") == "ok"}
                    row = {"hardware": hw, "attention": att, "spec": "on" if d else "off", "system": s,
                           "caps_ok": sorted(ok), "caps_missing": [c for c in CAPS if c not in ok]}
                    for name in ("decode_throughput_tok_s", "tail_throughput_tok_s"):
                        vals = {c: _num(m.get(name)) for c, m in ok.items() if _num(m.get(name)) is not None}
                        best = max(vals, key=vals.get) if vals else None
                        row[f"peak_{name}"] = vals[best] if vals else None
                        row[f"peak_{name}_cap"] = best
                    best = row["peak_decode_throughput_tok_s_cap"]
                    steady = ok[best].get("steady_window_steps") if best is not None else None
                    row["peak_decode_steady_window_steps"] = steady  # None: the tree has no steady window
                    one, top = ok.get(1, {}), ok.get(256, {})
                    row["batch1_tpot_ms"] = _num(one.get("tpot_ms_mean"))
                    row["batch1_tpot_source"] = one.get("tpot_source", "whole run" if one else None)
                    row["admitted_at_cap256"] = _num(top.get("max_admitted_concurrency"))
                    rows.append(row)
    return rows


def _fmt(v, digits=0):
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def _commits(data: dict) -> str:
    """The call's commit, and those of records that earlier calls made."""
    main = data.get("meta", {}).get("commit", "?")
    extra = sorted({r.get("commit", "") for r in data.get("records", {}).values()} - {"", main})
    return main + (f"; some records from {', '.join(extra)}" if extra else "")


def _cap(cap) -> str:
    return "" if cap is None else f" ({cap})"


def markdown(data: dict) -> str:
    meta = data.get("meta", {})
    lines = [f"# Paper configs: {meta.get('label', '?')} (tree commit {_commits(data)})", "",
             f"{meta.get('date', '?')} · `{meta.get('command', '?')}` · {meta.get('machine', {})}", "",
             meta.get("definitions", ""), "",
             "| hw | attn | spec | system | peak decode tok/s (cap) | peak tail tok/s (cap) | batch-1 TPOT ms "
             "| admitted @256 | caps missing |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data.get("table", []):
        peak, tail = (_fmt(r[f"peak_{n}"]) + _cap(r[f"peak_{n}_cap"])
                      for n in ("decode_throughput_tok_s", "tail_throughput_tok_s"))
        peak += " †" if r.get("peak_decode_steady_window_steps") == 0 else ""
        lines.append(f"| {r['hardware']} | {r['attention']} | {r['spec']} | {r['system']} | {peak} | {tail} | "
                     f"{_fmt(r['batch1_tpot_ms'], 2)} | {_fmt(r['admitted_at_cap256'])} | "
                     f"{','.join(map(str, r['caps_missing']))} |")
    if any(r.get("peak_decode_steady_window_steps") == 0 for r in data.get("table", [])):
        lines += ["", "† the peak run had no steady window (nothing finished within its steps, or nothing waited): "
                  "its `decode_throughput_tok_s` is the whole-run figure."]
    bad = {k: v for k, v in data.get("records", {}).items() if v.get("status") != "ok"}
    if bad:
        lines += ["", "Runs without a result:", ""]
        lines += [f"- {k}: {v.get('status')} {v.get('error', '')}".rstrip() for k, v in sorted(bad.items())]
    return "\n".join(lines) + "\n"


def compare_markdown(a: dict, b: dict) -> str:
    """Two tables side by side: each cell `a → b`."""
    la, lb = a.get("meta", {}).get("label", "a"), b.get("meta", {}).get("label", "b")
    ca, cb = _commits(a), _commits(b)
    rows_b = {(r["hardware"], r["attention"], r["spec"], r["system"]): r for r in table_rows(b["records"])}
    lines = [f"# Paper configs: {la} ({ca}) → {lb} ({cb})", "",
             f"{la}: {a.get('meta', {}).get('definitions', '')}", "",
             f"{lb}: {b.get('meta', {}).get('definitions', '')}", "", "| hw | attn | spec | system | peak decode tok/s (cap) | peak tail tok/s (cap) | batch-1 TPOT ms "
             "| admitted @256 |", "|---|---|---|---|---|---|---|---|"]
    for ra in table_rows(a["records"]):
        rb = rows_b[(ra["hardware"], ra["attention"], ra["spec"], ra["system"])]
        cell = lambda n, d=0, cap=False: (  # noqa: E731
            f"{_fmt(ra[n], d)}{_cap(ra[n + '_cap']) if cap else ''} → {_fmt(rb[n], d)}"
            f"{_cap(rb[n + '_cap']) if cap else ''}")
        lines.append(f"| {ra['hardware']} | {ra['attention']} | {ra['spec']} | {ra['system']} | "
                     f"{cell('peak_decode_throughput_tok_s', cap=True)} | "
                     f"{cell('peak_tail_throughput_tok_s', cap=True)} | {cell('batch1_tpot_ms', 2)} | {cell('admitted_at_cap256')} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- running
def _rss_gb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 0.0


def _start(run: dict, tree: Path, cfg: dict, tmp: Path) -> dict:
    result = tmp / f"{run['key']}.json"
    log = open(tmp / f"{run['key']}.log", "w")
    extra = os.environ.get("PYTHONPATH", "")
    env = {**os.environ, "PYTHONPATH": str(tree) + (os.pathsep + extra if extra else ""), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "RAY_ADDRESS": ""}
    payload = json.dumps({"config": cfg, "keep": list(KEEP), "result": str(result)})
    proc = subprocess.Popen([sys.executable, "-c", CHILD, payload], cwd=tree, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    return {"run": run, "proc": proc, "log": log, "result": result, "t0": time.perf_counter(),
            "load_before": os.getloadavg(), "config": cfg, "killed": None}


def _finish(job: dict, status_ru) -> dict:
    status, ru = status_ru
    job["log"].close()
    wall = time.perf_counter() - job["t0"]
    rec = {"status": "ok", "config": job["config"], "wall_s": round(wall, 2),
           "cpu_s": round(ru.ru_utime + ru.ru_stime, 2), "peak_rss_gb": round(ru.ru_maxrss * 1024 / 1e9, 3),
           "load_avg_before": job["load_before"], "load_avg_after": os.getloadavg()}
    code = os.waitstatus_to_exitcode(status)
    if code == 0 and job["result"].is_file():
        rec["metrics"] = json.loads(job["result"].read_text())
        return rec
    tail = Path(job["log"].name).read_text(errors="replace").strip().splitlines()[-3:]
    why = job["killed"] or (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}")
    rec.update(status="error", error=why, log_tail=tail)
    return rec


def run_all(runs: list[dict], tree: Path, args, on_record) -> None:
    """Run `runs` `args.jobs` at a time within the memory budget; `on_record(key, record)` as each ends."""
    mem_table = {k: float(v) for k, v in (i.split("=") for i in args.mem_gb.split(",") if i)}
    queue, running, t_start = list(runs), [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="paper_configs_") as tmpdir:
        tmp = Path(tmpdir)
        while queue or running:
            late = time.perf_counter() - t_start > args.deadline_s
            for job in running:
                if late and job["killed"] is None:
                    job["killed"] = f"killed at the {args.deadline_s:.0f} s deadline of this call"
                    job["proc"].kill()
            if not late:
                used = sum(mem_estimate_gb(j["run"], mem_table) for j in running)
                for run in list(queue):
                    if len(running) >= args.jobs:
                        break
                    need = mem_estimate_gb(run, mem_table)
                    if used + need <= args.mem_budget_gb or not running:
                        queue.remove(run)
                        running.append(_start(run, tree, run_config(run, args), tmp))
                        used += need
            else:
                for run in queue:
                    on_record(run["key"], {"status": "not run", "error": "deadline reached before it started"})
                queue = []
            if running and mem_available_bytes() / 1e9 < args.mem_reserve_gb:
                victim = max((j for j in running if j["killed"] is None), key=lambda j: _rss_gb(j["proc"].pid),
                             default=None)
                if victim is not None:
                    victim["killed"] = (f"killed by this script: machine memory low ({mem_available_bytes() / 1e9:.1f} GB "
                                        f"available, RSS {_rss_gb(victim['proc'].pid):.1f} GB)")
                    victim["proc"].kill()
            for job in list(running):
                pid, status, ru = os.wait4(job["proc"].pid, os.WNOHANG)
                if pid:
                    job["proc"].returncode = os.waitstatus_to_exitcode(status)
                    running.remove(job)
                    on_record(job["run"]["key"], _finish(job, (status, ru)))
            time.sleep(0.3)


def _commit(tree: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    """Run the grid's missing records (or only rebuild the table), saving after each record."""
    ap = _parser()
    args = ap.parse_args(argv)
    tree = Path(args.tree).resolve()
    path = Path(args.out_dir) / f"paper_configs_{args.label}.json"
    data = load_records(path)
    if args.summarize:
        _summarize(args, path, data)
        return 0
    if args.mem_budget_gb is None:
        args.mem_budget_gb = 0.85 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    caps, extra = _checked(ap, args)
    parts = [p for p in args.filter.split(",") if p]
    runs = [r for r in todo(grid(caps, extra), data["records"], lambda r: run_config(r, args))
            if all(p in r["key"] for p in parts)]
    data["meta"] = _meta(args, argv, tree, data.get("meta") or {}, extra)
    print(f"{len(runs)} runs to do in {tree} ({args.jobs} at once, {args.mem_budget_gb:.0f} GB)", flush=True)

    def on_record(key: str, rec: dict) -> None:
        rec["commit"] = data["meta"]["commit"]  # records of earlier calls may come from other commits
        data["records"][key] = rec
        save(path, data)
        m = rec.get("metrics", {})
        print(f"{key:34s} {rec['status']:8s} {rec.get('wall_s', 0):7.1f} s {rec.get('cpu_s', 0):7.1f} cpu-s "
              f"{rec.get('peak_rss_gb', 0):6.2f} GB  tok/s {m.get('decode_throughput_tok_s', 0) or 0:9.0f} "
              f"adm {m.get('max_admitted_concurrency', '-')} {rec.get('error', '')}", flush=True)

    run_all(runs, tree, args, on_record)
    save(path, data)
    print(path.with_suffix(".md").read_text())
    return 0


def _parser() -> argparse.ArgumentParser:
    """The command line of this script."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", required=True, help="before | after | any name: paper_configs_<label>.json/.md")
    ap.add_argument("--tree", default=str(ROOT), help="checkout whose sim/ runs (default: this one)")
    ap.add_argument("--commit", default=None, help="the tree's commit (default: git rev-parse in --tree)")
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--only-caps", default="1,16,64,256")
    ap.add_argument("--b300-extra-caps", default="", help="caps run on B300 only, e.g. 512 (its larger HBM)")
    ap.add_argument("--model", default="glm-5", help="model preset of every run (the configs/paper-*.yaml: glm-5.2)")
    ap.add_argument("--filter", default="", help="run only keys containing each comma-separated part")
    ap.add_argument("--requests-per-cap", type=int, default=2)
    ap.add_argument("--steps-on", type=int, default=160, help="max_steps of caps > 1 with draft tokens")
    ap.add_argument("--steps-off", type=int, default=320, help="max_steps of caps > 1 without draft tokens")
    ap.add_argument("--mem-gb", default="sglang=1,hisparse=5,ulacache=6",
                    help="memory estimate per run, system[-attention[-cCAP]]=GB,...")
    ap.add_argument("--mem-budget-gb", type=float, default=None, help="default: 85%% of the machine")
    ap.add_argument("--mem-reserve-gb", type=float, default=6.0)
    ap.add_argument("--deadline-s", type=float, default=float("inf"))
    ap.add_argument("--summarize", action="store_true", help="only rebuild the table from the records")
    ap.add_argument("--compare", default=None, metavar="LABEL",
                    help="with --summarize: also write paper_configs_<LABEL>_vs_<label>.md, the two side by side")
    return ap


def _checked(ap: argparse.ArgumentParser, args) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The caps (--only-caps, --b300-extra-caps), after the counts are checked: a bad one is argparse's error and
    exit 2 before any run starts."""
    def caps(flag: str, text: str) -> tuple[int, ...]:
        try:
            out = tuple(int(c) for c in text.split(",") if c)
        except ValueError:
            out = (0,)
        if any(c < 1 for c in out):
            ap.error(f"{flag} takes comma-separated caps of at least 1, got {text!r}")
        return out

    for flag, value in (("--jobs", args.jobs), ("--requests-per-cap", args.requests_per_cap),
                        ("--steps-on", args.steps_on), ("--steps-off", args.steps_off)):
        if value < 1:
            ap.error(f"{flag} must be at least 1, got {value}")
    return caps("--only-caps", args.only_caps), caps("--b300-extra-caps", args.b300_extra_caps)


def _summarize(args, path: Path, data: dict) -> None:
    """Rewrite the table from the records (and, with --compare, the side-by-side table) and print them."""
    save(path, data)
    print(path.with_suffix(".md").read_text())
    if args.compare:
        other = load_records(Path(args.out_dir) / f"paper_configs_{args.compare}.json")
        out = Path(args.out_dir) / f"paper_configs_{args.compare}_vs_{args.label}.md"
        out.write_text(compare_markdown(other, data))
        print(out.read_text())


def _meta(args, argv, tree: Path, old: dict, extra: tuple) -> dict:
    """This call's provenance (the calls that wrote earlier records of the file kept, newest last), settings and
    definitions."""
    run_py = tree / "sim" / "run.py"
    has_steady = run_py.is_file() and "run_throughput_tok_s" in run_py.read_text()
    earlier = old.pop("earlier_calls", [])
    if old:  # the calls that wrote earlier records of this file, newest last
        earlier.append({k: old.get(k) for k in ("date", "command", "machine", "commit", "settings")})
    return {
        "earlier_calls": earlier,
        "label": args.label, "tree": str(tree), "commit": args.commit or _commit(tree),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv[:1], *(argv or sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "mem_total_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)},
        "settings": {"seed": SEED, "model": args.model, "b300_extra_caps": list(extra), "requests_per_cap": args.requests_per_cap, "steps_on": args.steps_on,
                     "steps_off": args.steps_off, "jobs": args.jobs, "mem_budget_gb": args.mem_budget_gb,
                     "mem_gb": args.mem_gb, "deadline_s": args.deadline_s},
        "tree_has_steady_metric": has_steady,
        "definitions": definitions(has_steady, args),
    }


def definitions(has_steady: bool, args) -> str:
    thr = ("`decode_throughput_tok_s` is the tree's steady-state figure (steps after the first completion while "
           "requests still wait; running concurrency held at the cap)" if has_steady else
           "`decode_throughput_tok_s` is this tree's only throughput figure: decoded tokens / busy time of every "
           "step run (warm-up included; the drain left out only by the step bound)")
    return (f"Peak decode tok/s: max over caps 1/16/64/256 of {thr}. Peak tail tok/s: the same max of tokens / busy "
            f"time over the second half of the steps each run ran (from its timeline; one definition for every "
            f"tree). Runs: cap 1 = 1 request to completion; cap C > 1 = {args.requests_per_cap}xC requests, cut at "
            f"{args.steps_on} steps with 4 draft tokens / {args.steps_off} without. Batch-1 TPOT: `tpot_ms_mean` of "
            f"the cap-1 run (1 request: its decode time / its output tokens). Admitted @256: "
            f"`max_admitted_concurrency` of the cap-256 run. Pinned keys only: {getattr(args, 'model', 'glm-5')}, 8 GPUs, pb-lru, "
            f"CPU storage, seed {SEED}.")


if __name__ == "__main__":
    sys.exit(main())
