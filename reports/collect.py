"""Find and load result files under a directory: sweep tables, replay metrics.json, plan.json, hw validate.json.

Only pandas and the standard library: reports read what the tools wrote and never re-run or import them.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pandas as pd

SWEEP_TABLE = "results.parquet"
SWEEP_CSV = "results.csv"


@dataclasses.dataclass
class Results:
    root: Path
    runs: pd.DataFrame  # one row per replay: metrics + config columns (dotted names), `source`, `status`
    plans: list[dict]  # plan.json contents (+ "_path")
    validations: list[dict]  # validate.json contents (+ "_path")
    sources: list[str]  # files read, relative to root
    notes: list[str]  # files found but not readable


def _read_json(path: Path):
    with open(path) as fh:
        return json.load(fh)


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        elif isinstance(value, (list, tuple)):
            out[f"{prefix}{key}"] = json.dumps(value)
        else:
            out[f"{prefix}{key}"] = value
    return out


def _scalar(text: str):
    text = text.strip()
    if text in ("null", "~", ""):
        return None
    if text in ("true", "false"):
        return text == "true"
    if text[:1] in "'\"" and text[-1:] == text[:1]:
        return text[1:-1]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_config_yaml(path: Path) -> dict:
    """Flat {dotted.key: scalar} from the block-style mapping a replay writes as config.yaml (yaml.safe_dump of
    nested dicts of scalars). Only that subset is read (reports import no YAML library); lists and anything else
    are skipped, so a value is either read exactly or absent."""
    out, stack = {}, []  # stack of (indent, key)
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "- ")):
            continue
        indent = len(line) - len(line.lstrip(" "))
        key, sep, rest = line.strip().partition(":")
        if not sep or (rest and not rest.startswith(" ")):
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        name = ".".join([k for _, k in stack] + [key.strip()])
        rest = rest.strip()
        if rest == "":
            stack.append((indent, key.strip()))
        elif not rest.startswith(("[", "{", "|", ">", "&", "*", "!")):
            out[name] = _scalar(rest)
    return out


# metrics.json keys that repeat a config key under another name
METRIC_TO_CONFIG = {"hardware": "hardware.preset", "model": "model.preset", "draft_tokens": "spec.draft_tokens",
                    "num_gpus": "hardware.num_gpus"}


def _replay_row(metrics_path: Path) -> dict:
    """A standalone replay dir: metrics.json, plus the config it ran (config.yaml / config.json) flattened."""
    metrics = _read_json(metrics_path)
    if not isinstance(metrics, dict):
        raise ValueError("metrics.json is not an object")
    row = {}
    if (metrics_path.parent / "config.yaml").exists():
        row.update(read_config_yaml(metrics_path.parent / "config.yaml"))
    if (metrics_path.parent / "config.json").exists():
        row.update(_flatten(_read_json(metrics_path.parent / "config.json")))
    for key, dotted in METRIC_TO_CONFIG.items():
        if key in metrics and dotted not in row and not isinstance(metrics[key], (dict, list)):
            row[dotted] = metrics[key]
    row.update({k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in metrics.items()
                if k not in row})
    row.setdefault("status", "ok")
    return row


MANIFEST_SUFFIX = ".ulacache-manifest.json"  # the manifests beside outputs (traces.atomic): not result files


def _in_temporary(rel: Path) -> bool:
    """A path inside a hidden `.NAME.tmp-*` / `.NAME.old-*` dir: an output being written or replaced."""
    return any(part.startswith(".") and (".tmp-" in part or ".old-" in part) for part in rel.parts[:-1])


def _under(path: Path, dirs: list[Path]) -> bool:
    return any(d == path or d in path.parents for d in dirs)


def _num(value, lo: float, what: str, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
        value > lo if strict else value >= lo)
    if not ok:
        raise ValueError(f"{what} must be a finite number {'>' if strict else '>='} {lo:g}, got {value!r}")


def check_plan(plan) -> None:
    """The fields of a plan.json the report draws (a hand-edited or truncated file is a note, not a traceback)."""
    if not isinstance(plan, dict) or not isinstance(plan.get("systems"), dict):
        raise ValueError("no 'systems' mapping")
    if plan.get("slo_tpot_ms") is not None:
        _num(plan["slo_tpot_ms"], 0, "slo_tpot_ms", strict=True)
    for name, entry in plan["systems"].items():
        if not isinstance(entry, dict):
            raise ValueError(f"systems.{name} is not a mapping")
        evals = entry.get("evaluations", [])
        if not isinstance(evals, list) or not all(isinstance(e, dict) for e in evals):
            raise ValueError(f"systems.{name}.evaluations is not a list of mappings")
        points = [e for e in evals if e.get("ok")]
        best = entry.get("best")
        if best is not None:
            if not isinstance(best, dict):
                raise ValueError(f"systems.{name}.best is not a mapping")
            points.append(best)
            _num(best.get("admitted"), 0, f"systems.{name}.best.admitted")
        for e in points:
            _num(e.get("concurrency"), 1, f"systems.{name}: concurrency")
            _num(e.get("throughput_tok_s"), 0, f"systems.{name}: throughput_tok_s", strict=True)
            _num(e.get("tpot_ms"), 0, f"systems.{name}: tpot_ms")
        for key in ("slo_edge", "ceiling"):
            if entry.get(key):
                _num(entry[key], 0, f"systems.{name}.{key}", strict=True)


def _load_sweeps(tables: list[Path], csvs: list[Path], root: Path, frames: list, sources: list,
                 notes: list) -> list[Path]:
    """Append each sweep dir's table (results.parquet, else the results.csv beside it) to `frames`; returns the dirs."""
    sweep_dirs = sorted({p.parent for p in tables} | {p.parent for p in csvs})
    for d in sweep_dirs:
        df, used = None, None
        for name, read in ((SWEEP_TABLE, pd.read_parquet), (SWEEP_CSV, pd.read_csv)):
            if not (d / name).exists():
                continue
            try:
                df, used = read(d / name), name
                break
            except Exception as exc:  # noqa: BLE001 - a broken file is reported; the other format may serve
                notes.append(f"{(d / name).relative_to(root)}: unreadable results table ({type(exc).__name__})")
        if df is None:
            continue
        df = df.copy()
        df["source"] = str(d.relative_to(root)) or "."
        frames.append(df)
        sources.append(str((d / used).relative_to(root)))
    return sweep_dirs


def _load_plans(paths: list[Path], root: Path, plans: list, sources: list, notes: list) -> list[Path]:
    """Append each readable plan.json (check_plan) to `plans`, a note for the others; returns the plan dirs."""
    plan_dirs = []
    for path in paths:
        try:
            plan = _read_json(path)
            check_plan(plan)
        except (OSError, ValueError) as exc:
            notes.append(f"{path.relative_to(root)}: not a plan file ({exc})")
            continue
        plan["_path"] = str(path.relative_to(root))
        plans.append(plan)
        plan_dirs.append(path.parent)
        sources.append(plan["_path"])
    return plan_dirs


def collect(root) -> Results:
    """Walk `root` and load every result file; raises ValueError when the dir is missing or holds none."""
    root = Path(root)
    if not root.exists():
        raise ValueError(f"{root}: result dir not found")
    if not root.is_dir():
        raise ValueError(f"{root}: not a directory")
    frames, plans, validations, sources, notes = [], [], [], [], []

    def found(name: str) -> list[Path]:  # files under root, skipping hidden temporaries of unfinished writes
        return sorted(p for p in root.rglob(name) if not _in_temporary(p.relative_to(root))
                      and not (p.name.startswith(".") and p.name.endswith(MANIFEST_SUFFIX)))

    sweep_dirs = _load_sweeps(found(SWEEP_TABLE), found(SWEEP_CSV), root, frames, sources, notes)
    plan_dirs = _load_plans(found("plan.json"), root, plans, sources, notes)

    rows = []
    for path in found("metrics.json"):
        if _under(path.parent, sweep_dirs + plan_dirs):  # counted through their table / plan.json
            continue
        try:
            row = _replay_row(path)
        except (OSError, ValueError) as exc:
            notes.append(f"{path.relative_to(root)}: unreadable metrics ({exc})")
            continue
        row["source"] = str(path.parent.relative_to(root)) or "."
        rows.append(row)
        sources.append(str(path.relative_to(root)))
    if rows:
        frames.append(pd.DataFrame(rows))

    for path in found("*validate*.json"):
        try:
            data = _read_json(path)
        except (OSError, ValueError) as exc:
            notes.append(f"{path.relative_to(root)}: unreadable ({exc})")
            continue
        validations.append({"_path": str(path.relative_to(root)), "data": data})
        sources.append(str(path.relative_to(root)))

    if not sources:
        why = f"; {notes[0]}" if notes else ""
        raise ValueError(f"{root}: no result files found (results.parquet, metrics.json, plan.json, "
                         f"validate.json){why}")
    runs = pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()
    return Results(root, runs, plans, validations, sources, notes)
