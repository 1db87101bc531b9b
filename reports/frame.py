"""Shape the runs table for figures: numeric metrics, facets, series labels, and pinning of un-plotted keys.

A figure shows a few keys (x, series, facets); every other config key that varies among its rows is pinned to one
value (the most frequent; ties go to the default, i.e. empty, then the smallest) so no line mixes, e.g., GPU pool
sizes; seeds are averaged over instead. Config columns are the dotted names (`hardware.preset`) plus system/attention/policy/cpu_storage; metric
columns have no dot.
"""
from __future__ import annotations

import pandas as pd

X = "workload.max_concurrency"
REPLICATE_KEYS = ("workload.seed",)  # averaged over, never pinned
SYSTEM_ORDER = ("sglang", "hisparse", "ulacache")
CONFIG_TOP = ("system", "attention", "policy", "cpu_storage")
FACET_KEYS = ("attention", "hardware.preset", "spec_on", "model.preset")
NUMERIC = ("decode_throughput_tok_s", "tpot_ms_p50", "tpot_ms_mean", "gpu_hit_rate", "max_admitted_concurrency",
           "physical_kv_slots", "unique_history_positions", "pcie_bytes_per_token", "nvlink_bytes_per_token",
           "completed_requests", "num_requests", X, "ulacache.gpu_pool_slots", "spec.draft_tokens")


# What the simulator records of each system (metrics.json, from its System class) and reports select on, never a
# system's name. Result files written before it recorded them lack the columns (or, mixed with newer ones, hold
# blanks): their rows take what those three systems were then. The only place reports map names to facts.
FACTS_BEFORE_RECORDED = {
    "configurable_policy": {"sglang": False, "hisparse": False, "ulacache": True},
    "speedup_baseline": {"sglang": False, "hisparse": True, "ulacache": False},
}


def fact(df: pd.DataFrame, col: str) -> pd.Series:
    """Boolean column `col` of the runs (a System fact the simulator records); rows without it (older result files)
    take FACTS_BEFORE_RECORDED by their system, unknown systems False."""
    legacy = df["system"].map(FACTS_BEFORE_RECORDED[col]) if "system" in df.columns else pd.Series(None, df.index)
    recorded = df[col] if col in df.columns else pd.Series(None, index=df.index, dtype=object)
    values = recorded.where(recorded.notna(), legacy)
    return values.map(lambda v: v is True or (isinstance(v, (bool, int)) and bool(v)) or str(v).lower() == "true")


class Skip(Exception):
    """A figure whose data is absent; the message goes into the HTML in its place."""


def prepare(runs: pd.DataFrame) -> pd.DataFrame:
    """ok rows only, numeric metric columns, `spec_on` and `variant` columns added."""
    if runs.empty or "system" not in runs.columns:
        return pd.DataFrame()
    df = runs.copy()
    if "status" in df.columns:
        df = df[df["status"].fillna("ok") == "ok"]
    for col in NUMERIC:
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    if "spec.draft_tokens" in df.columns:
        df["spec_on"] = df["spec.draft_tokens"].map(
            lambda v: None if pd.isna(v) else ("spec on" if v > 0 else "spec off"))
    df["variant"] = [_variant(r) for r in df.to_dict("records")]
    return df.reset_index(drop=True)


def _variant(row: dict) -> str:
    """System label; a system that `cpu_storage` applies to (scope_of: ulacache) adds its setting (policy is shown
    in its own figure)."""
    system = str(row.get("system"))
    if scope_of("cpu_storage") != system:
        return system
    cpu = row.get("cpu_storage")
    if cpu is None or (isinstance(cpu, float) and pd.isna(cpu)):
        return system
    cpu = cpu if isinstance(cpu, bool) else str(cpu).lower() == "true"
    return f"ulacache ({'GPU+CPU' if cpu else 'GPU only'})"


def series_order(labels) -> list[str]:
    def key(label: str):
        base = label.split(" ")[0]
        return (SYSTEM_ORDER.index(base) if base in SYSTEM_ORDER else len(SYSTEM_ORDER), label)

    return sorted(set(labels), key=key)


def config_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if ("." in c or c in CONFIG_TOP) and c != "point_dir"]


def fmt_value(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "default"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def pin(df: pd.DataFrame, keep: tuple, prefer: dict | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Fix every varying config column not in `keep` to one value; returns the rows left and notes."""
    notes = []
    prefer = prefer or {}
    for col in config_columns(df):
        if col in keep or col in REPLICATE_KEYS or col not in df.columns or df.empty:
            continue
        owner = scope_of(col)
        applies = (df["system"] == owner) if owner and "system" in df.columns else pd.Series(True, index=df.index)
        values = df[col].astype("object").where(df[col].notna(), None).map(fmt_value)
        counts = values[applies].value_counts()
        if len(counts) <= 1:
            continue
        if col in prefer and fmt_value(prefer[col]) in counts.index:
            chosen = fmt_value(prefer[col])
        else:
            top = counts[counts == counts.max()].index
            chosen = sorted(top, key=lambda s: (s != "default", _num_or_inf(s), s))[0]
        df = df[~applies | (values == chosen)]
        notes.append(f"{col} = {chosen}" + (f" ({owner})" if owner else ""))
    return df, notes


def scope_of(col: str) -> str | None:
    """The system a config key applies to (None: all); other systems' rows are never filtered on it."""
    if col in ("policy", "cpu_storage") or col.startswith("ulacache."):
        return "ulacache"
    if col.startswith("hisparse."):
        return "hisparse"
    return None


def _num_or_inf(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("inf")


def facets(df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Split by the facet keys that vary (DP/TP, H200/B300, spec on/off, model); one facet when none vary."""
    keys = [k for k in FACET_KEYS if k in df.columns and df[k].nunique(dropna=True) > 1]
    if not keys:
        return [(_facet_title(df), df)]
    out = []
    for values, group in df.groupby(keys, dropna=False, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        out.append((", ".join(fmt_value(v) for v in values), group))
    return out


def _facet_title(df: pd.DataFrame) -> str:
    parts = [str(df[k].dropna().iloc[0]) for k in FACET_KEYS if k in df.columns and df[k].notna().any()]
    return ", ".join(parts)


def need(df: pd.DataFrame, cols, what: str) -> None:
    missing = [c for c in cols if c not in df.columns or df[c].isna().all()]
    if df.empty or missing:
        raise Skip(f"no {what} found" + (f" (missing: {', '.join(missing)})" if missing else ""))
