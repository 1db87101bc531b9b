"""The report's figures. Each takes the prepared runs table (and the raw Results) and returns a `Figure`, or raises
`Skip` with the reason when its data is absent; nothing is ever plotted from numbers not found in result files."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from reports.frame import Skip, X, config_columns, facets, fact, fmt_value, need, pin, series_order  # noqa: E402

COLORS = {"sglang": "#1f77b4", "hisparse": "#ff7f0e", "ulacache": "#2ca02c", "ulacache (GPU+CPU)": "#2ca02c",
          "ulacache (GPU only)": "#9467bd", "pb-lru": "#2ca02c", "lru": "#8c564b"}


@dataclasses.dataclass
class Figure:
    key: str
    title: str
    png: str | None  # file name beside index.html
    caption: str
    table: pd.DataFrame | None = None


def _color(label: str, i: int) -> str:
    return COLORS.get(label, plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10])


def _grid(n: int, w: float = 5.2, h: float = 4.0):
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(w * cols, 6.5), h * rows + 0.6), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _save(fig, out_dir: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=100)
    plt.close(fig)
    return name


def _pins(notes: list[str]) -> str:
    return f" Fixed for this figure: {'; '.join(notes)}." if notes else ""


# ---------------------------------------------------------------------------------------------- 1. throughput
ADMITTED = "max_admitted_concurrency"


def _has(df, col: str) -> bool:
    return col in df.columns and df[col].notna().any()


def throughput_basis(df) -> str:
    """What `decode_throughput_tok_s` means in these results, for the captions: replays since issue 11 report the
    steady state (running concurrency held at the cap, warm-up and drain left out) beside the whole-run
    `run_throughput_tok_s`; older result files hold only the whole-run average under that name."""
    text = ("Throughput is the steady-state decode throughput (decode_throughput_tok_s: running concurrency held at "
            "the cap, warm-up and drain left out), not the whole-run average (run_throughput_tok_s).")
    if not _has(df, "run_throughput_tok_s"):
        return ("Throughput is decode_throughput_tok_s as these result files hold it; they predate the steady-state "
                "metric (no run_throughput_tok_s), so it is each run's whole-run average.")
    if "tpot_source" in df.columns:
        whole = int((df["tpot_source"] == "whole run").sum())
        if whole:
            text += (f" {whole} of {len(df)} runs had no steady window (every request admitted at once, none "
                     "refilled): their figure is the whole run's.")
    return text


def throughput_vs_concurrency(df, res, out_dir):
    need(df, [X, "decode_throughput_tok_s"], "throughput-vs-concurrency runs")
    sub, notes = pin(df, keep=(X, "system", "cpu_storage", "attention", "hardware.preset", "spec.draft_tokens",
                               "model.preset"), prefer={"policy": "pb-lru"})
    rings = _has(sub, ADMITTED)  # without the admitted concurrency the curve is drawn, the admission marks not
    groups = facets(sub)
    fig, axes = _grid(len(groups))
    for ax, (title, g) in zip(axes, groups):
        for i, label in enumerate(series_order(g["variant"])):
            rows = g[g["variant"] == label].groupby(X)
            s = (rows.agg(thr=("decode_throughput_tok_s", "mean"), adm=(ADMITTED, "max")) if rings
                 else rows.agg(thr=("decode_throughput_tok_s", "mean"))).reset_index()
            color = _color(label, i)
            ax.plot(s[X], s["thr"], "-o", color=color, label=label)
            capped = s[s["adm"] < s[X]] if rings else s.iloc[:0]
            if len(capped):
                ax.scatter(capped[X], capped["thr"], s=90, facecolors="none", edgecolors="red", zorder=4,
                           label="admission-limited" if i == 0 else None)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency cap (requests)")
        ax.set_ylabel("steady decode throughput (tokens/s)")
        ax.set_title(title or "all runs", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Steady-state decode throughput vs concurrency per system")
    png = _save(fig, out_dir, "throughput_vs_concurrency.png")
    marks = ("red rings mark caps the system could not admit (admitted concurrency below the cap)." if rings else
             f"admission limits are not marked: these results have no {ADMITTED} column.")
    return Figure("throughput", "Decode throughput vs concurrency", png,
                  "Mean decode throughput per concurrency cap (workload.max_concurrency); " + marks + " "
                  + throughput_basis(sub) + _pins(notes))


# ---------------------------------------------------------------------------------------------- 2. speedups
def peak_speedups(df, res, out_dir):
    need(df, ["decode_throughput_tok_s"], "throughput results")
    sub, notes = pin(df, keep=(X, "system", "cpu_storage", "attention", "hardware.preset", "spec.draft_tokens",
                               "model.preset"), prefer={"policy": "pb-lru"})
    rows = []
    for title, g in facets(sub):
        h = g[fact(g, "speedup_baseline")]
        ref = (h.groupby(X)["decode_throughput_tok_s"].mean() if X in h.columns else h["decode_throughput_tok_s"]).max()
        for label in series_order(g["variant"]):
            s = g[g["variant"] == label]
            if X in s.columns:  # mean over seeds/replicates per cap, then the best cap
                cols = [c for c in ("decode_throughput_tok_s", ADMITTED, "tpot_ms_p50") if c in s.columns]
                s = s.groupby(X, as_index=False)[cols].mean()
            best = s.loc[s["decode_throughput_tok_s"].idxmax()]
            rows.append({"setting": title, "system": label, "peak_tok_s": best["decode_throughput_tok_s"],
                         "at_concurrency_cap": best.get(X), "admitted": best.get(ADMITTED),
                         "tpot_ms_p50": best.get("tpot_ms_p50"),
                         "speedup_vs_hisparse": best["decode_throughput_tok_s"] / ref if ref and ref > 0 else None})
    table = pd.DataFrame(rows)
    if table["speedup_vs_hisparse"].isna().all():
        raise Skip("no HiSparse runs to compare against")
    settings = list(dict.fromkeys(table["setting"]))
    fig, axes = _grid(len(settings), w=5.0, h=3.8)
    for ax, setting in zip(axes, settings):
        t = table[table["setting"] == setting]
        bars = ax.bar(t["system"], t["peak_tok_s"], color=[_color(s, i) for i, s in enumerate(t["system"])],
                      label=[f"{s}" for s in t["system"]])
        for bar, sp in zip(bars, t["speedup_vs_hisparse"]):
            if sp is not None and not pd.isna(sp):
                ax.annotate(f"{sp:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                            va="bottom", fontsize=9)
        ax.set_ylabel("peak decode throughput (tokens/s)")
        ax.set_xlabel("system")
        ax.set_title(setting or "all runs", fontsize=10)
        ax.tick_params(axis="x", labelsize=8, rotation=15)
        ax.legend(fontsize=7)
        ax.margins(y=0.15)
    fig.suptitle("Peak steady-state decode throughput per system\n(bar labels: speedup over HiSparse)")
    png = _save(fig, out_dir, "peak_speedups.png")
    return Figure("speedups", "Peak-throughput speedups over HiSparse", png,
                  "Peak = the highest mean decode throughput over the concurrency caps run; speedup = peak / "
                  "HiSparse's peak in the same setting. " + throughput_basis(sub) + _pins(notes), table)


# ---------------------------------------------------------------------------------------------- 3. capacity
def capacity(df, res, out_dir):
    need(df, ["physical_kv_slots", "unique_history_positions", "max_admitted_concurrency"], "capacity metrics")
    sub, notes = pin(df, keep=(X, "system", "cpu_storage", "attention", "hardware.preset", "spec.draft_tokens",
                               "model.preset"), prefer={"policy": "pb-lru"})
    rows = []
    for title, g in facets(sub):
        top = g[X].max() if X in g.columns else None
        for label in series_order(g["variant"]):
            s = g[g["variant"] == label]
            s = s[s[X] == s[X].max()] if top is not None else s
            rows.append({"setting": title, "system": label, "physical": s["physical_kv_slots"].mean(),
                         "unique": s["unique_history_positions"].mean(),
                         "admitted": s["max_admitted_concurrency"].max(), "cap": s[X].max() if X in s else None})
    t = pd.DataFrame(rows)
    settings = list(dict.fromkeys(t["setting"]))
    fig, axes = plt.subplots(len(settings), 2, figsize=(12, 3.9 * len(settings) + 0.6), squeeze=False)
    for (ax1, ax2), setting in zip(axes, settings):
        f = t[t["setting"] == setting].reset_index(drop=True)
        xs = list(range(len(f)))
        ax1.bar([x - 0.2 for x in xs], f["physical"] / 1e6, width=0.4, color="#7f7f7f",
                label="physical KV slots (all tiers, replicas, buffers)")
        ax1.bar([x + 0.2 for x in xs], f["unique"] / 1e6, width=0.4, color="#2ca02c",
                label="unique history positions")
        for x, (p, u) in enumerate(zip(f["physical"], f["unique"])):
            if p > 0:
                ax1.annotate(f"{u / p:.0%} unique", (x, max(p, u) / 1e6), ha="center", va="bottom", fontsize=8)
        ax1.set_xticks(xs, f["system"], fontsize=8)
        ax1.set_ylabel("token slots at the peak (millions)")
        ax1.set_xlabel("system")
        ax1.set_title(f"Effective KV capacity vs physical slots ({setting})", fontsize=10)
        ax1.legend(fontsize=8, loc="upper left")
        ax1.set_ylim(0, max(f["physical"].max(), f["unique"].max()) / 1e6 * 1.45)
        ax2.bar(xs, f["admitted"], color=[_color(s, i) for i, s in enumerate(f["system"])],
                label="max admitted concurrency")
        ax2.hlines(f["cap"], [x - 0.4 for x in xs], [x + 0.4 for x in xs], colors="red", lw=2,
                   label="concurrency cap")
        ax2.set_xticks(xs, f["system"], fontsize=8)
        ax2.set_ylabel("requests running at once")
        ax2.set_xlabel("system")
        ax2.set_title(f"Admitted concurrency at the largest cap run ({setting})", fontsize=10)
        ax2.legend(fontsize=8, loc="upper left")
        ax2.set_ylim(0, max(f["cap"].max(), f["admitted"].max()) * 1.3)
    fig.suptitle("KV capacity: unique history vs physical slots, and admitted concurrency")
    png = _save(fig, out_dir, "capacity.png")
    return Figure("capacity", "Effective KV capacity and admitted concurrency", png,
                  "At each system's largest concurrency cap: physical token slots holding history KV at the peak "
                  "(every tier and rank, replicas and buffer copies included) vs distinct (request, position) pairs "
                  "stored, and the most requests admitted at once." + _pins(notes),
                  t.rename(columns={"physical": "physical_kv_slots", "unique": "unique_history_positions",
                                    "admitted": "max_admitted_concurrency", "cap": "concurrency_cap"}))


# ---------------------------------------------------------------------------------------------- 4. batch-1 TPOT
def batch1_tpot(df, res, out_dir):
    need(df, ["tpot_ms_p50"], "TPOT results")
    one = df[(df[X] == 1)] if X in df.columns else df.iloc[0:0]
    if one.empty and "max_admitted_concurrency" in df.columns:
        one = df[df["max_admitted_concurrency"] == 1]
    if one.empty:
        raise Skip("no runs at concurrency 1 (add workload.max_concurrency=1 to the grid)")
    sub, notes = pin(one, keep=(X, "system", "cpu_storage", "attention", "hardware.preset", "spec.draft_tokens",
                                "model.preset"), prefer={"policy": "pb-lru"})
    groups = facets(sub)
    fig, axes = _grid(len(groups), w=5.0, h=3.8)
    for ax, (title, g) in zip(axes, groups):
        labels = series_order(g["variant"])
        vals = [g[g["variant"] == lab]["tpot_ms_p50"].mean() for lab in labels]
        bars = ax.bar(labels, vals, color=[_color(s, i) for i, s in enumerate(labels)], label=labels)
        for bar, v in zip(bars, vals):
            ax.annotate(f"{v:.1f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=9)
        ax.set_ylabel("TPOT p50 at batch 1 (ms)")
        ax.set_xlabel("system")
        ax.set_title(title or "all runs", fontsize=10)
        ax.tick_params(axis="x", labelsize=8, rotation=15)
        ax.legend(fontsize=7)
        ax.margins(y=0.15)
    fig.suptitle("Batch-1 time per output token per system")
    png = _save(fig, out_dir, "batch1_tpot.png")
    return Figure("tpot1", "Batch-1 TPOT per system", png,
                  "Median time per output token with one request running (concurrency cap 1)." + _pins(notes))


# ---------------------------------------------------------------------------------------------- 4b. bytes/token
def transfer_bytes(df, res, out_dir):
    need(df, ["pcie_bytes_per_token", "nvlink_bytes_per_token"], "link traffic metrics")
    sub, notes = pin(df, keep=(X, "system", "cpu_storage", "attention", "hardware.preset", "spec.draft_tokens",
                               "model.preset"), prefer={"policy": "pb-lru"})
    groups = facets(sub)
    fig, axes = _grid(len(groups), w=5.4, h=3.9)
    for ax, (title, g) in zip(axes, groups):
        top = g[X].max() if X in g.columns else None
        labels = series_order(g["variant"])
        rows = [g[(g["variant"] == lab) & ((g[X] == g[g["variant"] == lab][X].max()) if top is not None else True)]
                for lab in labels]
        pcie = [r["pcie_bytes_per_token"].mean() / 1e6 for r in rows]
        nvl = [r["nvlink_bytes_per_token"].mean() / 1e6 for r in rows]
        xs = list(range(len(labels)))
        ax.bar([x - 0.2 for x in xs], pcie, width=0.4, label="PCIe (host <-> GPU)", color="#d62728")
        ax.bar([x + 0.2 for x in xs], nvl, width=0.4, label="NVLink (peer KV fetches + indexer all-gather)", color="#17becf")
        ax.set_xticks(xs, labels, fontsize=8, rotation=15)
        ax.set_xlabel("system (at its largest concurrency cap)")
        ax.set_ylabel("MB moved per decoded token")
        ax.set_title(title or "all runs", fontsize=10)
        top_mb = max([v for v in pcie + nvl if v == v] + [0.0])
        ax.set_ylim(0, top_mb * 1.45 if top_mb > 0 else 1.0)
        ax.legend(fontsize=8, loc="upper center")
    fig.suptitle("Link traffic per decoded token")
    png = _save(fig, out_dir, "transfer_bytes.png")
    return Figure("bytes", "PCIe and NVLink bytes per token", png,
                  "Bytes moved over each GPU's host link and NVLink per decoded token (all GPUs), at each system's "
                  "largest concurrency cap." + _pins(notes))


# ---------------------------------------------------------------------------------------------- 5. pb-lru vs lru
def policy_hit_rate(df, res, out_dir):
    need(df, ["gpu_hit_rate", "policy"], "GPU hit rates")
    u = df[fact(df, "configurable_policy") & df["policy"].isin(["pb-lru", "lru"])]
    others = [c for c in config_columns(u) if c != "policy"]
    if not u.empty:  # keep settings that were run under both policies
        key = pd.Series(["|".join(map(fmt_value, row)) for row in u[others].itertuples(index=False)],
                        index=u.index)
        u = u[u.groupby(key)["policy"].transform("nunique") == 2]
    if u.empty:
        raise Skip("needs ulacache runs with both policy=pb-lru and policy=lru under the same settings")
    # x axis: the concurrency cap or the GPU pool size, whichever the both-policy runs vary more
    choices = [(X, "concurrency cap (requests)", "concurrency_cap"),
               ("ulacache.gpu_pool_slots", "GPU pool size per rank (token slots)", "gpu_pool_slots")]
    choices = [c for c in choices if c[0] in u.columns]
    xkey, xlabel, xname = max(choices, key=lambda c: u[c[0]].nunique())
    u = u[u[xkey].notna()]
    sub, notes = pin(u, keep=(xkey, "policy", "attention", "hardware.preset", "spec.draft_tokens", "model.preset"),
                     prefer={"cpu_storage": True})
    groups = facets(sub)
    fig, axes = _grid(len(groups), w=max(5.4, 1.3 * sub[xkey].nunique() + 2), h=3.8)
    rows = []
    for ax, (title, g) in zip(axes, groups):
        p = g.groupby([xkey, "policy"])["gpu_hit_rate"].mean().unstack("policy")
        p = p.dropna() if {"pb-lru", "lru"} <= set(p.columns) else p.iloc[0:0]
        if p.empty:
            ax.set_visible(False)
            continue
        xs = range(len(p))
        for j, pol in enumerate(("pb-lru", "lru")):
            ax.bar([x + (j - 0.5) * 0.4 for x in xs], 100 * p[pol], width=0.4, label=pol, color=_color(pol, j))
        for x, (a, b) in enumerate(zip(p["pb-lru"], p["lru"])):
            ax.annotate(f"{100 * (a - b):+.2f} pt", (x, 100 * max(a, b)), ha="center", va="bottom", fontsize=8)
            rows.append({"setting": title, xname: p.index[x], "pb-lru_hit_pct": 100 * a,
                         "lru_hit_pct": 100 * b, "difference_pt": 100 * (a - b)})
        ax.set_xticks(list(xs), [str(int(v)) for v in p.index])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("GPU hit rate (%)")
        lo = 100 * min(p.min())
        ax.set_ylim(max(0, lo - 10), 104)
        ax.set_title(title or "ulacache", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    if not rows:
        raise Skip("no setting was run with both policies")
    fig.suptitle("GPU hit rate: bucketed PB-LRU vs exact LRU (ulacache)")
    png = _save(fig, out_dir, "policy_hit_rate.png")
    return Figure("policy", "GPU hit rate of pb-lru vs exact lru", png,
                  "Share of selected KV references found on the GPU, same workload and pool, per policy; labels give "
                  "PB-LRU minus LRU in percentage points." + _pins(notes), pd.DataFrame(rows))


# ---------------------------------------------------------------------------------------------- 6. miss-ratio curve
POOL_KEYS = (("ulacache.gpu_pool_slots", "GPU pool size per rank (token slots)", 1.0),
             ("memory.gpu_kv_bytes_per_gpu", "GPU KV budget per GPU (GB)", 1e-9))


def _sim_mrc(df):
    """The ulacache runs at two or more GPU pool sizes, pinned and faceted, with the pool key; or None."""
    if "gpu_hit_rate" not in df.columns or "system" not in df.columns or df["gpu_hit_rate"].isna().all():
        return None
    u = df[fact(df, "configurable_policy")]
    for key, xlabel, scale in POOL_KEYS:
        if key in u.columns and pd.to_numeric(u[key], errors="coerce").nunique() >= 2:
            break
    else:
        return None
    u = u[pd.to_numeric(u[key], errors="coerce").notna()].copy()
    u["pool"] = pd.to_numeric(u[key]) * scale
    top = u[X].max() if X in u.columns else None
    sub, notes = pin(u, keep=(key, "policy", "attention", "hardware.preset", "spec.draft_tokens", "model.preset"),
                     prefer={X: top, "cpu_storage": True})
    return facets(sub), xlabel, notes


def miss_ratio_curve(df, res, out_dir):
    from reports import policy_compare as pc

    sim = _sim_mrc(df)
    comps, _ = pc.find(res.root)
    if sim is None and not comps:
        raise Skip("needs ulacache runs at two or more GPU pool sizes (ulacache.gpu_pool_slots or "
                   "memory.gpu_kv_bytes_per_gpu), or a policy_compare table (ulacache policy-compare)")
    groups, xlabel, notes = sim if sim is not None else ([], "", [])
    fig, axes = _grid(len(groups) + len(comps), w=5.6, h=4.0)
    for ax, (title, g) in zip(axes, groups):
        for j, pol in enumerate(sorted(g["policy"].dropna().unique(), key=lambda p: p != "pb-lru")):
            s = g[g["policy"] == pol].groupby("pool")["gpu_hit_rate"].mean()
            ax.plot(s.index, 100 * (1 - s.values), "-o", label=pol, color=_color(pol, j))
        ax.set_xlabel(xlabel)
        ax.set_ylabel("GPU miss ratio (% of references)")
        ax.set_title(f"replays: {title or 'ulacache'}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    for ax, comp in zip(axes[len(groups):], comps):
        pc.draw(ax, comp)
    fig.suptitle("Miss-ratio curve over GPU pool size" + (": ours vs libCacheSim peers" if comps else " (ulacache)"))
    png = _save(fig, out_dir, "miss_ratio_curve.png")
    caption = []
    if groups:
        caption.append("Replays: 1 - GPU hit rate of the selected KV references as the GPU pool grows, CPU storage "
                       "holding the rest." + _pins(notes))
    if comps:
        caption.append("policy-compare panels: one layer group's deduplicated reference stream replayed through "
                       "our pb-lru and exact lru (solid) and libCacheSim's LRU, S3-FIFO, ARC (dashed) and Belady's "
                       "offline optimum (dotted), miss ratio after warm-up; the gap to Belady is the headroom no "
                       "online policy can exceed on these references. " + pc.notes(comps))
    else:
        caption.append("No policy_compare table under this directory: run `ulacache policy-compare TRACE --out DIR` "
                       "to add libCacheSim's peers.")
    return Figure("mrc", "Miss-ratio curve over GPU pool size", png, " ".join(caption),
                  pc.summary(comps) if comps else None)


# ---------------------------------------------------------------------------------------------- 7. sim vs hw
# `hw validate` writes per_step records with predicted_s / measured_s (management + transfer time of one step)
PAIRS = (("predicted_s", "measured_s", 1e6), ("predicted_us", "measured_us", 1.0), ("predicted_ms", "measured_ms",
                                                                                    1e3))


def _pairs(node):
    """Yield (predicted_us, measured_us, warmup) from every record in validate.json that holds both."""
    if isinstance(node, dict):
        for pk, mk, to_us in PAIRS:
            p, m = node.get(pk), node.get(mk)
            if isinstance(p, (int, float)) and isinstance(m, (int, float)) and not isinstance(p, bool):
                yield float(p) * to_us, float(m) * to_us, bool(node.get("warmup", False))
                return
        for v in node.values():
            if isinstance(v, (dict, list)):
                yield from _pairs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _pairs(v)


def _validation_label(v: dict) -> str:
    d = v["data"] if isinstance(v["data"], dict) else {}
    dev = d.get("device")
    dev = (dev.get("gpu") or dev.get("name")) if isinstance(dev, dict) else dev
    parts = [f"{d['mode']}" if d.get("mode") else None, f"{d['ranks']} ranks" if d.get("ranks") else None,
             str(dev) if dev else None]
    return ", ".join(p for p in parts if p) or v["_path"]


def sim_vs_hw(df, res, out_dir):
    rows = []
    for v in res.validations:
        label = _validation_label(v)
        rows += [{"file": v["_path"], "setting": label, "predicted_us": p, "measured_us": m, "warmup": w}
                 for p, m, w in _pairs(v["data"])]
    if not rows:
        raise Skip("no hw validate.json with predicted/measured pairs under this directory")
    t = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6.4, 5.8))
    for i, ((f, label), g) in enumerate(t.groupby(["file", "setting"], sort=False)):
        color = plt.rcParams["axes.prop_cycle"].by_key()["color"][i % 10]
        steady, warm = g[~g["warmup"]], g[g["warmup"]]
        ax.scatter(steady["measured_us"], steady["predicted_us"], alpha=0.7, s=18, color=color,
                   label=f"{label}: {f} ({len(steady)} steps)")
        if len(warm):
            ax.scatter(warm["measured_us"], warm["predicted_us"], s=30, facecolors="none", edgecolors=color,
                       label=f"{label}: warm-up steps (excluded from errors)")
    lo = min(t["measured_us"].min(), t["predicted_us"].min())
    hi = max(t["measured_us"].max(), t["predicted_us"].max())
    ax.plot([lo, hi], [lo, hi], "k--", label="y = x (perfect prediction)")
    if lo > 0:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("measured on the GPU (us per step)")
    ax.set_ylabel("simulator cost model (us per step)")
    ax.set_title("Simulator vs hardware: management + transfer time per step")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    png = _save(fig, out_dir, "sim_vs_hw.png")
    t["error_pct"] = 100 * (t["predicted_us"] - t["measured_us"]) / t["measured_us"]
    t = t[~t["warmup"]]
    summary = t.groupby(["file", "setting"], sort=False).agg(
        steps=("error_pct", "size"), median_abs_error_pct=("error_pct", lambda e: e.abs().median()),
        median_signed_error_pct=("error_pct", "median"), measured_median_us=("measured_us", "median"),
        predicted_median_us=("predicted_us", "median")).reset_index()
    return Figure("simhw", "Simulator vs hardware", png,
                  "Each point is one validated decode step replayed on the GPU host by `hw validate`: the "
                  "simulator's predicted management + transfer time (same formulas as the replay) vs the measured "
                  "time.", summary)


# ---------------------------------------------------------------------------------------------- 8. plans
def plans(df, res, out_dir):
    if not res.plans:
        raise Skip("no plan.json (run `ulacache plan ... --out DIR` inside this directory)")
    out = []
    for n, plan in enumerate(res.plans):
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
        slo = plan.get("slo_tpot_ms")
        rows = []
        for i, (name, entry) in enumerate(plan["systems"].items()):
            ev = [e for e in entry.get("evaluations", []) if e.get("ok")]
            ev.sort(key=lambda e: e["concurrency"])
            color = _color(name, i)
            ax.plot([e["concurrency"] for e in ev], [e["throughput_tok_s"] for e in ev], "-", color=color,
                    alpha=0.5)
            ok = [e for e in ev if slo is None or e["tpot_ms"] <= slo]
            bad = [e for e in ev if slo is not None and e["tpot_ms"] > slo]
            ax.scatter([e["concurrency"] for e in ok], [e["throughput_tok_s"] for e in ok], color=color,
                       label=f"{name}: meets SLO")
            ax.scatter([e["concurrency"] for e in bad], [e["throughput_tok_s"] for e in bad], facecolors="none",
                       edgecolors=color, label=f"{name}: misses SLO")
            if entry.get("slo_edge"):
                ax.axvspan(0.85, entry["slo_edge"], color=color, alpha=0.06)
            if entry.get("ceiling"):
                ax.axvline(entry["ceiling"], color=color, ls=":", label=f"{name}: admission ceiling "
                                                                        f"{entry['ceiling']}")
            best = entry.get("best")
            if best:
                ax.scatter([best["concurrency"]], [best["throughput_tok_s"]], marker="*", s=280, color=color,
                           edgecolors="black", zorder=5)
            rows.append({"system": name, "peak_tok_s": best["throughput_tok_s"] if best else None,
                         "at_cap": best["concurrency"] if best else None,
                         "admitted": best["admitted"] if best else None,
                         "tpot_ms": best["tpot_ms"] if best else None,
                         "speedup_vs_hisparse": entry.get("speedup_vs_hisparse"),
                         "replays": entry.get("num_replays"), "search_stop": entry.get("reason")})
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency cap (requests)")
        ax.set_ylabel("steady decode throughput (tokens/s)")
        ax.set_title(f"Plan: {plan.get('model')} on {plan.get('num_gpus')}x{plan.get('hardware')} "
                     f"({plan.get('attention')}), {plan.get('slo_metric')} <= {slo} ms\n"
                     "shaded: caps meeting the SLO; star: chosen point", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        png = _save(fig, out_dir, f"plan_{n}.png")
        out.append(Figure(f"plan{n}", f"Capacity plan ({plan['_path']})", png,
                          "Concurrency caps the search evaluated (real replays), whether each met the TPOT SLO, "
                          "and the chosen peak per system. Throughput is each replay's decode_throughput_tok_s (the "
                          "steady-state figure in replays since issue 11; the whole-run average in older ones).",
                          pd.DataFrame(rows)))
    return out


ALL = (throughput_vs_concurrency, peak_speedups, capacity, batch1_tpot, transfer_bytes, policy_hit_rate,
       miss_ratio_curve, sim_vs_hw, plans)
