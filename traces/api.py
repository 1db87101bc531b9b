"""High-level trace operations behind the CLI: generate, inspect, convert."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.atomic import StagedDir
from traces.captured import DATA_FILE, capture_from_source, convert_capture
from traces.errors import TraceError
from traces.stats import length_stats, selection_stats
from traces.synthetic import MODEL_GROUPS, SelectionSpec, SyntheticSelections
from traces.trace import check_out_dir, open_trace, write_meta, write_trace
from traces.workload import MAX_REQUESTS, check_seed, generate_requests, import_requests, load_profile

DEFAULT_MODEL = "glm-5.2"
# Positions a materialized capture may hold: ~1e9 is already a GB-scale file and minutes of generation; beyond it
# `--capture-steps` is a typo (synthetic selections need not be stored at all: they regenerate from the seed).
MAX_CAPTURE_POSITIONS = 1_000_000_000


def generate_trace(out, profile="multi-lexsum", num_requests: int | None = None, seed: int = 0,
                   model: str | None = None, num_groups: int | None = None, arrival: str | None = None,
                   rate_per_s: float | None = None, from_csv=None, capture_steps: int = 0,
                   capture_query_tokens: int = 1, overwrite: bool = False) -> Path:
    """Generate a trace directory: requests from the profile (or imported), synthetic selections from its spec.

    Written into a hidden sibling and renamed into place: a failure leaves `out` as it was."""
    check_out_dir(out, overwrite)
    check_seed(seed)
    if num_requests is not None and not 1 <= num_requests <= MAX_REQUESTS:
        raise TraceError(f"--num-requests must be in [1, {MAX_REQUESTS:,}] (a replay simulates every request), "
                         f"got {num_requests:,}")
    prof = load_profile(profile)
    if num_groups is None:
        model = model or DEFAULT_MODEL
        if model not in MODEL_GROUPS:
            raise TraceError(f"unknown model '{model}' (known: {', '.join(MODEL_GROUPS)})")
        num_groups = MODEL_GROUPS[model]
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or not 1 <= num_groups <= 255:
        raise TraceError(f"num_groups must be an integer in [1, 255], got {num_groups!r}")
    if not 0 <= capture_steps < 1 << 24 or capture_query_tokens < 1:  # a record's step field is 24 bits (captured.py)
        raise TraceError(f"capture steps must be in [0, {(1 << 24) - 1:,}] and query tokens >= 1, got "
                         f"{capture_steps:,} and {capture_query_tokens:,}")
    if from_csv is not None:
        requests = import_requests(from_csv, arrival=arrival, rate_per_s=rate_per_s, seed=seed)
        if num_requests is not None:
            if num_requests < 1:
                raise TraceError(f"num_requests must be >= 1, got {num_requests}")
            requests = requests.iloc[:num_requests].reset_index(drop=True)
    else:
        if num_requests is None:
            raise TraceError("--num-requests is required (or give --from-csv)")
        requests = generate_requests(prof, num_requests, seed, arrival=arrival, rate_per_s=rate_per_s)
    spec = SelectionSpec.from_dict({**prof.selections, "num_groups": num_groups}, f"profile {prof.name}: selections")
    if capture_steps > 0:  # the same per-request step count capture_from_source materializes
        steps = np.minimum(capture_steps, np.maximum(requests["output_tokens"].to_numpy(np.int64), 1))
        positions = float(steps.sum()) * num_groups * capture_query_tokens * spec.top_k
        if positions > MAX_CAPTURE_POSITIONS:
            raise TraceError(f"--capture-steps {capture_steps:,} would store ~{positions:.2g} selected positions "
                             f"(limit {MAX_CAPTURE_POSITIONS:.0e}); lower --capture-steps, --query-tokens or "
                             "--num-requests")
    synthetic = {"kind": "synthetic", "spec": spec.to_dict(), "seed": int(seed)}
    arr = prof.arrival
    meta = {
        "profile": prof.name, "seed": int(seed), "model": model, "num_groups": num_groups,
        "requests_source": str(from_csv) if from_csv is not None else "profile",
        "arrival": {"process": arrival or arr.process, "rate_per_s": float(rate_per_s or arr.rate_per_s)},
        "profile_spec": prof.to_dict(), "requests_generator": "lognormal-v1", "selections": synthetic,
    }
    with StagedDir(out, command="trace", replace=overwrite) as stage:
        path = stage.path
        write_trace(path, requests, meta)
        if capture_steps > 0:
            sel = capture_from_source(SyntheticSelections(spec, seed), requests, path, capture_steps,
                                      capture_query_tokens)
            sel["source"] = synthetic
            doc = open_trace(path).meta
            doc["selections"] = sel
            write_meta(path, doc)
        return stage.publish()


def inspect_trace(path, num_requests: int = 16, num_steps: int = 8, num_query_tokens: int = 4,
                  tokens_per_step: int = 1, seed: int = 0) -> dict:
    """Everything `trace inspect` prints, as a dict."""
    tr = open_trace(path)
    sel = tr.selections
    try:
        stats = selection_stats(sel, tr.requests, num_requests=num_requests, num_steps=num_steps,
                                num_query_tokens=num_query_tokens, tokens_per_step=tokens_per_step, seed=seed)
    except TraceError as exc:
        if sel.kind != "captured" or "consecutive steps" not in str(exc):
            raise
        stats = None  # a capture without two consecutive steps: nothing to measure
    files = tr.bytes_on_disk()
    b = {"files": files, "total": int(sum(files.values()))}
    if sel.kind == "captured":
        n = int(tr.meta["selections"].get("num_selections", 0))
        b["bytes_per_selection"] = files.get(DATA_FILE, 0) / n if n else None
        b["bytes_per_selection_with_index"] = (files.get(DATA_FILE, 0) + files.get("selections.index.parquet", 0)) / n if n else None
    else:
        b["bytes_per_selection"] = None
        b["selections"] = "regenerated from spec + seed (0 bytes of selections stored)"
    info = {
        "path": str(tr.path), "schema_version": tr.meta.get("schema_version"), "profile": tr.meta.get("profile"),
        "seed": tr.meta.get("seed"), "model": tr.meta.get("model"), "lengths": length_stats(tr.requests),
        "selections": {"kind": sel.kind, "num_groups": sel.num_groups, "top_k": sel.top_k},
        "stats": stats, "bytes_on_disk": b,
    }
    if sel.kind == "synthetic":
        info["selections"]["targets"] = {str(g): round(p["target_overlap"], 4) for g, p in sel.describe().items()}
    return info


def convert_to_trace(capture, out, requests_file=None, top_k: int | None = None, overwrite: bool = False) -> Path:
    """Convert a capture (JSONL/NPZ) into a trace directory with compact captured selections (staged like
    `generate_trace`: a refused or failed convert leaves `out` as it was)."""
    check_out_dir(out, overwrite)
    with StagedDir(out, command="trace", replace=overwrite) as stage:
        _convert_into(stage.path, capture, requests_file, top_k)
        return stage.publish()


def _convert_into(path: Path, capture, requests_file, top_k: int | None) -> None:
    sel = convert_capture(capture, path)
    sel["source"] = str(capture)
    if top_k is not None:
        if top_k < sel["top_k"]:
            raise TraceError(f"{capture}: sets of up to {sel['top_k']} positions exceed --top-k {top_k}")
        sel["top_k"] = int(top_k)
    from traces.captured import read_index

    idx = read_index(path / sel["index"])
    if requests_file is not None:
        requests = import_requests(requests_file)
        missing = np.setdiff1d(idx["request_id"].unique(), requests["request_id"].to_numpy())
        if missing.size:
            raise TraceError(f"{requests_file}: no row for captured request {int(missing[0])}")
    else:  # derived: input = history at the first captured step, output = number of captured steps
        g = idx.groupby("request_id")
        first = idx.loc[g["step"].idxmin()].set_index("request_id")
        requests = pd.DataFrame({
            "request_id": first.index.to_numpy(np.int64),
            "arrival_s": np.zeros(len(first)),
            "input_tokens": np.maximum(first["history_len"].to_numpy(np.int64), 1),
            "output_tokens": (g["step"].max() - g["step"].min() + 1).reindex(first.index).to_numpy(np.int64),
        })
    meta = {"profile": "captured", "seed": 0, "model": None, "num_groups": sel["num_groups"],
            "requests_source": str(requests_file) if requests_file else "derived from capture", "selections": sel}
    write_trace(path, requests, meta)
