"""Captured selections in the compact on-disk format (FORMAT.md): writer, streaming reader, SelectionSource.

`selections.bin` holds blocks of records; a record is the top-k sets of one (request, step, group), one sorted set
per query token, stored as LEB128 varints of gaps (first position, then differences minus one) after the per-query
counts. A block (normally one (request, step): every group) is zstd-compressed and carries a CRC-32.
`selections.index.parquet` has one row per record: its key, history length, query count and where it lives.
Readers load the index (tens of bytes a record) and decompress only the blocks they touch.
"""
from __future__ import annotations

import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from traces import varint
from traces.errors import TraceError
from traces.workload import iter_jsonl

MAGIC = b"ULASEL\x00\x01"
HEADER_BYTES = 16
SCHEMA_VERSION = 1
DATA_FILE = "selections.bin"
INDEX_FILE = "selections.index.parquet"
CODECS = ("zstd", "none")
INDEX_COLUMNS = ("request_id", "step", "group", "history_len", "num_query_tokens", "block_offset", "block_bytes",
                 "block_raw_bytes", "block_crc32", "record_offset", "record_bytes")
_MAX_RID, _MAX_STEP, _MAX_GROUP = (1 << 31) - 1, (1 << 24) - 1, (1 << 8) - 1


def _key(rid, step, group) -> np.ndarray:
    return (np.asarray(rid, np.int64) << 32) | (np.asarray(step, np.int64) << 8) | np.asarray(group, np.int64)


def encode_record(positions: np.ndarray) -> bytes:
    """Varint bytes of one record: positions int[Q, K] (any order, -1 padding), distinct per row."""
    return bytes(_encode_records(np.asarray(positions, np.int64)[None])[0])


def _encode_records(pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Encode records pos[N, Q, K] at once: (bytes uint8, per-record byte counts int64)."""
    n, q, k = pos.shape
    srt = np.sort(pos, axis=-1)
    valid = srt >= 0
    counts = valid.sum(-1)  # [N, Q]
    prev = np.concatenate([np.full((n, q, 1), -1, np.int64), srt[..., :-1]], axis=-1)
    gaps = srt - prev - 1
    # per record: Q counts, then the valid gaps row by row (valid entries sit at the end of each sorted row)
    vals = np.concatenate([counts.reshape(n, q).astype(np.int64), np.where(valid, gaps, -1).reshape(n, q * k)], 1)
    keep = vals >= 0
    flat = vals[keep]
    nb = np.ones(flat.size, dtype=np.int64)
    for b in range(1, 10):
        nb += flat >= (1 << (7 * b))
    rec_of = np.repeat(np.arange(n), keep.sum(1))
    rec_bytes = np.bincount(rec_of, weights=nb, minlength=n).astype(np.int64)
    return varint.encode(flat), rec_bytes


def _decode_record(raw: memoryview | bytes, q: int, where: str) -> list[np.ndarray]:
    vals = varint.decode(np.frombuffer(raw, dtype=np.uint8), where).astype(np.int64)
    if vals.size < q:
        raise TraceError(f"{where}: record shorter than its {q} counts")
    counts = vals[:q]
    gaps = vals[q:]
    if int(counts.sum()) != gaps.size:
        raise TraceError(f"{where}: counts ({int(counts.sum())}) do not match the stored positions ({gaps.size})")
    csum = np.cumsum(gaps + 1)
    ends = np.cumsum(counts)
    rows = []
    for i in range(q):
        a, b = int(ends[i] - counts[i]), int(ends[i])
        base = csum[a - 1] if a > 0 else 0
        rows.append(csum[a:b] - base - 1)
    return rows


class SelectionWriter:
    """Append records to a trace directory's selections.bin + selections.index.parquet (call close())."""

    def __init__(self, directory, codec: str = "zstd", block_raw_bytes: int = 1 << 20):
        if codec not in CODECS:
            raise TraceError(f"unknown codec '{codec}' (known: {', '.join(CODECS)})")
        if codec == "zstd" and not pa.Codec.is_available("zstd"):
            codec = "none"
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.codec = codec
        self.block_raw_bytes = int(block_raw_bytes)
        self._fh = open(self.dir / DATA_FILE, "wb")
        self._fh.write(MAGIC + SCHEMA_VERSION.to_bytes(8, "little"))
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (meta rows, bytes, rec_bytes)
        self._pending_bytes = 0
        self._pending_key: tuple[int, int] | None = None
        self._index: list[np.ndarray] = []
        self._keys: set[int] = set()
        self.num_records = 0
        self.num_selections = 0
        self.max_group = -1
        self.max_count = 0

    def add(self, request_ids, steps, groups, history_lens, positions, where: str = "selection writer",
            names: list[str] | None = None) -> None:
        """Add N records: int arrays [N] and positions int[N, Q, K] (-1 padding), validated (one-line errors
        prefixed by `where`, naming records by `names` (e.g. input lines) or by their running number)."""
        rid = np.atleast_1d(np.asarray(request_ids, np.int64))
        step = np.atleast_1d(np.asarray(steps, np.int64))
        grp = np.atleast_1d(np.asarray(groups, np.int64))
        hist = np.atleast_1d(np.asarray(history_lens, np.int64))
        pos = np.asarray(positions, np.int64)
        if pos.ndim == 2:
            pos = pos[:, None, :]
        n = rid.size
        if pos.ndim != 3 or pos.shape[0] != n or not (step.size == grp.size == hist.size == n):
            raise TraceError(f"{where}: inconsistent record shapes ({n} keys, positions {pos.shape})")
        names = names or [f"record {self.num_records + i}" for i in range(n)]
        _check_records(rid, step, grp, hist, pos, where, names)
        keys = _key(rid, step, grp).tolist()
        seen = set()
        for i, kk in enumerate(keys):
            if kk in self._keys or kk in seen:
                raise TraceError(f"{where}: {names[i]}: duplicate (request {rid[i]}, step {step[i]}, "
                                 f"group {grp[i]})")
            seen.add(kk)
        self._keys.update(seen)
        data, rec_bytes = _encode_records(pos)
        meta = np.stack([rid, step, grp, hist, np.full(n, pos.shape[1])], 1)
        # split into runs of equal (request, step) so each block holds whole (request, step)s when it can
        brk = np.flatnonzero((np.diff(rid) != 0) | (np.diff(step) != 0)) + 1
        offs = np.concatenate([[0], np.cumsum(rec_bytes)])
        for a, b in zip(np.concatenate([[0], brk]), np.concatenate([brk, [n]])):
            key = (int(rid[a]), int(step[a]))
            if self._pending and (key != self._pending_key or self._pending_bytes >= self.block_raw_bytes):
                self._flush()
            self._pending.append((meta[a:b], data[offs[a]:offs[b]], rec_bytes[a:b]))
            self._pending_bytes += int(offs[b] - offs[a])
            self._pending_key = key
        self.num_records += n
        self.num_selections += int((pos >= 0).sum())
        self.max_group = max(self.max_group, int(grp.max()) if n else -1)
        self.max_count = max(self.max_count, int((pos >= 0).sum(-1).max()) if n else 0)

    def _flush(self) -> None:
        if not self._pending:
            return
        meta = np.concatenate([m for m, _, _ in self._pending])
        raw = np.concatenate([d for _, d, _ in self._pending]).tobytes()
        rec_bytes = np.concatenate([r for _, _, r in self._pending])
        blob = raw if self.codec == "none" else pa.compress(raw, codec=self.codec, asbytes=True)
        offset = self._fh.tell()
        self._fh.write(blob)
        crc = zlib.crc32(blob)
        n = meta.shape[0]
        rec_off = np.concatenate([[0], np.cumsum(rec_bytes)[:-1]])
        self._index.append(np.column_stack([meta, np.full(n, offset), np.full(n, len(blob)), np.full(n, len(raw)),
                                            np.full(n, crc), rec_off, rec_bytes]).astype(np.int64))
        self._pending, self._pending_bytes, self._pending_key = [], 0, None

    def close(self) -> dict:
        """Flush, write the index; returns the metadata that trace.yaml records for these selections."""
        self._flush()
        self._fh.close()
        idx = np.concatenate(self._index) if self._index else np.zeros((0, len(INDEX_COLUMNS)), np.int64)
        types = {"group": pa.int32(), "num_query_tokens": pa.int32(), "block_bytes": pa.int64(),
                 "block_raw_bytes": pa.int64(), "block_crc32": pa.uint32(), "record_offset": pa.int64(),
                 "record_bytes": pa.int64()}
        arrays = [pa.array(idx[:, i].astype(np.uint32) if c == "block_crc32" else idx[:, i], type=types.get(c, pa.int64()))
                  for i, c in enumerate(INDEX_COLUMNS)]
        table = pa.table(arrays, names=list(INDEX_COLUMNS))
        table = table.replace_schema_metadata({"ulacache_schema_version": str(SCHEMA_VERSION), "codec": self.codec})
        pq.write_table(table, self.dir / INDEX_FILE, compression="zstd" if self.codec == "zstd" else "none")
        return {"kind": "captured", "file": DATA_FILE, "index": INDEX_FILE, "codec": self.codec,
                "num_groups": self.max_group + 1, "top_k": self.max_count, "num_records": self.num_records,
                "num_selections": self.num_selections}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self.close()
        else:
            self._fh.close()


def _check_records(rid, step, grp, hist, pos, where: str, names: list[str]) -> None:
    """Range checks with one-line errors naming the record (names[i], e.g. 'record 7' or 'line 12')."""
    def name(i: int) -> str:
        return names[i]

    for arr, what, hi in ((rid, "request_id", _MAX_RID), (step, "step", _MAX_STEP), (grp, "group", _MAX_GROUP),
                          (hist, "history_len", None)):
        bad = np.flatnonzero((arr < 0) | ((arr > hi) if hi is not None else False))
        if bad.size:
            i = int(bad[0])
            raise TraceError(f"{where}: {name(i)}: {what} {int(arr[i])} out of range [0, {hi if hi else 'inf'}]")
    neg = pos < -1
    if neg.any():
        i = int(np.flatnonzero(neg.any(axis=(1, 2)))[0])
        raise TraceError(f"{where}: {name(i)}: negative position {int(pos[i][neg[i]][0])} (only -1 pads)")
    beyond = pos >= hist[:, None, None]
    if beyond.any():
        i = int(np.flatnonzero(beyond.any(axis=(1, 2)))[0])
        raise TraceError(f"{where}: {name(i)}: position {int(pos[i][beyond[i]][0])} beyond the history "
                         f"(history_len {int(hist[i])})")
    srt = np.sort(pos, axis=-1)
    dup = (srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)
    if dup.any():
        i = int(np.flatnonzero(dup.any(axis=(1, 2)))[0])
        raise TraceError(f"{where}: {name(i)}: duplicate position {int(srt[i][..., 1:][dup[i]][0])} in one set")


class CapturedSelections:
    """SelectionSource over a captured selections file: random access by (request, step, group), block cache.

    Positions at or beyond the requested history_len (a replay whose history runs shorter than the captured one)
    become -1 padding; asking for a (request, step, group) that was not captured, or for more query tokens than
    were captured, is an error.
    """

    kind = "captured"

    def __init__(self, data_path, index_path, num_groups: int | None = None, top_k: int | None = None,
                 cache_blocks: int = 512):
        self.data_path = Path(data_path)
        self.index_path = Path(index_path)
        self.index = read_index(self.index_path)
        _check_header(self.data_path)
        size = self.data_path.stat().st_size
        ends = self.index["block_offset"].to_numpy() + self.index["block_bytes"].to_numpy()
        if ends.size and int(ends.max()) > size:
            i = int(np.argmax(ends > size))
            raise TraceError(f"{self.data_path}: truncated: record {i} ({self._name(i)}) ends at byte "
                             f"{int(ends[i])} but the file has {size} bytes")
        keys = _key(self.index["request_id"], self.index["step"], self.index["group"])
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._order = order
        self._cols = {c: self.index[c].to_numpy() for c in INDEX_COLUMNS}
        self.num_groups = int(num_groups if num_groups is not None else (self._cols["group"].max() + 1 if len(keys) else 0))
        self.top_k = int(top_k) if top_k is not None else 2048
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._cache_blocks = cache_blocks
        self._fh = None

    def _name(self, i: int) -> str:
        c = self.index
        return f"request {int(c['request_id'].iloc[i])} step {int(c['step'].iloc[i])} group {int(c['group'].iloc[i])}"

    def _block(self, i: int) -> bytes:
        off = int(self._cols["block_offset"][i])
        raw = self._cache.get(off)
        if raw is not None:
            self._cache.move_to_end(off)
            return raw
        if self._fh is None:
            self._fh = open(self.data_path, "rb")
        nbytes = int(self._cols["block_bytes"][i])
        self._fh.seek(off)
        blob = self._fh.read(nbytes)
        where = f"{self.data_path}: block at byte {off} (record {i}: {self._name(i)})"
        if len(blob) != nbytes:
            raise TraceError(f"{where}: truncated")
        if zlib.crc32(blob) != int(self._cols["block_crc32"][i]):
            raise TraceError(f"{where}: checksum mismatch (corrupt file)")
        codec = self.index.attrs.get("codec", "zstd")
        try:
            raw = blob if codec == "none" else pa.decompress(blob, int(self._cols["block_raw_bytes"][i]),
                                                             codec=codec, asbytes=True)
        except (OSError, pa.ArrowException) as exc:
            raise TraceError(f"{where}: cannot decompress ({' '.join(str(exc).split())})") from None
        self._cache[off] = raw
        if len(self._cache) > self._cache_blocks:
            self._cache.popitem(last=False)
        return raw

    def record(self, i: int) -> tuple[list[np.ndarray], int]:
        """(sorted positions per query token, history_len) of index row i."""
        raw = self._block(i)
        a = int(self._cols["record_offset"][i])
        b = a + int(self._cols["record_bytes"][i])
        where = f"{self.data_path}: record {i} ({self._name(i)})"
        if b > len(raw):
            raise TraceError(f"{where}: record runs past its block")
        rows = _decode_record(memoryview(raw)[a:b], int(self._cols["num_query_tokens"][i]), where)
        hist = int(self._cols["history_len"][i])
        for r in rows:
            if r.size and (r[0] < 0 or r[-1] >= hist):
                raise TraceError(f"{where}: position {int(r[-1] if r[-1] >= hist else r[0])} outside the history "
                                 f"[0, {hist})")
        return rows, hist

    def lookup(self, request_ids, steps, group: int) -> np.ndarray:
        """Index rows of (request, step, group) keys; TraceError naming the first key that was not captured."""
        keys = _key(request_ids, steps, np.full(np.size(request_ids), group))
        at = np.searchsorted(self._keys, keys)
        at = np.minimum(at, max(self._keys.size - 1, 0))
        found = self._keys.size > 0
        miss = ~(self._keys[at] == keys) if found else np.ones(keys.size, bool)
        if miss.any():
            j = int(np.flatnonzero(miss)[0])
            raise TraceError(f"{self.data_path}: no captured selections for request {int(np.ravel(request_ids)[j])} "
                             f"step {int(np.ravel(steps)[j])} group {group}")
        return self._order[at]

    def select(self, request_ids, history_lens, steps, group: int, num_query_tokens: int) -> np.ndarray:
        from traces.synthetic import check_select_args

        rid, hist, step, q = check_select_args(request_ids, history_lens, steps, num_query_tokens)
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or not 0 <= group < self.num_groups:
            raise TraceError(f"group {group!r} out of range [0, {self.num_groups})")
        out = np.full((rid.size, q, self.top_k), -1, dtype=np.int64)
        if rid.size == 0:
            return out
        rows = self.lookup(rid, step, int(group))
        for j, i in enumerate(rows.tolist()):  # one record per request: decode cost dominates, not the loop
            stored_q = int(self._cols["num_query_tokens"][i])
            if q > stored_q:
                raise TraceError(f"{self.data_path}: record {i} ({self._name(i)}) has {stored_q} query tokens, "
                                 f"{q} requested")
            sets, _ = self.record(i)
            for qi in range(q):
                p = sets[qi][sets[qi] < hist[j]][: self.top_k]
                out[j, qi, : p.size] = p
        return out

    def iter_records(self):
        """Stream every record in file order: dicts of request_id, step, group, history_len, positions (list)."""
        order = np.lexsort((self._cols["record_offset"], self._cols["block_offset"]))
        for i in order.tolist():
            sets, hist = self.record(i)
            yield {"request_id": int(self._cols["request_id"][i]), "step": int(self._cols["step"][i]),
                   "group": int(self._cols["group"][i]), "history_len": hist, "positions": sets}

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _check_header(path: Path) -> None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(HEADER_BYTES)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    if len(head) < HEADER_BYTES or head[:6] != MAGIC[:6]:
        raise TraceError(f"{path}: not a ulacache selections file (bad header)")
    version = int.from_bytes(head[8:16], "little")
    if version != SCHEMA_VERSION or head[6:8] != MAGIC[6:8]:
        raise TraceError(f"{path}: unknown selections schema version {version} (this reader knows {SCHEMA_VERSION})")


def read_index(path: Path) -> pd.DataFrame:
    """The record index (validated columns); codec in .attrs."""
    path = Path(path)
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, pa.ArrowException) as exc:
        raise TraceError(f"{path}: unreadable index ({' '.join(str(exc).split())[:200]})") from None
    md = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    version = md.get("ulacache_schema_version")
    if version != str(SCHEMA_VERSION):
        raise TraceError(f"{path}: unknown selections index schema version {version!r} (this reader knows "
                         f"{SCHEMA_VERSION})")
    missing = [c for c in INDEX_COLUMNS if c not in table.column_names]
    if missing:
        raise TraceError(f"{path}: missing index column(s) {', '.join(missing)}")
    df = table.to_pandas()
    df.attrs["codec"] = md.get("codec", "zstd")
    if df.attrs["codec"] not in CODECS:
        raise TraceError(f"{path}: unknown codec '{df.attrs['codec']}'")
    return df


# ---------------------------------------------------------------------------------------------------- converter
def convert_capture(capture, out_dir, codec: str = "zstd", batch_records: int = 2048) -> dict:
    """Convert a simple capture (JSONL lines or an NPZ) into the compact format in `out_dir`; returns its metadata.

    JSONL: one object per line with `request`, `step`, `group` (or `layer`), `positions` (a list, or a list of
    lists: one per query token) and optionally `history_len` (default: largest position + 1).
    NPZ: arrays `request`, `step`, `group` (or `layer`) [N], `positions` [N, K] or [N, Q, K] with -1 padding, and
    optionally `history_len` [N]. Streams JSONL in batches; errors name the file and the line or record.
    """
    capture = Path(capture)
    if not capture.exists():
        raise TraceError(f"{capture}: no such file")
    writer = SelectionWriter(out_dir, codec=codec)
    try:
        if capture.suffix.lower() == ".npz":
            _convert_npz(capture, writer)
        else:
            _convert_jsonl(capture, writer, batch_records)
        if writer.num_records == 0:
            raise TraceError(f"{capture}: no records")
    except BaseException:
        writer._fh.close()
        raise
    return writer.close()


def _integers(a: np.ndarray, path: Path, name: str) -> np.ndarray:
    """An NPZ array as int64: integer dtypes, or floats holding whole numbers within int64 (1.5 is refused)."""
    if a.dtype.kind in "iu":
        if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
            raise TraceError(f"{path}: array '{name}' holds values beyond int64")
        return a.astype(np.int64)
    if a.dtype.kind == "f":
        ok = np.isfinite(a) & (a == np.round(a)) & (np.abs(a) < 2.0**63)
        if not ok.all():
            bad = a.reshape(-1)[np.flatnonzero(~ok.reshape(-1))[0]]
            raise TraceError(f"{path}: array '{name}' must hold integers, found {float(bad)!r}")
        return a.astype(np.int64)
    raise TraceError(f"{path}: array '{name}' must hold integers, has dtype {a.dtype}")


def _convert_npz(path: Path, writer: SelectionWriter) -> None:
    try:
        z = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - numpy raises many kinds for a corrupt archive
        raise TraceError(f"{path}: not a readable NPZ ({' '.join(str(exc).split())[:120]})") from None
    with z:
        names = set(z.files)
        grp_name = "group" if "group" in names else "layer"
        for need in ("request", "step", grp_name, "positions"):
            if need not in names:
                raise TraceError(f"{path}: missing array '{need}' (have: {', '.join(sorted(names))})")
        try:
            keys = ["request", "step", grp_name, "positions"] + (["history_len"] if "history_len" in names else [])
            rid, step, grp, pos, *rest = (_integers(np.asarray(z[k]), path, k) for k in keys)
            hist = rest[0] if rest else None
        except (ValueError, TypeError, OSError, zlib.error) as exc:
            if isinstance(exc, TraceError):
                raise
            raise TraceError(f"{path}: corrupt or non-integer array ({' '.join(str(exc).split())[:120]})") from None
    if pos.ndim == 2:
        pos = pos[:, None, :]
    n = rid.size
    if pos.ndim != 3 or pos.shape[0] != n or step.size != n or grp.size != n or (hist is not None and hist.size != n):
        raise TraceError(f"{path}: arrays disagree in length (request {n}, positions {pos.shape})")
    if hist is None:
        hist = pos.max(axis=(1, 2)) + 1
    order = np.lexsort((grp, step, rid))  # blocks of whole (request, step)s
    for a in range(0, n, 4096):
        sel = order[a:a + 4096]
        writer.add(rid[sel], step[sel], grp[sel], hist[sel], pos[sel], str(path), [f"record {i}" for i in sel])


def _convert_jsonl(path: Path, writer: SelectionWriter, batch: int) -> None:
    buf: list[tuple[int, int, int, int, int, list]] = []

    def flush():
        if not buf:
            return
        q = max(len(b[5]) for b in buf)
        k = max(max((len(r) for r in b[5]), default=0) for b in buf)
        pos = np.full((len(buf), q, max(k, 1)), -1, dtype=np.int64)
        for i, b in enumerate(buf):
            for qi, row in enumerate(b[5]):
                pos[i, qi, :len(row)] = row
        names = [f"line {b[0]}" for b in buf]
        arr = np.array([b[1:5] for b in buf], dtype=np.int64)
        hist = arr[:, 3]
        unknown = hist < 0
        hist[unknown] = pos[unknown].max(axis=(1, 2)) + 1
        writer.add(arr[:, 0], arr[:, 1], arr[:, 2], hist, pos, str(path), names)
        buf.clear()

    for n, r in iter_jsonl(path):
        g = r.get("group", r.get("layer"))
        for key, val in (("request", r.get("request")), ("step", r.get("step")), ("group/layer", g)):
            if isinstance(val, bool) or not isinstance(val, int) or not 0 <= val < 1 << 62:
                raise TraceError(f"{path}: line {n}: '{key}' must be a non-negative integer, got {val!r}")
        p = r.get("positions")
        if not isinstance(p, list):
            raise TraceError(f"{path}: line {n}: 'positions' must be a list")
        rows = p if p and isinstance(p[0], list) else [p]
        for row in rows:
            if not isinstance(row, list) or not all(type(x) is int and -(1 << 62) < x < 1 << 62 for x in row):
                raise TraceError(f"{path}: line {n}: positions must be integers")
        h = r.get("history_len", -1)
        if type(h) is not int or h >= 1 << 62 or (h < 0 and "history_len" in r):
            raise TraceError(f"{path}: line {n}: history_len must be a non-negative integer, got {h!r}")
        if buf and len(rows) != len(buf[-1][5]):
            flush()  # batches hold one query-token count
        buf.append((n, r["request"], r["step"], g, h, rows))
        if len(buf) >= batch:
            flush()
    flush()


def capture_from_source(source, requests: pd.DataFrame, out_dir, num_steps: int, num_query_tokens: int = 1,
                        tokens_per_step: int = 1, codec: str = "zstd", batch_requests: int = 32) -> dict:
    """Materialize a SelectionSource into the compact format: for each request, steps 0..num_steps-1 (at most its
    output length), history = input_tokens + step * tokens_per_step, every group. Returns the selections metadata."""
    if num_steps < 1 or num_query_tokens < 1 or tokens_per_step < 1:
        raise TraceError("capture needs num_steps, num_query_tokens and tokens_per_step >= 1")
    ng = int(source.num_groups)
    writer = SelectionWriter(out_dir, codec=codec)
    rid_all = requests["request_id"].to_numpy(np.int64)
    inp_all = requests["input_tokens"].to_numpy(np.int64)
    nst_all = np.minimum(num_steps, np.maximum(requests["output_tokens"].to_numpy(np.int64) // tokens_per_step, 1))
    for a in range(0, rid_all.size, batch_requests):
        rid, inp, nst = rid_all[a:a + batch_requests], inp_all[a:a + batch_requests], nst_all[a:a + batch_requests]
        for s in range(int(nst.max()) if nst.size else 0):
            live = nst > s
            r, h = rid[live], inp[live] + s * tokens_per_step
            st = np.full(r.size, s, np.int64)
            pos = np.stack([source.select(r, h, st, g, num_query_tokens) for g in range(ng)], 1)  # [R, G, Q, K]
            n = r.size * ng
            writer.add(np.repeat(r, ng), np.full(n, s), np.tile(np.arange(ng), r.size), np.repeat(h, ng),
                       pos.reshape(n, num_query_tokens, -1))
    meta = writer.close()
    meta["num_groups"] = ng
    meta["top_k"] = int(source.top_k)
    return meta
