"""One ulacache TP replay (pinned keys: 24 requests at cap 24, 8 GPUs, glm-5, pb-lru, CPU storage; `b1`: 4 requests
at cap 1) of the source tree on PYTHONPATH: prints one JSON line with CPU-s (user, sys), the TP local buffers'
CPU-s (LocalBuffers.plan/commit/invalidate), the resident huge pages and the load. Run trees alternately (this VM's
speed drifts): PYTHONPATH=TREE python bench/tpbuf_replay_ab.py PRESET DRAFT [b1]. tpbuf's runs of session 6
(commands, machine, loads): bench/results/tpbuf_replay_ab.json."""
from __future__ import annotations

import json
import os
import resource
import sys
import time

import sim
from ulacache import local_buffer

_BUFFERS_S = [0.0]


def _timed(name: str) -> None:
    f = getattr(local_buffer.LocalBuffers, name)

    def g(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            _BUFFERS_S[0] += time.process_time() - t

    setattr(local_buffer.LocalBuffers, name, g)


def time_buffers() -> list[float]:
    """Wrap LocalBuffers.plan/commit/invalidate with CPU timers; returns the one-element list they add into."""
    for name in ("plan", "commit", "invalidate"):
        _timed(name)
    return _BUFFERS_S


def main() -> None:
    preset, draft, b1 = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["b1"]
    time_buffers()
    workload = {"num_requests": 4, "max_concurrency": 1} if b1 else {"num_requests": 24, "max_concurrency": 24}
    cfg = {"system": "ulacache", "attention": "tp", "hardware": {"preset": preset, "num_gpus": 8}, "policy": "pb-lru",
           "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": draft},
           "workload": {**workload, "seed": 1}}
    t, w = time.process_time(), time.time()
    m = sim.replay(cfg)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/self/smaps_rollup") as fh:
        huge = next((int(x.split()[1]) // 1024 for x in fh if x.startswith("AnonHugePages")), -1)
    print(json.dumps({"tree": os.environ.get("PYTHONPATH"), "cpu_s": round(time.process_time() - t, 2),
                      "user": round(ru.ru_utime, 2), "sys": round(ru.ru_stime, 2),
                      "buffers_cpu_s": round(_BUFFERS_S[0], 2), "wall_s": round(time.time() - w, 1),
                      "huge_mb": huge, "load": round(os.getloadavg()[0], 2), "hits": m.get("gpu_hit_rate")}))


if __name__ == "__main__":
    main()
