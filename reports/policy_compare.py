"""`policy_compare.*` tables (written by `ulacache policy-compare`): found under a result dir, drawn as miss-ratio
curves of our policies and libCacheSim's peers over GPU pool size. Reads result files only (pandas, json)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

TABLE, CSV, META = "policy_compare.parquet", "policy_compare.csv", "policy_compare.json"
ORDER = ("pb-lru", "lru", "lcs-lru", "lcs-s3fifo", "lcs-arc", "belady")
STYLE = {"pb-lru": ("#2ca02c", "-", "o"), "lru": ("#8c564b", "-", "s"), "lcs-lru": ("#8c564b", "--", "x"),
         "lcs-s3fifo": ("#1f77b4", "--", "^"), "lcs-arc": ("#9467bd", "--", "v"), "belady": ("#000000", ":", "*")}
LABEL = {"pb-lru": "pb-lru (ours)", "lru": "lru (ours, exact)", "lcs-lru": "LRU (libCacheSim)",
         "lcs-s3fifo": "S3-FIFO (libCacheSim)", "lcs-arc": "ARC (libCacheSim)",
         "belady": "Belady offline optimum (libCacheSim)"}


@dataclasses.dataclass
class Comparison:
    path: str  # table file, relative to the result dir
    table: pd.DataFrame  # policy, implementation, gpu_slots, hits, refs, hit_ratio, miss_ratio
    meta: dict  # policy_compare.json (empty when absent or unreadable)

    @property
    def peers_absent(self) -> bool:
        return "libcachesim" not in set(self.table["implementation"])

    @property
    def title(self) -> str:
        m = self.meta
        bits = [f"group {m['group']}" if "group" in m else None,
                f"{m['num_requests']} requests at concurrency {m['concurrency']}" if "num_requests" in m else None,
                f"{m['num_steps']} steps, {m['warmup_steps']} warm-up" if "num_steps" in m else None]
        return f"policy-compare: {self.path}\n" + ", ".join(b for b in bits if b)


def find(root: Path) -> tuple[list[Comparison], list[str]]:
    """Every policy_compare table under `root` (parquet, else the csv beside it) and notes on unreadable ones;
    hidden dirs (outputs still being written or replaced) are skipped."""
    root = Path(root)
    found, notes = [], []

    def visible(p: Path) -> bool:
        return not any(part.startswith(".") for part in p.relative_to(root).parts[:-1])

    dirs = sorted({p.parent for name in (TABLE, CSV) for p in root.rglob(name) if visible(p)})
    for d in dirs:
        df = None
        for path in (d / TABLE, d / CSV):
            if not path.exists():
                continue
            try:
                df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
                missing = {"policy", "implementation", "gpu_slots", "hit_ratio"} - set(df.columns)
                if missing:
                    raise ValueError(f"missing columns {sorted(missing)}")
                rel = str(path.relative_to(root))
                break
            except Exception as exc:  # noqa: BLE001 - a broken file is reported; the other format may serve
                notes.append(f"{path.relative_to(root)}: unreadable policy_compare table ({type(exc).__name__})")
                df = None
        if df is None:
            continue
        try:
            meta = json.loads((d / META).read_text()) if (d / META).exists() else {}
            meta = meta if isinstance(meta, dict) else {}
        except (OSError, ValueError):
            meta = {}
            notes.append(f"{(d / META).relative_to(root)}: unreadable")
        found.append(Comparison(rel, df, meta))
    return found, notes


def draw(ax, comp: Comparison) -> None:
    """Miss ratio (%) over GPU pool size, one line per policy: ours solid, libCacheSim dashed, Belady dotted."""
    t = comp.table
    known = [p for p in ORDER if p in set(t["policy"])] + sorted(set(t["policy"]) - set(ORDER))
    for i, pol in enumerate(known):
        s = t[t["policy"] == pol].sort_values("gpu_slots")
        color, ls, marker = STYLE.get(pol, (f"C{i}", "-.", "d"))
        ax.plot(s["gpu_slots"], 100 * (1 - s["hit_ratio"]), ls=ls, marker=marker, color=color,
                label=LABEL.get(pol, pol))
    ax.set_xlabel("GPU pool size (token slots of one layer group)")
    ax.set_ylabel("miss ratio (% of distinct references)")
    ax.set_title(comp.title + ("\nlibCacheSim absent: ours only" if comp.peers_absent else ""), fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)


def summary(comps: list[Comparison]) -> pd.DataFrame:
    """Hit ratio (%) per (table, policy) with one column per GPU pool size."""
    rows = []
    for c in comps:
        p = c.table.pivot_table(index="policy", columns="gpu_slots", values="hit_ratio", aggfunc="mean")
        p = p.reindex([x for x in ORDER if x in p.index] + sorted(set(p.index) - set(ORDER)))
        for pol, vals in p.iterrows():
            rows.append({"table": c.path, "policy": pol,
                         **{f"hit % @ {int(k):,} slots": 100 * v for k, v in vals.items()}})
    return pd.DataFrame(rows)


def notes(comps: list[Comparison]) -> str:
    """Caption sentences: where peers were absent, and how far our exact lru sits from libCacheSim's LRU."""
    out = []
    for c in comps:
        if c.peers_absent:
            why = c.meta.get("note") or "libcachesim was not installed when it was made"
            out.append(f"{c.path}: no libCacheSim curves ({why}).")
        gap = c.meta.get("lru_vs_libcachesim_lru")
        if isinstance(gap, dict) and gap:
            pts = ", ".join(f"{int(k):,}: {v.get('hit_ratio_gap_points', float('nan')):+.2f}"
                            for k, v in gap.items() if isinstance(v, dict))
            out.append(f"{c.path}: our exact lru minus libCacheSim LRU, hit-ratio points per pool size ({pts}); "
                       "the gap is the batch semantics (one batch resident as a unit, ties by GPU slot) vs a "
                       "sequential feed.")
    return " ".join(out)
