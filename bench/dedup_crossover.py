"""Where sort-based dedup beats the scatter-marker scan (NumpyBackend.dedup picks by batch / marker size).

Usage: python bench/dedup_crossover.py OUT.json. For marker sizes 2^16..2^26 and batches 2^8..2^20 (distinct, and each
address 8 times), times both ways (CPU seconds, best of 3 repeats) and writes the grid with date, command, machine,
load, and per marker size the largest batch where sorting was faster."""
import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from ulacache.backends.numpy_backend import NumpyBackend


def best_s(f, reps: int) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for _ in range(reps):
            f()
        best = min(best, (time.process_time() - t) / reps)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", metavar="OUT.json", help="where the grid is written")
    out = ap.parse_args().out
    be, rng, rows = NumpyBackend(), np.random.default_rng(0), []
    for mexp in range(16, 27, 2):
        M = 2**mexp
        marker = np.zeros(M + 1, dtype=bool)
        for nexp in range(8, 21, 2):
            n = 2**nexp
            if n > 4 * M:
                continue
            for dup in (1, 8):
                a = np.repeat(rng.integers(0, M, n // dup), dup)
                rng.shuffle(a)
                assert (be._dedup_marker(a, marker) == be._dedup_sorted(a, marker.size)).all()
                reps = max(1, min(50, 2**22 // max(n, M // 8)))
                tm = best_s(lambda: be._dedup_marker(a, marker), reps)
                ts = best_s(lambda: be._dedup_sorted(a, marker.size), reps)
                rows.append({"marker": M, "batch": n, "dup": dup, "marker_us": round(tm * 1e6, 1),
                             "sort_us": round(ts * 1e6, 1)})
                print(rows[-1], flush=True)
    cross = {}
    for M in sorted({r["marker"] for r in rows}):
        wins = [r["batch"] for r in rows if r["marker"] == M and r["sort_us"] < r["marker_us"]]
        cross[str(M)] = max(wins) if wins else 0
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": " ".join(sys.argv),
            "machine": f"{platform.node()} {os.cpu_count()} cores", "load": os.getloadavg(),
            "largest_batch_sort_wins": cross, "rows": rows}
    with open(out, "w") as f:
        json.dump(meta, f, indent=1)
    print("largest batch where sorting wins, by marker size:", cross)
    return 0


if __name__ == "__main__":
    sys.exit(main())
