"""Workload traces: request traces, sparse-selection traces (synthetic and captured), on-disk formats.

Public API (see FORMAT.md for the on-disk schema):
    open_trace(path) -> Trace(.requests, .meta, .selections)
    generate_requests(profile, num_requests, seed, ...) -> DataFrame;  load_profile(name_or_yaml) -> Profile
    SyntheticSelections(spec, seed).select(request_ids, history_lens, steps, group, num_query_tokens)
    CapturedSelections(...)  (same protocol);  TraceError (a ValueError) for bad input
"""
from traces.api import convert_to_trace, generate_trace, inspect_trace
from traces.captured import CapturedSelections, SelectionWriter, capture_from_source, convert_capture
from traces.errors import TraceError
from traces.stats import selection_stats, set_overlap
from traces.synthetic import MODEL_GROUPS, SelectionSpec, SyntheticSelections
from traces.trace import Trace, open_trace, write_trace
from traces.workload import Profile, generate_requests, import_requests, load_profile

__all__ = [
    "CapturedSelections", "MODEL_GROUPS", "Profile", "SelectionSpec", "SelectionWriter", "SyntheticSelections",
    "Trace", "TraceError", "capture_from_source", "convert_capture", "convert_to_trace", "generate_requests",
    "generate_trace", "import_requests", "inspect_trace", "load_profile", "open_trace", "selection_stats",
    "set_overlap", "write_trace",
]
