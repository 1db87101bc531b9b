"""Instruction counts (valgrind callgrind) of short replays for two commits: an A/B that the shared box's load does
not move (CPU-s of whole replays drift by up to ~1.5x between hours and by ~30% between back-to-back runs at load 4).

Each case is a replay cut to `workload.max_steps` decode steps (`--steps`), run by each commit's tree (exported with
git archive) in a fresh process under callgrind, plus that process with the replay skipped (imports and set-up
only), so `replay_instructions` = total - import-only. The metrics of the two trees are compared too.

Usage: python bench/callgrind_ab.py BEFORE AFTER OUT.json [--cases hs-dp-h200,...] [--steps 600]
Cases: issue 10's batch-1 configs (4 requests at concurrency 1, glm-5, pb-lru, cpu storage, 8 GPUs):
hs-dp-h200, hs-tp-h200, hs-dp-b300 (hisparse, no draft), ula-tp-h200, ula-tp-b300 (ulacache, no draft), and
pinned-tp-h200 (ulacache TP, 24 requests at 24).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hisparse_ab import export, write_result  # noqa: E402

RUN = """
import json, sys
import sim
cfg = json.loads(sys.argv[1])
if sys.argv[2] == "run":
    m = sim.replay(cfg)
    print("METRICS " + json.dumps({k: v for k, v in m.items() if "wall" not in k and "cpu" not in k
                                   and k not in ("peak_rss_bytes", "est_peak_memory_bytes")}, default=str))
"""


def _cfg(system: str, att: str, preset: str, pinned: bool = False) -> dict:
    work = {"num_requests": 24, "max_concurrency": 24, "seed": 1} if pinned else \
        {"num_requests": 4, "max_concurrency": 1, "seed": 1}
    return {"system": system, "attention": att, "hardware": {"preset": preset, "num_gpus": 8}, "policy": "pb-lru",
            "cpu_storage": True, "model": {"preset": "glm-5"}, "spec": {"draft_tokens": 0}, "workload": work}


CASES = {"hs-dp-h200": _cfg("hisparse", "dp", "h200"), "hs-tp-h200": _cfg("hisparse", "tp", "h200"),
         "hs-dp-b300": _cfg("hisparse", "dp", "b300"), "ula-tp-h200": _cfg("ulacache", "tp", "h200"),
         "ula-tp-b300": _cfg("ulacache", "tp", "b300"), "pinned-tp-h200": _cfg("ulacache", "tp", "h200", True)}


def count(tree: Path, cfg: dict, mode: str) -> tuple[int, str | None]:
    """(instructions of the whole process, its metrics line or None) of one run under callgrind."""
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", RUN,
           json.dumps(cfg), mode]
    res = subprocess.run(cmd, cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True, check=True)
    ir = int(re.search(r"Collected : (\d+)", res.stderr).group(1))
    metrics = next((ln[8:] for ln in res.stdout.splitlines() if ln.startswith("METRICS ")), None)
    return ir, metrics


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("out")
    ap.add_argument("--cases", default="hs-dp-h200")
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    runs, summary = [], {}
    with tempfile.TemporaryDirectory(prefix="callgrind_ab_") as tmp:
        trees = {"before": Path(tmp) / "before", "after": Path(tmp) / "after"}
        commits = {name: export(c, trees[name]) for name, c in (("before", args.before), ("after", args.after))}
        for case in args.cases.split(","):
            cfg = json.loads(json.dumps(CASES[case]))
            cfg["workload"]["max_steps"] = args.steps
            row = {}
            for name, tree in trees.items():
                base, _ = count(tree, cfg, "import")
                total, metrics = count(tree, cfg, "run")
                row[name] = {"total_instructions": total, "import_only_instructions": base,
                             "replay_instructions": total - base, "metrics": metrics}
                runs.append({"case": case, "tree": name, "config": cfg, **row[name]})
                print(f"{case:16s} {name:6s} replay {(total - base) / 1e6:10.1f} M instructions", flush=True)
            b, a = row["before"]["replay_instructions"], row["after"]["replay_instructions"]
            summary[case] = {"steps": args.steps, "before_replay_instructions": b, "after_replay_instructions": a,
                             "after_over_before": round(a / b, 4),
                             "metrics_identical": row["before"]["metrics"] == row["after"]["metrics"]}
    write_result("callgrind_ab", args.out, commits, summary, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
