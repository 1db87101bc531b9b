"""A trace on disk: a directory with requests.parquet, trace.yaml and optional captured selections (FORMAT.md)."""
from __future__ import annotations

import datetime as _dt
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from traces.atomic import check_out_path, is_manifest
from traces.captured import CapturedSelections
from traces.errors import TraceError
from traces.strict_yaml import read_yaml_file
from traces.synthetic import SelectionSpec, SyntheticSelections
from traces.workload import COLUMNS, check_requests

SCHEMA_VERSION = 1
META_FILE = "trace.yaml"
REQUESTS_FILE = "requests.parquet"


@dataclass
class Trace:
    """An opened trace: `.requests` (DataFrame), `.meta` (trace.yaml as a dict), `.selections` (SelectionSource)."""

    path: Path
    requests: pd.DataFrame
    meta: dict
    selections: SyntheticSelections | CapturedSelections

    @property
    def num_groups(self) -> int:
        return int(self.selections.num_groups)

    @property
    def top_k(self) -> int:
        return int(self.selections.top_k)

    def bytes_on_disk(self) -> dict:
        """Bytes per file of the trace directory (its hidden output manifest left out)."""
        return {p.name: p.stat().st_size for p in sorted(self.path.iterdir()) if p.is_file() and not is_manifest(p.name)}


def check_out_dir(path, overwrite: bool = False) -> Path:
    """Check, changing nothing, that `path` can receive a trace: absent, empty, or (with overwrite) an old trace.

    Writers then build the trace in a hidden sibling and rename it into place (traces.atomic.StagedDir), so a
    failure leaves an old trace byte-identical and no half-written directory behind.
    """
    path = Path(path)
    try:
        check_out_path(path, overwrite, command="trace", what="trace")
    except (OSError, ValueError) as exc:
        raise TraceError(str(exc)) from None
    return path


def write_trace(path, requests: pd.DataFrame, meta: dict) -> Path:
    """Write requests.parquet + trace.yaml into directory `path`. `meta` must hold `selections`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    df = check_requests(requests, "requests")
    table = pa.Table.from_pandas(df[list(COLUMNS)], preserve_index=False)
    table = table.replace_schema_metadata({"ulacache_schema_version": str(SCHEMA_VERSION)})
    pq.write_table(table, path / REQUESTS_FILE, compression="zstd")
    doc = {"schema_version": SCHEMA_VERSION, "kind": "ulacache-trace",
           "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "num_requests": int(len(df)), **meta}
    write_meta(path, doc)
    return path


def write_meta(path, doc: dict) -> None:
    (Path(path) / META_FILE).write_text(yaml.safe_dump(doc, sort_keys=False))


def selections_from_meta(sel: dict, directory: Path, where: str):
    """Build the SelectionSource described by trace.yaml's `selections` mapping."""
    if not isinstance(sel, dict) or "kind" not in sel:
        raise TraceError(f"{where}: 'selections' must be a mapping with a 'kind'")
    kind = sel["kind"]
    if kind == "synthetic":
        for key in sel:
            if key not in ("kind", "spec", "seed"):
                raise TraceError(f"{where}: selections: unknown key '{key}'")
        spec = SelectionSpec.from_dict(sel.get("spec"), f"{where}: selections.spec")
        seed = sel.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TraceError(f"{where}: selections.seed must be an integer")
        return SyntheticSelections(spec, seed)
    if kind == "captured":
        known = ("kind", "file", "index", "codec", "num_groups", "top_k", "num_records", "num_selections",
                 "source")
        for key in sel:
            if key not in known:
                raise TraceError(f"{where}: selections: unknown key '{key}'")
        for key in ("file", "index", "num_groups", "top_k"):
            if key not in sel:
                raise TraceError(f"{where}: selections: missing key '{key}'")
        return CapturedSelections(directory / str(sel["file"]), directory / str(sel["index"]),
                                  num_groups=int(sel["num_groups"]), top_k=int(sel["top_k"]))
    raise TraceError(f"{where}: unknown selections kind '{kind}' (known: synthetic, captured)")


def open_trace(path) -> Trace:
    """Open a trace directory (or its trace.yaml); one-line TraceError for anything missing, corrupt or unknown."""
    path = Path(path)
    if path.name == META_FILE:
        path = path.parent
    meta_path = path / META_FILE
    if not path.is_dir():
        raise TraceError(f"{path}: no such trace directory")
    if not meta_path.exists():
        raise TraceError(f"{meta_path}: missing (not a trace directory)")
    meta = read_yaml_file(meta_path)
    if not isinstance(meta, dict):
        raise TraceError(f"{meta_path}: expected a mapping")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise TraceError(f"{meta_path}: unknown schema_version {version!r} (this reader knows {SCHEMA_VERSION})")
    req_path = path / REQUESTS_FILE
    try:
        table = pq.read_table(req_path)
    except FileNotFoundError:
        raise TraceError(f"{req_path}: missing") from None
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{req_path}: unreadable ({' '.join(str(exc).split())[:160]})") from None
    requests = check_requests(table.to_pandas(), str(req_path))
    if "num_requests" in meta and meta["num_requests"] != len(requests):
        raise TraceError(f"{meta_path}: num_requests {meta['num_requests']} but {req_path.name} has "
                         f"{len(requests)} rows")
    selections = selections_from_meta(meta.get("selections"), path, str(meta_path))
    return Trace(path, requests, meta, selections)


def copy_trace(src, dst) -> Path:
    """Copy a trace directory (tests and tools)."""
    return Path(shutil.copytree(src, dst))
