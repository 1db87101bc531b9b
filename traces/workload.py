"""Request traces: profiles (YAML), seeded generation, and import of users' CSV/JSONL request lists.

A request trace is a DataFrame with columns request_id (int64), arrival_s (float64), input_tokens (int64),
output_tokens (int64), ordered by arrival. Closed-loop traces have every arrival at 0 (the replay admits requests
as capacity allows); Poisson traces draw exponential inter-arrival gaps at `rate_per_s`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from traces.errors import TraceError
from traces.strict_yaml import read_yaml_file

if TYPE_CHECKING:
    import pandas as pd

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
COLUMNS = ("request_id", "arrival_s", "input_tokens", "output_tokens")
# Limits on what a trace may hold (beyond them a value is a typo or an overflow, not a workload):
MAX_REQUEST_TOKENS = 1 << 20  # input or output tokens of one request: a 1M-token context (these models serve 128-200K)
MAX_REQUESTS = 1_000_000  # requests in one generated trace (a replay simulates each one)
# Limits of a request list (CSV/JSONL), checked before parsing: MAX_REQUESTS rows of at most 64 bytes each (a full
# row "1000000,86400.123456,1048576,1048576" is 37), and lines (blank ones allowed, at most one per row)
MAX_REQUEST_FILE_BYTES = 64 << 20
MAX_REQUEST_FILE_LINES = 2 * MAX_REQUESTS
MAX_SEED = 2**32 - 1  # the generators key their RNG on 32 bits: larger seeds would repeat smaller ones
ARRIVALS = ("closed", "poisson")


def _strict(cls, data, where: str):
    """Build frozen dataclass `cls` from a mapping, rejecting unknown keys with a one-line error."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TraceError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            raise TraceError(f"{where}: unknown key '{key}' (known: {', '.join(sorted(known))})")
    try:
        return cls(**data)
    except TypeError as exc:
        raise TraceError(f"{where}: {exc}") from None


def _num(v, where: str, lo: float = 0.0, integer: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (not integer or float(v).is_integer())
    if not ok or not np.isfinite(v) or v < lo:
        kind = "an integer" if integer else "a number"
        raise TraceError(f"{where} must be {kind} >= {lo:g}, got {v!r}")


@dataclass(frozen=True)
class LengthDist:
    """Lognormal lengths: untruncated median and sigma; kept if >= min_tokens; capped (truncated) at cap_tokens.

    For outputs, `max_tokens` clips instead of `cap_tokens` (same effect); samples below min_tokens are redrawn for
    inputs (HELMET drops short cases) and clipped up for outputs.
    """

    median_tokens: float
    sigma: float
    min_tokens: int = 1
    cap_tokens: int | None = None
    max_tokens: int | None = None

    def check(self, where: str) -> None:
        _num(self.median_tokens, f"{where}.median_tokens", 1)
        _num(self.sigma, f"{where}.sigma", 0)
        _num(self.min_tokens, f"{where}.min_tokens", 1, integer=True)
        top = self.upper
        if top is not None:
            _num(top, f"{where}.cap_tokens/max_tokens", 1, integer=True)
            if top < self.min_tokens:
                raise TraceError(f"{where}: cap below min_tokens ({top} < {self.min_tokens})")

    @property
    def upper(self) -> int | None:
        return self.cap_tokens if self.cap_tokens is not None else self.max_tokens


@dataclass(frozen=True)
class Arrival:
    process: str = "closed"
    rate_per_s: float = 1.0

    def check(self, where: str) -> None:
        if self.process not in ARRIVALS:
            raise TraceError(f"{where}.process: unknown arrival process '{self.process}' (known: {', '.join(ARRIVALS)})")
        _num(self.rate_per_s, f"{where}.rate_per_s", 0)
        if self.process == "poisson" and self.rate_per_s <= 0:
            raise TraceError(f"{where}.rate_per_s must be > 0 for poisson arrivals")


@dataclass(frozen=True)
class Profile:
    """A workload profile: request length distributions, arrivals, selection-generator parameters."""

    name: str
    input_tokens: LengthDist
    output_tokens: LengthDist
    arrival: Arrival = field(default_factory=Arrival)
    selections: dict = field(default_factory=dict)
    description: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def load_profile(name_or_yaml) -> Profile:
    """A profile by name (`multi-lexsum`, `small`: files in traces/profiles/), from a YAML path, or from a dict."""
    if isinstance(name_or_yaml, Profile):
        return name_or_yaml
    if isinstance(name_or_yaml, dict):
        data, where = name_or_yaml, "profile"
    else:
        text = str(name_or_yaml)
        path = Path(text)
        if not (text.endswith((".yaml", ".yml")) or path.exists()):
            path = PROFILE_DIR / f"{text}.yaml"
            if not path.exists():
                known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
                raise TraceError(f"unknown profile '{text}' (known: {', '.join(known)}; or give a YAML path)")
        where = str(path)
        if not path.is_file():
            raise TraceError(f"{path}: no such profile file")
        data = read_yaml_file(path)
    if not isinstance(data, dict):
        raise TraceError(f"{where}: a profile must be a mapping")
    data = dict(data)
    for key in ("input_tokens", "output_tokens"):
        if key not in data:
            raise TraceError(f"{where}: missing key '{key}'")
        data[key] = _strict(LengthDist, data[key], f"{where}: {key}")
    data["arrival"] = _strict(Arrival, data.get("arrival"), f"{where}: arrival")
    data.setdefault("name", Path(str(where)).stem)
    prof = _strict(Profile, data, where)
    prof.input_tokens.check(f"{where}: input_tokens")
    prof.output_tokens.check(f"{where}: output_tokens")
    prof.arrival.check(f"{where}: arrival")
    if not isinstance(prof.selections, dict):
        raise TraceError(f"{where}: selections must be a mapping")
    return prof


def _lognormal(rng: np.random.Generator, dist: LengthDist, n: int, redraw_short: bool) -> np.ndarray:
    mu = np.log(float(dist.median_tokens))
    out = np.empty(0, dtype=np.float64)
    tries = 0
    while out.size < n:  # rejection sampling of the kept (>= min) part; acceptance >= ~1e-3 or we give up
        draw = rng.lognormal(mu, float(dist.sigma), size=max(2 * (n - out.size), 64))
        if redraw_short:
            draw = draw[draw >= dist.min_tokens]
        out = np.concatenate([out, draw])
        tries += 1
        if tries > 1000:
            raise TraceError(f"length distribution (median {dist.median_tokens}, sigma {dist.sigma}) almost never "
                             f"reaches min_tokens {dist.min_tokens}")
    x = np.floor(out[:n])
    x = np.maximum(x, dist.min_tokens)
    if dist.upper is not None:
        x = np.minimum(x, dist.upper)
    return x.astype(np.int64)


@dataclass(frozen=True, eq=False)
class RequestColumns:
    """A request trace as numpy columns (COLUMNS, canonical dtypes): what a replay reads, the same values as the
    DataFrame of `generate_requests`, without loading pandas (~0.6 CPU-s of every replay process).
    `table["input_tokens"]` is a column, `len(table)` the number of requests, `columns` the column names."""

    request_id: np.ndarray
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray

    columns = COLUMNS

    def __post_init__(self):
        for c, dt in zip(COLUMNS, (np.int64, np.float64, np.int64, np.int64)):
            object.__setattr__(self, c, np.asarray(getattr(self, c), dtype=dt))

    @classmethod
    def of(cls, table) -> RequestColumns:
        """The columns of a requests table (a DataFrame, or anything indexable by column name)."""
        return cls(*(np.asarray(table[c]) for c in COLUMNS))

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in COLUMNS:
            raise KeyError(name)
        return getattr(self, name)

    def __len__(self) -> int:
        return int(self.request_id.size)

    def take(self, index) -> RequestColumns:
        return RequestColumns(*(getattr(self, c)[index] for c in COLUMNS))

    def by_arrival(self) -> RequestColumns:
        """Ordered by (arrival_s, request_id), as DataFrame.sort_values([...], kind="stable") orders them."""
        return self.take(np.lexsort((self.request_id, self.arrival_s)))

    def to_frame(self) -> pd.DataFrame:
        return _frame(self.request_id, self.arrival_s, self.input_tokens, self.output_tokens)


def generate_requests(profile, num_requests: int, seed: int = 0, arrival: str | None = None,
                      rate_per_s: float | None = None) -> pd.DataFrame:
    """A seeded request trace from a profile (name, YAML path, dict or Profile); `arrival`/`rate_per_s` override."""
    return generate_request_columns(profile, num_requests, seed, arrival, rate_per_s).to_frame()


def generate_request_columns(profile, num_requests: int, seed: int = 0, arrival: str | None = None,
                             rate_per_s: float | None = None) -> RequestColumns:
    """`generate_requests` as numpy columns (RequestColumns): the same values, without pandas."""
    prof = load_profile(profile)
    if isinstance(num_requests, bool) or not isinstance(num_requests, (int, np.integer)) or num_requests < 0:
        raise TraceError(f"num_requests must be a non-negative integer, got {num_requests!r}")
    if num_requests > MAX_REQUESTS:
        raise TraceError(f"num_requests must be <= {MAX_REQUESTS:,} (a replay simulates every request), "
                         f"got {num_requests:,}")
    check_seed(seed)
    arr = Arrival(arrival or prof.arrival.process,
                  prof.arrival.rate_per_s if rate_per_s is None else rate_per_s)
    arr.check("arrival")
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x7EA5])
    n = int(num_requests)
    inp = _lognormal(rng, prof.input_tokens, n, redraw_short=True)
    outp = _lognormal(rng, prof.output_tokens, n, redraw_short=False)
    arrivals = _arrivals(rng, arr, n)
    return RequestColumns(np.arange(n), arrivals, inp, outp)


def _arrivals(rng: np.random.Generator, arr: Arrival, n: int) -> np.ndarray:
    if arr.process == "closed":
        return np.zeros(n)
    return np.cumsum(rng.exponential(1.0 / float(arr.rate_per_s), size=n))


def _frame(rid, arrival, inp, outp) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({
        "request_id": np.asarray(rid, dtype=np.int64),
        "arrival_s": np.asarray(arrival, dtype=np.float64),
        "input_tokens": np.asarray(inp, dtype=np.int64),
        "output_tokens": np.asarray(outp, dtype=np.int64),
    })


def import_requests(path, arrival: str | None = None, rate_per_s: float | None = None,
                    seed: int = 0) -> pd.DataFrame:
    """Read a user's CSV or JSONL of (input_tokens, output_tokens[, arrival_s][, request_id]).

    Without arrival_s the rows arrive closed-loop (0), or Poisson at `rate_per_s` when arrival='poisson'.
    Errors name the file and the line.
    """
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if not path.is_file():
        raise TraceError(f"{path}: not a regular file")
    size = path.stat().st_size
    if size > MAX_REQUEST_FILE_BYTES:
        raise TraceError(f"{path}: {size:,} bytes is over the {MAX_REQUEST_FILE_BYTES >> 20} MiB limit for a request "
                         f"list (at most {MAX_REQUESTS:,} requests)")
    lines = _count_lines(path)
    if lines > MAX_REQUEST_FILE_LINES:
        raise TraceError(f"{path}: {lines:,} lines is over the {MAX_REQUEST_FILE_LINES:,}-line limit for a request "
                         f"list (at most {MAX_REQUESTS:,} requests)")
    rows = _read_jsonl(path) if path.suffix.lower() in (".jsonl", ".ndjson") else _read_csv(path)
    if not rows:
        raise TraceError(f"{path}: no requests")
    has_arrival = [("arrival_s" in r) for _, r in rows]
    if any(has_arrival) and not all(has_arrival):
        line = rows[has_arrival.index(False)][0]
        raise TraceError(f"{path}: line {line}: arrival_s missing (other rows have it)")
    inp, outp, arr, rid = [], [], [], []
    for line, r in rows:
        for key in r:
            if key not in ("input_tokens", "output_tokens", "arrival_s", "request_id"):
                raise TraceError(f"{path}: line {line}: unknown column '{key}'")
        for key in ("input_tokens", "output_tokens"):
            if key not in r:
                raise TraceError(f"{path}: line {line}: missing '{key}'")
        inp.append(_int_field(r["input_tokens"], path, line, "input_tokens", 1))
        outp.append(_int_field(r["output_tokens"], path, line, "output_tokens", 1))
        rid.append(_int_field(r["request_id"], path, line, "request_id", 0) if "request_id" in r else len(rid))
        if "arrival_s" in r:
            try:
                a = float(r["arrival_s"])
            except (TypeError, ValueError):
                a = float("nan")
            if not np.isfinite(a) or a < 0:
                raise TraceError(f"{path}: line {line}: arrival_s must be a number >= 0, got {r['arrival_s']!r}")
            arr.append(a)
    if len(set(rid)) != len(rid):
        raise TraceError(f"{path}: duplicate request_id values")
    if arr:
        arrivals = np.asarray(arr)
    else:
        a = Arrival(arrival or "closed", 1.0 if rate_per_s is None else rate_per_s)
        a.check("arrival")
        arrivals = _arrivals(np.random.default_rng([int(seed) & 0xFFFFFFFF, 0xA441]), a, len(inp))
    df = _frame(rid, arrivals, inp, outp)
    return df.sort_values("arrival_s", kind="stable").reset_index(drop=True)


def check_seed(seed) -> int:
    """A generator seed in [0, 2^32 - 1]; anything else would alias (the RNG is keyed on its low 32 bits)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed <= MAX_SEED:
        raise TraceError(f"seed must be an integer in [0, 2^32 - 1] (larger seeds would repeat smaller ones), "
                         f"got {seed!r}")
    return int(seed)


def _int_field(v, path, line, key, lo) -> int:
    hi = MAX_REQUEST_TOKENS if key.endswith("_tokens") else 2**63 - 1
    try:
        f = int(v) if isinstance(v, int) and not isinstance(v, bool) else float(v)
    except (TypeError, ValueError, OverflowError):
        f = float("nan")
    if isinstance(f, float) and (not np.isfinite(f) or not f.is_integer()) or not lo <= f <= hi:
        limit = f" and <= {hi:,} (a 1M-token context)" if key.endswith("_tokens") else ""
        raise TraceError(f"{path}: line {line}: {key} must be an integer >= {lo}{limit}, got {v!r}")
    return int(f)


def iter_jsonl(path: Path):
    """Stream (line number, object) from a JSONL file, skipping blank lines; a bad line is a one-line TraceError."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:
                r = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}: line {n}: not valid JSON ({exc.msg})") from None
            if not isinstance(r, dict):
                raise TraceError(f"{path}: line {n}: expected a JSON object")
            yield n, r


def _count_lines(path: Path) -> int:
    """Newlines in the file, counted in 1 MiB blocks before any parsing (a 64 MiB file: ~30 ms)."""
    count = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            count += block.count(b"\n")
    return count


def _too_many(path: Path) -> TraceError:
    return TraceError(f"{path}: more than {MAX_REQUESTS:,} requests (the limit of one trace: a replay simulates "
                      "every request)")


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    rows = []
    for row in iter_jsonl(path):
        if len(rows) >= MAX_REQUESTS:
            raise _too_many(path)
        rows.append(row)
    return rows


def _read_csv(path: Path) -> list[tuple[int, dict]]:
    import csv

    rows = []
    # utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is dropped, not read into the first column's name
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as fh:
        reader = csv.reader(fh)
        header = None
        n = 0
        try:
            for rec in reader:
                n = reader.line_num
                if not rec or all(not c.strip() for c in rec):
                    continue
                if header is None:
                    header = [c.strip() for c in rec]
                    continue
                if len(rec) != len(header):
                    raise TraceError(f"{path}: line {n}: {len(rec)} fields, header has {len(header)}")
                if len(rows) >= MAX_REQUESTS:
                    raise _too_many(path)
                rows.append((n, {k: v.strip() for k, v in zip(header, rec)}))
        except csv.Error as exc:  # e.g. an unterminated quote runs past the field size limit (128 KB)
            raise TraceError(f"{path}: line {reader.line_num}: not valid CSV ({exc})") from None
    if header is None:
        raise TraceError(f"{path}: empty file (need a header: input_tokens,output_tokens[,arrival_s])")
    return rows


def check_requests(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """Validate a requests table read from disk (column set, dtypes, ranges); returns it with canonical dtypes."""
    import pandas as pd

    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise TraceError(f"{where}: missing column(s) {', '.join(missing)}")
    df = df[list(COLUMNS)]
    for c in ("request_id", "input_tokens", "output_tokens"):
        if not pd.api.types.is_integer_dtype(df[c]):
            raise TraceError(f"{where}: column {c} must be integer, is {df[c].dtype}")
    if not pd.api.types.is_numeric_dtype(df["arrival_s"]):
        raise TraceError(f"{where}: column arrival_s must be numeric")
    for c, lo in (("input_tokens", 1), ("output_tokens", 1), ("request_id", 0)):
        bad = np.flatnonzero(df[c].to_numpy() < lo)
        if bad.size:
            raise TraceError(f"{where}: record {int(bad[0])}: {c} = {int(df[c].iloc[bad[0]])} < {lo}")
    for c in ("input_tokens", "output_tokens"):
        bad = np.flatnonzero(df[c].to_numpy() > MAX_REQUEST_TOKENS)
        if bad.size:
            raise TraceError(f"{where}: record {int(bad[0])}: {c} = {int(df[c].iloc[bad[0]]):,} > "
                             f"{MAX_REQUEST_TOKENS:,} (a 1M-token context; these models serve 128K-200K)")
    arr = df["arrival_s"].to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        raise TraceError(f"{where}: record {int(bad[0])}: arrival_s = {arr[bad[0]]} is not a time >= 0")
    if df["request_id"].duplicated().any():
        raise TraceError(f"{where}: duplicate request_id values")
    return df.astype({"request_id": "int64", "arrival_s": "float64", "input_tokens": "int64",
                      "output_tokens": "int64"}).reset_index(drop=True)
