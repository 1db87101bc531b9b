"""Ratio logs written as they grow and read while their replays still run (sim/ratio_replay.py).

A group's replay appends each record to its stream file as it makes it; the playback reads every group's stream
and waits where a group is behind, so it ends just after the slowest group's replay. One file per replay:

    header  float64[4 + G']   MAGIC, record width W, ranks R, G', then the G' groups recorded
    record  float64[W]        W = 4 + G' x (7 + 3R); its first value says what it is:
              0 admit:  0, request id, prompt rows (scaled), the sampled requests' own prompt rows, zeros
              1 step:   1, decode step, batch signature (crc32: exact in a float64), 0, then the G' rows
              2 end:    2, policy calls, batch splits, buffer peak rows, zeros

Records are whole float64 arrays written with one call each and flushed, so a reader takes only complete ones.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

# what one group's ratios hold besides its link rows (sim/ratio_replay.py packs them in this order)
SCALARS = ("unique", "hits", "misses", "exchanges", "local_hits", "peer_fetches", "passes")
MAGIC = 7.25e9 + 0.5  # (no count or step number comes out as this)
_ADMIT, _STEP, _END = 0.0, 1.0, 2.0


class StreamWriter:
    """Appends one replay's records to its stream file (truncated first: a rerun starts it again)."""

    def __init__(self, path: Path, groups: list[int], num_ranks: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.width = 4 + len(groups) * (len(SCALARS) + 3 * num_ranks)
        self._f = open(self.path, "wb")
        self._write([MAGIC, self.width, num_ranks, len(groups), *groups])

    def _write(self, values) -> None:
        self._f.write(np.asarray(values, dtype=np.float64).tobytes())
        self._f.flush()

    def _record(self, head: list[float], rows: np.ndarray | None = None) -> None:
        rec = np.zeros(self.width)
        rec[:len(head)] = head
        if rows is not None:
            rec[4:] = np.asarray(rows, dtype=float).ravel()
        self._write(rec)

    def admit(self, rid: int, rows: float, own: float) -> None:
        self._record([_ADMIT, rid, rows, own])

    def step(self, step: int, sig: int, rows: np.ndarray) -> None:
        self._record([_STEP, step, sig, 0.0], rows)

    def end(self, end: np.ndarray) -> None:
        self._record([_END, *np.asarray(end, dtype=float).tolist()])
        self._f.close()


class RatioStream:
    """A stream file read as its replay writes it, with the reads `RatioPlayer` makes of a finished `RatioLog`; each
    waits until the record it needs is there (a `stall_s` without the file growing is an error)."""

    def __init__(self, path: Path, stall_s: float = 3600.0):
        self.path, self.stall_s = Path(path), stall_s
        self._buf = b""
        self._pos = 0
        self._f = None
        self.steps: list[tuple[int, int, np.ndarray]] = []
        self._admits: dict[int, tuple[float, float]] = {}
        self._end = None
        head = self._take(4)
        if head[0] != MAGIC:
            raise ValueError(f"{self.path}: not a ratio stream")
        self.width, self.num_ranks, n = int(head[1]), int(head[2]), int(head[3])
        self.groups = [int(g) for g in self._take(n)]
        self._rows_shape = (n, len(SCALARS) + 3 * self.num_ranks)

    def _take(self, n: int) -> np.ndarray:
        """The next n float64 values of the file, waiting for them."""
        need, waited = n * 8, 0.0
        while len(self._buf) - self._pos < need:
            more = self._read()
            if more:
                waited = 0.0
                continue
            if waited >= self.stall_s:
                raise ValueError(f"{self.path}: no record for {self.stall_s:.0f} s (its replay stopped?)")
            pause = min(0.05, 0.002 + waited / 20)
            time.sleep(pause)
            waited += pause
        out = np.frombuffer(self._buf, dtype=np.float64, count=n, offset=self._pos).copy()
        self._pos += need
        return out

    def _read(self) -> bool:
        if self._f is None:
            if not self.path.exists():
                return False
            self._f = open(self.path, "rb")
        data = self._f.read()
        if data:
            self._buf, self._pos = self._buf[self._pos:] + data, 0  # (what was taken is dropped once per read)
        return bool(data)

    def _next(self) -> bool:
        """Read one more record; False once the end record was read."""
        if self._end is not None:
            return False
        rec = self._take(self.width)
        kind = rec[0]
        if kind == _STEP:
            self.steps.append((int(rec[1]), int(rec[2]), rec[4:].reshape(self._rows_shape)))
        elif kind == _ADMIT:
            self._admits[int(rec[1])] = (float(rec[2]), float(rec[3]))
        elif kind == _END:
            self._end = rec[1:4]
        else:
            raise ValueError(f"{self.path}: a record of unknown kind {kind}")
        return True

    def step_at(self, i: int):
        """(decode step, batch signature, rows) of the i-th policy step, once written; None past the last."""
        while len(self.steps) <= i:
            if not self._next():
                return None
        return self.steps[i]

    def admit_rows(self, rid: int) -> tuple[float, float]:
        while int(rid) not in self._admits:
            if not self._next():
                return 0.0, 0.0
        return self._admits[int(rid)]

    def end_vals(self) -> np.ndarray:
        while self._next():
            pass
        return np.asarray(self._end, dtype=float)
