"""Reading stored measurement JSON (`hw calibrate --json`, `hw hisparse`, `hw validate` runs) as user input: a size
limit checked before parsing, and every number finite (JSON's NaN/Infinity literals and 1e400 refused, the key
named), so a broken measurement is one `ulacache: error:` line instead of a NaN written into a calibration."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

MAX_JSON_BYTES = 256 << 20  # the largest committed raw JSON is a few MB; 256 MiB would take minutes to parse


def read_json_limited(path, flag: str, limit: int = MAX_JSON_BYTES):
    """Parse a JSON file after checking its size (before reading it); one-line errors naming the flag and file."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise OSError(f"{flag} {path}: no such file") from None
    if not path.is_file():
        raise ValueError(f"{flag} {path}: not a regular file")
    if size > limit:
        raise ValueError(f"{flag} {path}: {size:,} bytes is over the {limit >> 20} MiB limit for a measurement JSON")
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{flag} {path}: not a readable JSON file ({type(exc).__name__})") from None
    except RecursionError:
        raise ValueError(f"{flag} {path}: JSON nested too deeply") from None


def first_non_finite(obj, where: str = "") -> tuple[str, float] | None:
    """(dotted path, value) of the first NaN/inf number in a parsed JSON tree, else None (iterative: no recursion)."""
    stack = [(where, obj)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, float) and not math.isfinite(value):
            return key, value
    return None


# measured magnitudes (bandwidths, times, latencies, sizes) that cannot be negative; signed errors and fitted
# "extra" terms (a difference of two timings) may be
_MAGNITUDE = re.compile(r"(gb_s|gbps|bytes_s|_bytes|time(_p\d+)?_s|latency_s|launch\w*_s|_us)(_by_gpu)?$")
_SIGNED = ("err", "signed", "extra", "delta", "diff")


def first_negative_magnitude(obj) -> tuple[str, float] | None:
    """(dotted path, value) of the first negative measured magnitude (by its key's unit suffix), else None."""
    stack = [("", "", obj)]
    while stack:
        path, key, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), str(k), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", key, v) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0 \
                and _MAGNITUDE.search(key) and not any(w in key for w in _SIGNED):
            return path, value
    return None


def read_measurement_json(path, flag: str):
    """A measurement JSON whose numbers are all finite; raises a one-line ValueError naming the key otherwise."""
    data = read_json_limited(path, flag)
    if not isinstance(data, dict):
        raise ValueError(f"{flag} {path}: not a measurement JSON (expected an object)")
    bad = first_non_finite(data)
    if bad is not None:
        raise ValueError(f"{flag} {path}: {bad[0]} = {bad[1]} is not a finite number (a broken measurement?)")
    bad = first_negative_magnitude(data)
    if bad is not None:
        raise ValueError(f"{flag} {path}: {bad[0]} = {bad[1]} is a negative time, rate or size (a broken "
                         "measurement?)")
    return data
