"""Chrome / Perfetto trace events: GPUs' compute streams and links as tracks (complete 'X' events, microseconds)."""
from __future__ import annotations

import json
from pathlib import Path


class TraceRecorder:
    """Collects spans while `enabled`; tracks are named strings mapped to (pid, tid)."""

    def __init__(self, max_events: int = 2_000_000):
        self.enabled = False
        self.max_events = max_events
        self._events: list[dict] = []
        self._tracks: dict[str, tuple[int, int]] = {}

    def _track(self, name: str) -> tuple[int, int]:
        if name not in self._tracks:
            gpu = name.split(" ")[0]
            pid = int(gpu[3:]) if gpu.startswith("gpu") and gpu[3:].isdigit() else 1000
            self._tracks[name] = (pid, len(self._tracks))
        return self._tracks[name]

    def span(self, track: str, name: str, start_s: float, end_s: float, args: dict | None = None):
        if not self.enabled or len(self._events) >= self.max_events or end_s <= start_s:
            return
        pid, tid = self._track(track)
        event = {"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": start_s * 1e6,
                 "dur": (end_s - start_s) * 1e6}
        if args:
            event["args"] = args
        self._events.append(event)

    def instant(self, track: str, name: str, at_s: float, args: dict | None = None):
        if not self.enabled or len(self._events) >= self.max_events:
            return
        pid, tid = self._track(track)
        self._events.append({"name": name, "ph": "i", "s": "t", "pid": pid, "tid": tid, "ts": at_s * 1e6,
                             "args": args or {}})

    def write(self, path: Path, meta: dict | None = None):
        meta_events = []
        pids = sorted({pid for pid, _ in self._tracks.values()})
        for pid in pids:
            label = f"GPU {pid}" if pid < 1000 else "node"
            meta_events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}})
        for name, (pid, tid) in self._tracks.items():
            meta_events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                                "args": {"name": name}})
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as fh:
            json.dump({"traceEvents": meta_events + self._events, "displayTimeUnit": "ms",
                       "otherData": meta or {}}, fh)

    def __len__(self) -> int:
        return len(self._events)
