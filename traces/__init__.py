"""Workload traces: request traces, sparse-selection traces (synthetic and captured), on-disk formats.

Public API (see FORMAT.md for the on-disk schema):
    open_trace(path) -> Trace(.requests, .meta, .selections)
    generate_requests(profile, num_requests, seed, ...) -> DataFrame;  load_profile(name_or_yaml) -> Profile
    SyntheticSelections(spec, seed).select(request_ids, history_lens, steps, group, num_query_tokens)
    selections_on_device(source): the synthetic generator drawing on a CUDA device (cupy; the same positions)
    CapturedSelections(...)  (same protocol);  TraceError (a ValueError) for bad input
"""
import importlib

# Where each public name lives: imported on first use (PEP 562), so that `import traces.errors` or a replay that
# only generates requests and selections does not load pandas / pyarrow (~0.6 CPU-s per process).
_HOME = {
    "convert_to_trace": "api", "generate_trace": "api", "inspect_trace": "api",
    "CapturedSelections": "captured", "SelectionWriter": "captured", "capture_from_source": "captured",
    "convert_capture": "captured", "TraceError": "errors", "selection_stats": "stats", "set_overlap": "stats",
    "MODEL_GROUPS": "synthetic", "SelectionSpec": "synthetic", "SyntheticSelections": "synthetic",
    "selections_on_device": "synthetic.device", "Trace": "trace", "open_trace": "trace", "write_trace": "trace",
    "Profile": "workload", "generate_requests": "workload", "import_requests": "workload", "load_profile": "workload",
}


def __getattr__(name: str):
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'traces' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"traces.{home}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "CapturedSelections", "MODEL_GROUPS", "Profile", "SelectionSpec", "SelectionWriter", "SyntheticSelections",
    "Trace", "TraceError", "capture_from_source", "convert_capture", "convert_to_trace", "generate_requests",
    "generate_trace", "import_requests", "inspect_trace", "load_profile", "open_trace", "selection_stats",
    "selections_on_device",
    "set_overlap", "write_trace",
]
