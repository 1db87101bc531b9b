"""The node on simpy: GPUs (a compute stream and a copy stream each), one PCIe link per GPU per direction and one
NVLink port per GPU per direction.

A `Link` is a processor-sharing server: the n transfers on a link each progress at bandwidth / n; its per-transfer
latency is added by the caller after the transfers it waits for (latency is not occupancy). Instead of a polling process the link keeps one pending
wake-up (a simpy timeout for the earliest completion) and re-plans it whenever a transfer joins or leaves, so the
event count is O(transfers), not O(time).
"""
from __future__ import annotations

import simpy

from sim.events import TraceRecorder


class _Count:
    """Drop-in for simpy's event-id counter that also tells how many events were scheduled."""

    def __init__(self):
        self.n = 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        self.n += 1
        return self.n


def make_env() -> simpy.Environment:
    env = simpy.Environment()
    env._eid = _Count()
    return env


def events_scheduled(env: simpy.Environment) -> int:
    return env._eid.n if isinstance(env._eid, _Count) else 0


class Link:
    """A processor-sharing link of `bw_bytes_s` with a fixed per-transfer latency."""

    def __init__(self, env: simpy.Environment, name: str, bw_bytes_s: float, latency_s: float,
                 recorder: TraceRecorder | None = None):
        self.env, self.name, self.bw, self.latency = env, name, float(bw_bytes_s), float(latency_s)
        self.recorder = recorder
        self._active: dict[int, list] = {}  # id -> [remaining bytes, done event, start time, label, bytes]
        self._last = 0.0
        self._version = 0
        self._wake_at: float | None = None
        self._next_id = 0
        self.bytes_total = 0.0
        self.busy_s = 0.0

    def transfer(self, num_bytes: float, label: str = "") -> simpy.Event:
        """Start a transfer of `num_bytes` (occupancy bytes); the event fires when its bytes are through. The
        per-transfer `latency` is not link occupancy: the caller adds it once per batch of concurrent transfers."""
        done = self.env.event()
        if num_bytes <= 0:
            done.succeed()
            return done
        self.bytes_total += num_bytes
        entry = [float(num_bytes), done, self.env.now, label, float(num_bytes)]
        self._join(entry)
        return done

    def _advance(self):
        now = self.env.now
        n = len(self._active)
        if n and now > self._last:
            share = (now - self._last) * self.bw / n
            for entry in self._active.values():
                entry[0] -= share
            self.busy_s += now - self._last
        self._last = now

    def _join(self, entry):
        self._advance()
        self._active[self._next_id] = entry
        self._next_id += 1
        self._plan_wake()

    def _plan_wake(self):
        """Make sure a wake-up is pending no later than the earliest completion. A join only delays the others'
        completions, so an already pending earlier wake-up stays valid (it re-plans when it fires)."""
        if not self._active:
            return
        n = len(self._active)
        remaining = min(e[0] for e in self._active.values())
        at = self.env.now + max(0.0, remaining * n / self.bw)
        if self._wake_at is not None and self._wake_at <= at + 1e-15:
            return
        self._wake_at = at
        self._version += 1
        version = self._version
        self.env.timeout(at - self.env.now).callbacks.append(lambda _e: self._wake(version))

    def _wake(self, version: int):
        if version != self._version:
            return  # superseded by an earlier wake-up
        self._wake_at = None
        self._advance()
        # done when what is left is float noise of the transfer's own size, or would take less than the clock's
        # resolution (float time grows with the run); an absolute byte floor would end small transfers early
        n = len(self._active)
        clock_eps = self.bw * max(1e-12, abs(self.env.now) * 1e-12) / max(n, 1)
        finished = [k for k, e in self._active.items() if e[0] <= max(e[4] * 1e-9, clock_eps)]
        for key in finished:
            entry = self._active.pop(key)
            if self.recorder is not None:
                self.recorder.span(self.name, entry[3] or "transfer", entry[2], self.env.now,
                                   {"bytes": round(entry[4])})
            entry[1].succeed()
        self._plan_wake()


class Barrier:
    """All `n` parties arrive, then everyone continues (a per-layer collective synchronises the ranks)."""

    def __init__(self, env: simpy.Environment, n: int):
        self.env, self.n = env, n
        self._count = 0
        self.event = env.event()
        self.arrivals: list[tuple[float, int]] = []

    def arrive(self, rank: int) -> simpy.Event:
        self._count += 1
        self.arrivals.append((self.env.now, rank))
        if self._count == self.n:
            self.event.succeed()
        return self.event


class Node:
    """N GPUs with their links; the engine drives per-rank processes on it."""

    def __init__(self, env: simpy.Environment, num_gpus: int, costs, recorder: TraceRecorder | None = None):
        v = costs.values
        self.env, self.num_gpus = env, num_gpus
        self.h2d = [Link(env, f"gpu{r} pcie h2d", v["pcie_h2d_bw_bytes_s"], v["pcie_latency_s"], recorder)
                    for r in range(num_gpus)]
        self.d2h = [Link(env, f"gpu{r} pcie d2h", v["pcie_d2h_bw_bytes_s"], v["pcie_latency_s"], recorder)
                    for r in range(num_gpus)]
        self.nvlink = [Link(env, f"gpu{r} nvlink in", v["nvlink_bw_bytes_s"], v["nvlink_latency_s"], recorder)
                       for r in range(num_gpus)]
