"""Tornado figure of a `ulacache sensitivity` table: for each assumed constant (sorted by the largest change it
causes in any of the three figures), bars from its 0.5x to its 1.5x change of throughput, TPOT and admitted concurrency. Reads result files
only (`sensitivity.parquet` or `.csv`, and `sensitivity.json` for the base figures)."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

TABLE, CSV, META = "sensitivity.parquet", "sensitivity.csv", "sensitivity.json"
PANELS = (("d_throughput_tok_s_pct", "peak throughput"), ("d_tpot_ms_pct", "TPOT"),
          ("d_admitted_pct", "admitted concurrency"))
NEED = {"constant", "factor"} | {c for c, _ in PANELS}


def find(root: Path) -> tuple[list[Path], list[str]]:
    """Directories under `root` holding a sensitivity table (parquet preferred, else csv), and notes on bad ones."""
    root = Path(root)
    dirs = sorted({p.parent for p in root.rglob(TABLE)} | {p.parent for p in root.rglob(CSV)})
    found, notes = [], []
    for d in dirs:
        try:
            load(d)
            found.append(d)
        except (OSError, ValueError) as exc:
            notes.append(f"{d.relative_to(root)}: unreadable sensitivity table ({exc})")
    return found, notes


def load(d: Path) -> tuple[pd.DataFrame, dict]:
    d = Path(d)
    path = d / TABLE if (d / TABLE).exists() else d / CSV
    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    except Exception as exc:  # noqa: BLE001 - any unreadable table is one error line
        raise ValueError(f"{path.name}: {type(exc).__name__}") from None
    missing = NEED - set(df.columns)
    if missing:
        raise ValueError(f"{path.name} lacks column {sorted(missing)[0]!r}")
    try:
        meta = json.loads((d / META).read_text()) if (d / META).exists() else {}
    except (OSError, ValueError):
        meta = {}
    return df, meta if isinstance(meta, dict) else {}


def ranked(df: pd.DataFrame) -> pd.DataFrame:
    """One row per constant: low (0.5x) and high (1.5x) change of each metric, the largest change in any first."""
    lo = df[df["factor"] < 1].set_index("constant")
    hi = df[df["factor"] > 1].set_index("constant")
    out = pd.DataFrame(index=sorted(set(lo.index) | set(hi.index)))
    for col, _ in PANELS:
        out[f"{col}_low"] = lo[col].reindex(out.index)
        out[f"{col}_high"] = hi[col].reindex(out.index)
    span = out[[f"{c}_{s}" for c, _ in PANELS for s in ("low", "high")]].abs().max(axis=1)
    thr = out[["d_throughput_tok_s_pct_low", "d_throughput_tok_s_pct_high"]].abs().max(axis=1)
    return out.assign(_thr=thr, _span=span).sort_values(["_span", "_thr"], ascending=False).drop(
        columns=["_thr", "_span"])


def draw(d: Path, out_png: Path, title: str | None = None) -> pd.DataFrame:
    """Draw the tornado of the table in `d` to `out_png`; returns the ranked table it shows."""
    df, meta = load(d)
    r = ranked(df)
    n = len(r)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 0.42 * n + 1.6), sharey=True)
    y = list(range(n))[::-1]
    for ax, (col, label) in zip(axes, PANELS):
        low, high = r[f"{col}_low"].fillna(0.0), r[f"{col}_high"].fillna(0.0)
        ax.barh(y, low.values, color="#1f77b4", height=0.7, label="0.5x")
        ax.barh(y, high.values, color="#d62728", height=0.7, alpha=0.75, label="1.5x")
        ax.axvline(0, color="#333", lw=0.8)
        ax.set_xlabel(f"change of {label} (%)")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y)
    axes[0].set_yticklabels(r.index)
    axes[0].legend(loc="lower right", fontsize=8)
    base = meta.get("base") or {}
    cfg = meta.get("config") or {}
    sub = ", ".join(str(cfg.get(k)) for k in ("system", "attention") if cfg.get(k)) or Path(d).name
    if base:
        sub += (f" -- base {base.get('throughput_tok_s', 0):,.0f} tok/s, TPOT {base.get('tpot_ms', 0):.2f} ms, "
                f"admitted {base.get('admitted', 0):.0f}")
    fig.suptitle(title or f"Sensitivity to assumed constants (+-50%): {sub}", fontsize=11)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return r


def main(argv: list[str] | None = None) -> int:
    """python -m reports.tornado DIR [OUT.png]: draw the tornado of DIR's sensitivity table."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m reports.tornado DIR [OUT.png]", file=sys.stderr)
        return 2
    d = Path(args[0])
    out = Path(args[1]) if len(args) > 1 else d / "tornado.png"
    try:
        draw(d, out)
    except (OSError, ValueError) as exc:
        print(f"ulacache: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
