"""Recorded policy ratios, played back: a full-fidelity run's timing from its indexer groups' separate replays.

The policy reaches the engine only through the ratios its runner returns at each policy step (per group: hits,
misses, unique references ... per reference, and the link rows per rank) and the prompt rows it places at each
admission. A replay with `fidelity.only_group=g` computes group g's ratios exactly as the full run would (the
groups are independent caches fed the same selections), so where the decode batches do not depend on the hits:

    replay(only_group=g, ratio_log=RatioLog())   for g in 0..G-1     -> G logs (one group's ratios per step)
    replay(full, ratio_player=RatioPlayer(logs))                      -> the full run, every step timed with
                                                                         all G groups' ratios at once

The player checks each step's batch (its requests and their histories) against what every log saw, and stops
with a one-line error where they differ (there the schedule depends on the hits and the logs do not apply).

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

SCALARS = ("unique", "hits", "misses", "exchanges", "local_hits", "peer_fetches", "passes")


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
    """What one replay's policy runner returned: pass it as `sim.replay(ratio_log=...)`, then `save` it."""

    def __init__(self):
        self.groups: list[int] = []
        self.steps: list[int] = []
        self.sigs: list[int] = []
        self.vals: list[np.ndarray] = []
        self.admits: list[tuple[float, float, float]] = []
        self.end = np.zeros(3)

    def recording(self, runner) -> _Recording:
        """`runner` wrapped: every call passes through; its policy steps and admissions are written here."""
        self.groups = [int(g) for g in runner.groups]
        return _Recording(runner, self)

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
        except (OSError, KeyError, ValueError) as e:
            raise ValueError(f"{path}: not a ratio log ({e})") from None
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
        log.steps.append(self._step)
        log.sigs.append(batch_sig(rids, hist))
        log.vals.append(np.stack([pack(out[g]) for g in log.groups]))
        return out

    def admit(self, rid: int, *args, **kwargs):
        r = self._runner
        rows, own = r.prompt_rows, r.prompt_rows_own
        placed = r.admit(rid, *args, **kwargs)
        self._log.admits.append((float(rid), r.prompt_rows - rows, r.prompt_rows_own - own))
        return placed

    def _finish(self) -> None:
        r = self._runner
        self._log.end = np.array([r.policy_calls, r.capacity_splits, r.buffer_peak_rows], dtype=float)

    def close(self) -> None:
        self._finish()
        self._runner.close()

    def kill(self) -> None:
        self._finish()
        self._runner.kill()


class RatioPlayer:
    """A policy runner that plays back every group's recorded ratios (`RatioLog`s of their own replays): pass it as
    `sim.replay(ratio_player=...)` on the full-fidelity config. It holds no cache; admissions add the prompt rows
    the first group's log recorded (the runner counts its first group's), as the full run does."""

    def __init__(self, logs: list[RatioLog]):
        if not logs:
            raise ValueError("ratio replay: no ratio logs")
        by_group = {}
        for log in logs:
            for j, g in enumerate(log.groups):
                if g in by_group:
                    raise ValueError(f"ratio replay: group {g} is in two logs")
                by_group[g] = (log, j)
        self.groups = sorted(by_group)
        first = logs[0]
        for log in logs[1:]:
            if log.steps != first.steps or log.sigs != first.sigs:
                raise ValueError("ratio replay: the logs saw different decode batches (the schedule depends on the "
                                 "hits; their ratios do not combine)")
        width = first.vals[0].shape[-1] if first.vals else len(SCALARS)
        self.num_ranks = (width - len(SCALARS)) // 3
        self._at = {s: i for i, s in enumerate(first.steps)}
        self._sigs = first.sigs
        self._rows = [(g, by_group[g][0].vals, by_group[g][1]) for g in self.groups]
        head = by_group[self.groups[0]][0]
        self._admits = {int(r[0]): (r[1], r[2]) for r in head.admits}
        ends = np.array([log.end for log in logs])
        self.policy_calls, self.capacity_splits = int(ends[:, 0].sum()), int(ends[:, 1].sum())
        self.buffer_peak_rows = float(ends[:, 2].max())
        self.group_of = np.array(self.groups, dtype=np.int64)
        self.k, self.ks, self.pilot_left, self.processes_used = 1, 1.0, 0, 1
        self.probe_step_s, self.device, self.worker_rss_bytes, self.worker_device_bytes = None, False, 0, 0
        self.prompt_rows = self.prompt_rows_own = 0.0
        self.sampled: dict[int, int] = {}  # rid -> rank: at full fidelity every running request
        self.last: dict[int, dict] = {}
        self._step = 0

    def check(self, num_groups: int) -> None:
        """Every one of the config's indexer groups has a log."""
        if self.groups != list(range(num_groups)):
            missing = sorted(set(range(num_groups)) - set(self.groups))
            raise ValueError(f"ratio replay: the config has {num_groups} indexer groups; the logs hold "
                             f"{len(self.groups)} (missing {missing[:8]})")

    def due(self, step: int) -> bool:
        self._step = step
        return step in self._at

    def run_step(self, rids, hist, steps, q, spaces, rid_ranks) -> dict:
        i = self._at[self._step]
        if batch_sig(rids, hist) != self._sigs[i]:
            raise ValueError(f"ratio replay: decode step {self._step} batches other requests than the logs saw "
                             "(the schedule depends on the hits; their ratios do not combine)")
        n = self.num_ranks
        self.last = {g: unpack(vals[i][j], n) for g, vals, j in self._rows}
        return self.last

    def admit(self, rid: int, space: int, rank: int, *args, **kwargs) -> bool:
        self.sampled[int(rid)] = rank
        rows, own = self._admits.get(int(rid), (0.0, 0.0))
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
        """(Nothing to end.)"""

    kill = close
