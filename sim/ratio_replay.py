"""Recorded policy ratios, played back: a full-fidelity run's timing from its indexer groups' separate replays.

The policy reaches the engine only through the ratios its runner returns at each policy step (per group: hits,
misses, unique references ... per reference, and the link rows per rank) and the prompt rows it places at each
admission. A replay with `fidelity.only_group=g` computes group g's ratios exactly as the full run would (the
groups are independent caches fed the same selections), so where the decode batches do not depend on the hits:

    replay(only_group=g, ratio_log=RatioLog())   for g in 0..G-1     -> G logs (one group's ratios per step)
    replay(full, ratio_player=RatioPlayer(logs))                      -> the full run, every step timed with
                                                                         all G groups' ratios at once

The player checks each step's batch (its requests and their histories) against what every log saw, and stops
with a one-line error where they differ (there the schedule depends on the hits and the logs do not apply). A log
may also be written as it grows (`RatioLog(stream=path)`) and played while its replay still runs
(`sim/ratio_stream.py`): the playback then ends just after the slowest group, not a whole playback later.

Log layout (one .npz per replay; R = ranks):

    steps  int64[S]          the decode step of each policy call
    sigs   int64[S]          crc32 of the batch's request ids and histories at that call
    groups int64[G']         the groups recorded (one for an only_group replay)
    vals   float64[S,G',7+3R] unique hits misses exchanges local_hits peer_fetches passes | h2d[R] d2h[R] peer[R]
    admit  float64[A,3]      request id, prompt rows (scaled), the sampled requests' own prompt rows
    end    float64[3]        policy calls, batch splits, buffer peak rows
"""
from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

from sim.ratio_stream import SCALARS, StreamWriter


def batch_sig(rids, hist) -> int:
    """What identifies a step's batch: its request ids and their histories, in order."""
    ids = np.ascontiguousarray(np.asarray(rids, dtype=np.int64))
    h = np.ascontiguousarray(np.asarray(hist, dtype=np.int64))
    return zlib.crc32(h.tobytes(), zlib.crc32(ids.tobytes()))


def pack(rt: dict) -> np.ndarray:
    """One group's ratios as a row: the scalars, then its links (float64[3, R]) flattened."""
    return np.concatenate([np.array([float(rt[k]) for k in SCALARS]), np.asarray(rt["links"], float).ravel()])


def unpack(row: np.ndarray, num_ranks: int) -> dict:
    """A row back into the ratios dict the engine reads (the links as one array, h2d/d2h/peer its rows)."""
    out = {k: float(v) for k, v in zip(SCALARS, row[:len(SCALARS)].tolist())}
    links = np.array(row[len(SCALARS):], dtype=float).reshape(3, num_ranks)
    out["h2d"], out["d2h"], out["peer"] = links
    out["links"] = links
    return out


class RatioLog:
    """What one replay's policy runner returned: pass it as `sim.replay(ratio_log=...)`, then `save` it. With
    `stream`, each record is also appended to that file as it is made (sim/ratio_stream.py reads it meanwhile)."""

    def __init__(self, stream: Path | None = None):
        self.groups: list[int] = []
        self.num_ranks = 0
        self.steps: list[int] = []
        self.sigs: list[int] = []
        self.vals: list[np.ndarray] = []
        self.admits: list[tuple[float, float, float]] = []
        self.end = np.zeros(3)
        self._stream_path, self._writer = stream, None
        self._admit_map: dict[int, tuple[float, float]] | None = None  # (built from `admits` on the first read)

    def recording(self, runner) -> _Recording:
        """`runner` wrapped: every call passes through; its policy steps and admissions are written here."""
        self.groups = [int(g) for g in runner.groups]
        self.num_ranks = int(runner.num_ranks)
        if self._stream_path is not None:
            self._writer = StreamWriter(self._stream_path, self.groups, self.num_ranks)
        return _Recording(runner, self)

    # ---- what the recording runner adds (and streams)
    def add_step(self, step: int, sig: int, rows: np.ndarray) -> None:
        self.steps.append(step)
        self.sigs.append(sig)
        self.vals.append(rows)
        if self._writer is not None:
            self._writer.step(step, sig, rows)

    def add_admit(self, rid: int, rows: float, own: float) -> None:
        self.admits.append((float(rid), rows, own))
        if self._writer is not None:
            self._writer.admit(rid, rows, own)

    def finish(self, end: np.ndarray) -> None:
        self.end = end
        if self._writer is not None:
            self._writer.end(end)
            self._writer = None

    # ---- a finished log as the player reads it (sim/ratio_stream.RatioStream reads a growing one the same way)
    def step_at(self, i: int):
        """(decode step, batch signature, rows) of the i-th policy step; None past the last."""
        return (self.steps[i], self.sigs[i], self.vals[i]) if i < len(self.steps) else None

    def admit_rows(self, rid: int) -> tuple[float, float]:
        if self._admit_map is None:
            self._admit_map = {int(r): (a, b) for r, a, b in self.admits}
        return self._admit_map.get(int(rid), (0.0, 0.0))

    def end_vals(self) -> np.ndarray:
        return np.asarray(self.end, dtype=float)

    def save(self, path: Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npz")
        vals = np.stack(self.vals) if self.vals else np.zeros((0, len(self.groups), len(SCALARS)))
        np.savez_compressed(tmp, steps=np.array(self.steps, np.int64), sigs=np.array(self.sigs, np.int64),
                            groups=np.array(self.groups, np.int64), vals=vals,
                            admit=np.array(self.admits, float).reshape(-1, 3), end=self.end)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> RatioLog:
        try:
            with np.load(Path(path)) as z:
                log = cls()
                log.steps, log.sigs = z["steps"].tolist(), z["sigs"].tolist()
                log.groups = z["groups"].tolist()
                log.vals = list(z["vals"])
                log.admits = [tuple(r) for r in z["admit"].tolist()]
                log.end = z["end"]
                width = z["vals"].shape[-1]
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"{path}: not a ratio log ({e})") from None
        log.num_ranks = (width - len(SCALARS)) // 3
        return log


class _Recording:
    """A policy runner that writes its steps and admissions to a `RatioLog` (every other attribute is the runner's)."""

    def __init__(self, runner, log: RatioLog):
        self._runner, self._log, self._step = runner, log, 0

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def due(self, step: int) -> bool:
        self._step = step
        return self._runner.due(step)

    def run_step(self, rids, hist, steps, q, spaces, rid_ranks) -> dict:
        out = self._runner.run_step(rids, hist, steps, q, spaces, rid_ranks)
        log = self._log
        log.add_step(self._step, batch_sig(rids, hist), np.stack([pack(out[g]) for g in log.groups]))
        return out

    def admit(self, rid: int, *args, **kwargs):
        r = self._runner
        rows, own = r.prompt_rows, r.prompt_rows_own
        placed = r.admit(rid, *args, **kwargs)
        self._log.add_admit(rid, r.prompt_rows - rows, r.prompt_rows_own - own)
        return placed

    def _finish(self) -> None:
        r = self._runner
        self._log.finish(np.array([r.policy_calls, r.capacity_splits, r.buffer_peak_rows], dtype=float))

    def close(self) -> None:
        self._finish()
        self._runner.close()

    def kill(self) -> None:
        self._finish()
        self._runner.kill()


class RatioPlayer:
    """A policy runner that plays back every group's recorded ratios (`RatioLog`s of their own replays, or
    `RatioStream`s of replays still running): pass it as `sim.replay(ratio_player=...)` on the full-fidelity config.
    It holds no cache; admissions add the prompt rows the first group's log recorded (the runner counts its first
    group's), as the full run does."""

    def __init__(self, logs: list):
        if not logs:
            raise ValueError("ratio replay: no ratio logs")
        self._cols = []  # (group, its source, its row in the source's rows), in group order
        for log in logs:
            self._cols += [(int(g), log, j) for j, g in enumerate(log.groups)]
        self._cols.sort(key=lambda c: c[0])
        self.groups = [c[0] for c in self._cols]
        dup = sorted({g for g in self.groups if self.groups.count(g) > 1})
        if dup:
            raise ValueError(f"ratio replay: group {dup[0]} is in two logs")
        finished = [log for log in logs if isinstance(log, RatioLog)]
        for log in finished[1:]:
            if log.steps != finished[0].steps or log.sigs != finished[0].sigs:
                raise ValueError(_DIFFERENT)
        self._logs, self._head = logs, self._cols[0][1]
        self.num_ranks = logs[0].num_ranks
        self.group_of = np.array(self.groups, dtype=np.int64)
        self.k, self.ks, self.pilot_left, self.processes_used = 1, 1.0, 0, 1
        self.probe_step_s, self.device, self.worker_rss_bytes, self.worker_device_bytes = None, False, 0, 0
        self.policy_calls = self.capacity_splits = 0
        self.buffer_peak_rows = 0.0
        self.prompt_rows = self.prompt_rows_own = 0.0
        self.sampled: dict[int, int] = {}  # rid -> rank: at full fidelity every running request
        self.last: dict[int, dict] = {}
        self._step, self._i = 0, 0

    def check(self, num_groups: int) -> None:
        """Every one of the config's indexer groups has a log."""
        if self.groups != list(range(num_groups)):
            missing = sorted(set(range(num_groups)) - set(self.groups))
            raise ValueError(f"ratio replay: the config has {num_groups} indexer groups; the logs hold "
                             f"{len(self.groups)} (missing {missing[:8]})")

    def due(self, step: int) -> bool:
        self._step = step
        nxt = self._head.step_at(self._i)
        if nxt is None:
            raise ValueError(f"ratio replay: the logs end before decode step {step}")
        return nxt[0] == step

    def run_step(self, rids, hist, steps, q, spaces, rid_ranks) -> dict:
        sig, i, n = batch_sig(rids, hist), self._i, self.num_ranks
        out, seen = {}, {}
        for g, log, j in self._cols:
            rec = seen.get(id(log))
            if rec is None:
                rec = seen[id(log)] = log.step_at(i)
                if rec is None or rec[0] != self._step:
                    raise ValueError(_DIFFERENT)
                if rec[1] != sig:
                    raise ValueError(f"ratio replay: decode step {self._step} batches other requests than the logs "
                                     "saw (the schedule depends on the hits; their ratios do not combine)")
            out[g] = unpack(rec[2][j], n)
        self._i += 1
        self.last = out
        return out

    def admit(self, rid: int, space: int, rank: int, *args, **kwargs) -> bool:
        self.sampled[int(rid)] = rank
        rows, own = self._head.admit_rows(rid)
        self.prompt_rows += rows
        self.prompt_rows_own += own
        return True

    def grow(self, rids, counts) -> None:
        """(No cache: the logs hold what growth did.)"""

    def release(self, rid: int) -> None:
        self.sampled.pop(int(rid), None)

    def device_pool_bytes(self) -> int:
        return 0

    def close(self) -> None:
        """The logs' end totals (a stream's are there once its replay ended)."""
        ends = np.array([log.end_vals() for log in self._logs])
        self.policy_calls, self.capacity_splits = int(ends[:, 0].sum()), int(ends[:, 1].sum())
        self.buffer_peak_rows = float(ends[:, 2].max())

    def kill(self) -> None:
        """(A failed run: nothing to wait for.)"""


_DIFFERENT = ("ratio replay: the logs saw different decode batches (the schedule depends on the hits; their ratios "
              "do not combine)")
