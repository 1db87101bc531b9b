"""libCacheSim (the `libcachesim` package, optional extra `peers`) as a peer: LRU, S3-FIFO, ARC and Belady's
offline optimum on a `ReferenceStream`.

The stream is written once as a libCacheSim oracleGeneral binary trace (per request: uint32 clock time, uint64
object id, uint32 size, int64 index of the next reference of that object or INT64_MAX; 24 packed bytes) and run
through the package's C reader, so a policy processes millions of references per second. Object size is 1: the
cache size is a number of token slots. Warm-up: the first `warmup_refs` references are processed but not counted.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

# our name -> libcachesim class name
PEERS = {"lcs-lru": "LRU", "lcs-s3fifo": "S3FIFO", "lcs-arc": "ARC", "belady": "Belady"}
ORACLE_DTYPE = np.dtype([("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"), ("next_access_vtime", "<i8")])


def available() -> str | None:
    """The installed libcachesim version, or None when the extra is absent."""
    try:
        import libcachesim
    except ImportError:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("libcachesim")
    except PackageNotFoundError:
        return str(getattr(libcachesim, "__version__", "unknown"))


def write_oracle_trace(path: Path, ids: np.ndarray, next_use: np.ndarray) -> Path:
    """The stream as an oracleGeneral binary trace (object id = id + 1: libCacheSim reserves no id, we keep 0 free)."""
    rec = np.zeros(ids.size, ORACLE_DTYPE)
    rec["clock_time"] = np.arange(1, ids.size + 1, dtype=np.uint64).astype(np.uint32)
    rec["obj_id"] = ids.astype(np.uint64) + 1
    rec["obj_size"] = 1
    rec["next_access_vtime"] = next_use
    rec.tofile(path)
    return path


class PeerRunner:
    """Runs libCacheSim policies on one stream (its trace file lives in a temporary directory until `close`)."""

    def __init__(self, stream):
        import libcachesim  # noqa: F401 - fail here, before any work, when the extra is absent

        self.stream = stream
        self._dir = tempfile.TemporaryDirectory(prefix="ulacache-peers-")
        self.path = write_oracle_trace(Path(self._dir.name) / "stream.oracleGeneral.bin", stream.ids,
                                       stream.next_use())

    def close(self) -> None:
        self._dir.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _cache_and_reader(self, policy: str, cache_slots: int):
        import libcachesim as lcs

        cache = getattr(lcs, PEERS[policy])(cache_size=int(cache_slots))
        reader = lcs.TraceReader(str(self.path), lcs.TraceType.ORACLE_GENERAL_TRACE)
        return cache, reader

    def hits(self, policy: str, cache_slots: int, warmup_refs: int) -> int:
        """Hits among the references from `warmup_refs` on (the cache warmed on the ones before)."""
        n = int(self.stream.ids.size)
        cache, reader = self._cache_and_reader(policy, cache_slots)
        if warmup_refs > 0:
            cache.process_trace(reader, 0, int(warmup_refs))
        counted = n - int(warmup_refs)
        if counted <= 0:
            return 0
        miss_ratio, _ = cache.process_trace(reader, int(warmup_refs), counted)
        return int(round((1.0 - miss_ratio) * counted))

    def batch_hits(self, policy: str, cache_slots: int) -> np.ndarray:
        """Hits per batch (one process_trace call per batch on the same cache)."""
        cache, reader = self._cache_and_reader(policy, cache_slots)
        b = self.stream.bounds
        out = np.zeros(b.size - 1, np.int64)
        for i in range(b.size - 1):
            n = int(b[i + 1] - b[i])
            if n:
                miss_ratio, _ = cache.process_trace(reader, int(b[i]), n)
                out[i] = int(round((1.0 - miss_ratio) * n))
        return out


def hit_mask(policy: str, ids: np.ndarray, cache_slots: int) -> np.ndarray:
    """Per-reference hits of a libCacheSim policy (no Belady: it needs next-use times), one `get` per reference;
    for small streams (tests)."""
    import libcachesim as lcs

    cache = getattr(lcs, PEERS[policy])(cache_size=int(cache_slots))
    req = lcs.Request()
    req.obj_size = 1
    out = np.zeros(ids.size, bool)
    for i, x in enumerate(ids.tolist()):
        req.obj_id = int(x) + 1
        req.clock_time = i + 1
        out[i] = cache.get(req)
    return out
