"""Assemble the static report: run every figure, write PNGs and one `index.html` beside them."""
from __future__ import annotations

import datetime as dt
import html
from pathlib import Path

import pandas as pd

from reports import policy_compare, tornado
from reports.collect import Results, collect
from reports.figures import ALL, Figure
from reports.frame import Skip, prepare

TITLES = {"throughput_vs_concurrency": "Decode throughput vs concurrency",
          "peak_speedups": "Peak-throughput speedups over HiSparse",
          "capacity": "Effective KV capacity and admitted concurrency", "batch1_tpot": "Batch-1 TPOT per system",
          "transfer_bytes": "PCIe and NVLink bytes per token",
          "policy_hit_rate": "GPU hit rate of pb-lru vs exact lru",
          "miss_ratio_curve": "Miss-ratio curve over GPU pool size", "sim_vs_hw": "Simulator vs hardware",
          "plans": "Capacity plans"}
CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
img{max-width:100%;border:1px solid #ddd}table{border-collapse:collapse;font-size:13px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}
.skip{color:#a60;background:#fff8e6;padding:.5em;border-left:4px solid #e9a400}.cap{color:#555;font-size:14px}
code{background:#f4f4f4;padding:0 3px}"""


def _table(df: pd.DataFrame) -> str:
    def fmt(v):
        if isinstance(v, float):
            if pd.isna(v):
                return "-"
            if v.is_integer():
                return f"{int(v):,}"
            return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    return df.to_html(index=False, escape=True, formatters={c: fmt for c in df.columns}, border=0)


def build_report(result_dir, out_dir=None) -> Path:
    """Read every result file under `result_dir`; write figures and index.html to `out_dir`
    (default: RESULT_DIR/report); returns the index.html path."""
    res = _collect(result_dir)
    out = Path(out_dir) if out_dir is not None else Path(result_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    df = prepare(res.runs)
    sections = []
    for fn in ALL:
        try:
            made = fn(df, res, out)
        except (Skip, KeyError) as exc:  # KeyError: a column these result files lack (older or hand-made tables)
            name = TITLES.get(fn.__name__, fn.__name__.replace("_", " "))
            why = str(exc) if isinstance(exc, Skip) else f"the result files lack {exc}"
            sections.append(f'<h2>{html.escape(name)}</h2><p class="skip">Skipped: {html.escape(why)}.</p>')
            continue
        for fig in made if isinstance(made, list) else [made]:
            sections.append(_section(fig))
    for i, d in enumerate(tornado.find(res.root)[0]):  # `ulacache sensitivity` tables: tornado figures
        sections.append(_tornado_section(d, res.root, out, i))
    n_ok = int((res.runs.get("status", pd.Series(dtype=str)).fillna("ok") == "ok").sum()) if len(res.runs) else 0
    n_err = len(res.runs) - n_ok
    head = (f"<h1>UlaCache report</h1><p class='cap'>Built {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC} "
            f"from <code>{html.escape(str(Path(result_dir).resolve()))}</code>: {len(res.runs)} replay runs "
            f"({n_ok} ok, {n_err} failed), {len(res.plans)} plans, {len(res.validations)} hw validations. "
            "Every number below comes from these result files.</p>")
    errors = ""
    if n_err:
        bad = res.runs[res.runs["status"] != "ok"]
        cols = [c for c in ("source", "point_id", "system", "error") if c in bad.columns]
        errors = "<h2>Failed runs</h2>" + _table(bad[cols].head(50))
    files = "".join(f"<li><code>{html.escape(s)}</code></li>" for s in res.sources[:200])
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in res.notes)
    tail = f"<h2>Result files read</h2><ul>{files}</ul>" + (f"<h3>Not readable</h3><ul>{notes}</ul>" if notes else "")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>UlaCache report</title><style>{CSS}</style>"
            f"</head><body>{head}{''.join(sections)}{errors}{tail}</body></html>")
    index = out / "index.html"
    tmp = out / ".index.html.tmp"
    tmp.write_text(page)
    tmp.replace(index)
    return index


def _collect(result_dir) -> Results:
    """collect(), plus the policy_compare tables (a dir may hold only those)."""
    try:
        res = collect(result_dir)
    except ValueError:
        root = Path(result_dir)
        if not root.is_dir() or not (policy_compare.find(root)[0] or tornado.find(root)[0]):
            raise
        res = Results(root, pd.DataFrame(), [], [], [], [])
    comps, notes = policy_compare.find(res.root)
    res.sources += [c.path for c in comps]
    res.notes += notes
    dirs, notes = tornado.find(res.root)
    res.sources += [str(d.relative_to(res.root)) for d in dirs]
    res.notes += notes
    return res


def _tornado_section(d: Path, root: Path, out: Path, i: int) -> str:
    """One `ulacache sensitivity` table as a tornado figure + its ranked table."""
    png = f"tornado_{i}.png"
    table = tornado.draw(d, out / png).reset_index(names="constant")
    rel = str(d.relative_to(root)) or "."
    cap = (f"From {rel}/sensitivity.*: each assumed constant of docs/cost-model.md replayed at 0.5x and 1.5x; bars are "
           "the % change of peak decode throughput, TPOT and admitted concurrency against the unperturbed replay.")
    return _section(Figure(f"tornado_{i}", f"Sensitivity to assumed constants ({rel})", png, cap, table))


def _section(fig: Figure) -> str:
    img = f'<img src="{html.escape(fig.png)}" alt="{html.escape(fig.title)}">' if fig.png else ""
    table = _table(fig.table) if fig.table is not None and len(fig.table) else ""
    return f"<h2>{html.escape(fig.title)}</h2>{img}<p class='cap'>{html.escape(fig.caption)}</p>{table}"
