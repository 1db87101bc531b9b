"""Instruction counts (valgrind callgrind) of the library's share of a replay for two commits: the facade calls a
simulator replay made (recorded by bench/facade_trace.py), cut to their first N calls per cache, replayed by each
commit's tree with collection on only inside the calls (or inside chosen functions). Unaffected by the shared box's
load, unlike CPU-s; the trace's digest is not checked here (bench/facade_trace.py replay/ab does that).

Usage: python bench/facade_callgrind.py BEFORE AFTER OUT.json TRACE.pkl [--calls 1500] [--funcs mod:Qual,...]
       (--funcs: also count inside each of these functions, outermost calls, one run per function and tree)
Writes, per tree, the instructions of all facade calls and of each function, with date, command, commits, machine
and load.
"""
from __future__ import annotations

import argparse
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hisparse_ab import export, write_result  # noqa: E402

_HERE = Path(__file__).resolve().parent
RUN = r"""
import ctypes, importlib, os, pickle, sys
cg = ctypes.CDLL(sys.argv[2])
from ulacache import CapacityError, UlaCache
logs = pickle.load(open(sys.argv[1], "rb"))
funcs = [f for f in sys.argv[3:] if f]
depth = [0]
def wrap(f):
    def w(*a, **k):
        if not depth[0]:
            cg.cg_toggle()
        depth[0] += 1
        try:
            return f(*a, **k)
        finally:
            depth[0] -= 1
            if not depth[0]:
                cg.cg_toggle()
    return w
for t in funcs:
    mod, qual = t.split(":")
    owner = importlib.import_module(mod)
    *path, name = qual.split(".")
    for p in path:
        owner = getattr(owner, p)
    setattr(owner, name, wrap(getattr(owner, name)))
for k in sorted(logs):
    cache = plan = None
    for meth, args, kw in logs[k]:
        if meth == "__init__":
            cache = UlaCache(*args)
            continue
        if meth in ("commit", "replay"):
            args = (plan,) + args[1:]
        if not funcs:
            cg.cg_toggle()
        try:
            res = getattr(cache, meth)(*args, **kw)
        except CapacityError:
            res = None
        if not funcs:
            cg.cg_toggle()
        if meth == "access":
            plan = res
"""


def toggle_lib() -> str:
    lib = Path(tempfile.gettempdir()) / f"cg_toggle_{os.getuid()}.so"
    if not lib.exists():
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(_HERE / "cg_toggle.c")], check=True)
    return str(lib)


def count(tree: Path, trace: str, func: str) -> int:
    """Instructions collected inside the facade calls (func "") or inside `func`, one run under callgrind."""
    cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--callgrind-out-file=/dev/null", sys.executable,
           "-c", RUN, trace, toggle_lib(), func]
    res = subprocess.run(cmd, cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True, check=True)
    return int(re.search(r"Collected : (\d+)", res.stderr).group(1))


def cut(trace: str, calls: int, out: str) -> None:
    """The two caches with the most calls (a replay's layer groups, not its footprint probes), first `calls` each."""
    with open(trace, "rb") as f:
        logs = pickle.load(f)
    keys = sorted(logs, key=lambda k: -len(logs[k]))[:2]
    with open(out, "wb") as f:
        pickle.dump({k: logs[k][:calls] for k in keys}, f, protocol=pickle.HIGHEST_PROTOCOL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("out")
    ap.add_argument("trace")
    ap.add_argument("--calls", type=int, default=1500)
    ap.add_argument("--funcs", default="")
    args = ap.parse_args()
    funcs = [""] + [f for f in args.funcs.split(",") if f]
    runs, summary = [], {}
    with tempfile.TemporaryDirectory(prefix="facade_cg_") as tmp:
        trace = str(Path(tmp) / "cut.pkl")
        cut(args.trace, args.calls, trace)
        trees = {"before": Path(tmp) / "before", "after": Path(tmp) / "after"}
        commits = {name: export(c, trees[name]) for name, c in (("before", args.before), ("after", args.after))}
        for func in funcs:
            row = {}
            for name, tree in trees.items():
                row[name] = count(tree, trace, func)
                runs.append({"function": func or "facade calls", "tree": name, "instructions": row[name]})
                print(f"{func or 'facade calls':50s} {name:6s} {row[name] / 1e6:10.1f} M instructions", flush=True)
            summary[func or "facade calls"] = {"before_instructions": row["before"], "after_instructions": row["after"],
                                               "after_over_before": round(row["after"] / row["before"], 4)}
    summary["trace"] = {"path": args.trace, "calls_per_cache": args.calls}
    write_result("facade_callgrind", args.out, commits, summary, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
