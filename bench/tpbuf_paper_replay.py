"""One paper-default replay (a config file, e.g. configs/paper-h200-tp-specon.yaml) of the source tree on PYTHONPATH:
prints one JSON line with CPU-s, the TP local buffers' CPU-s (LocalBuffers.plan/commit/invalidate), the load and a
digest of every metric but the run's own CPU/wall/memory figures (two trees that agree print the same digest). Run
trees alternately (this VM's speed drifts): PYTHONPATH=TREE python bench/tpbuf_paper_replay.py CONFIG."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from tpbuf_replay_ab import time_buffers  # (this script's folder is on sys.path)

import sim

_DROP = {"sim_wall_s", "peak_rss_bytes", "sim_cpu_s", "est_peak_memory_bytes"}  # as /work/notes/ident.py


def main() -> None:
    buffers_s = time_buffers()
    t = time.process_time()
    m = sim.replay(sys.argv[1])
    kept = {k: v for k, v in sorted(m.items()) if "wall" not in k and k not in _DROP}
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]
    print(json.dumps({"tree": os.environ.get("PYTHONPATH"), "config": sys.argv[1],
                      "cpu_s": round(time.process_time() - t, 2), "buffers_cpu_s": round(buffers_s[0], 2),
                      "load": round(os.getloadavg()[0], 2), "metrics_digest": digest}))


if __name__ == "__main__":
    main()
