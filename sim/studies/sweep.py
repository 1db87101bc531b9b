"""Grid sweeps over replays: one replay per grid point, run in-process or on Ray, resumable.

A sweep dir holds `sweep.yaml` (the base config, grid, overrides and the point list), `points/<point_id>/` (one
replay dir per point: `metrics.json`, ...) and the results table `results.parquet` + `results.csv`, rewritten
atomically (temp file, then `os.replace`) after every finished point. A point's identity is a stable hash of its
resolved config, so `--resume` skips finished points whatever order or grid they came from; a killed sweep loses at
most the points that were running. Points that failed (status=error) are run again on resume.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import numbers
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from sim import config as sim_config

ReplayFn = Callable[[dict, Path], dict]
ResolveFn = Callable[[Path, list], dict]

FIRST_COLUMNS = ("point_id", "status", "error")
RESULTS_NAME = "results"
POINTS_DIR = "points"


# ----------------------------------------------------------------------------------------------- parsing
# The grammar and typing of `--set` / `--grid` items are the config loader's (`sim.config.parse_set`), shared with
# `replay` and `plan`, so the three commands accept and refuse the same inputs with the same messages.
def parse_value(text: str):
    """A grid/override value as `--set` reads it (8 -> int, true -> bool, pb-lru -> str)."""
    return sim_config.parse_value(text)


def parse_grid(items: Iterable[str]) -> dict[str, list]:
    """`["system=sglang,ulacache", "workload.max_concurrency=1,8"]` -> ordered {key: [values]}."""
    grid: dict[str, list] = {}
    for item in items:
        key, values = sim_config.parse_grid_item(item)
        if key in grid:
            raise ValueError(f"bad --grid {item!r}: key {key!r} given twice")
        if len({json.dumps(v) for v in values}) != len(values):
            raise ValueError(f"bad --grid {item!r}: repeated value")
        grid[key] = values
    return grid


def parse_sets(items: Iterable[str]) -> list[str]:
    """Validate `--set key=value` items (grammar and value, as `replay` does); returns them as `key=value`."""
    out = []
    for item in items:
        key, _ = sim_config.parse_set(item)
        out.append(f"{key}={item.partition('=')[2].strip()}")
    return out


def expand_grid(grid: dict[str, list]) -> list[dict]:
    """Cartesian product of the grid, in the order the keys and values were given."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def _override(key: str, value) -> str:
    """A typed grid value back as `key=text` that reads back as the same value (a quoted '8' stays a string)."""
    return sim_config.format_set(key, value)


# ----------------------------------------------------------------------------------------------- identity
def _plain(obj):
    """Resolved config (dict or dataclass tree) -> JSON-able plain data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    return obj


def point_id(resolved_config) -> str:
    """Stable 16-hex-digit id of a resolved point config (canonical JSON, sorted keys)."""
    text = json.dumps(_plain(resolved_config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def flatten(tree, prefix: str = "") -> dict:
    """Nested dict -> {dotted.key: scalar}; lists become JSON text."""
    out = {}
    for key, value in (tree or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(_plain(value))
        else:
            out[name] = value
    return out


# ----------------------------------------------------------------------------------------------- sim hooks
def sim_resolve(config_path: Path, overrides: list) -> dict:
    """Resolve a config file + overrides with the simulator's loader (unknown keys -> ValueError)."""
    import sim

    return _plain(sim.load_config(config_path, list(overrides)))


def sim_replay(config: dict, out_dir: Path) -> dict:
    """Run one real replay (the product's default replay function), written into a hidden sibling of `out_dir`
    and renamed into place whole (an earlier failed attempt's dir is replaced)."""
    import sim
    from traces.atomic import StagedDir

    with StagedDir(out_dir, command="replay", replace=True) as stage:  # our own point dir
        metrics = sim.replay(config, stage.path, progress=False, policy_workers=None)  # (the usable cores)
        stage.publish()
    return metrics


# ----------------------------------------------------------------------------------------------- points
@dataclasses.dataclass(frozen=True)
class Point:
    point_id: str
    values: dict  # grid key -> value
    config: dict  # resolved config passed to the replay function


def make_points(config_path: Path, grid: dict, sets: list[str], resolve: ResolveFn = sim_resolve) -> list[Point]:
    """Resolve every grid point up front, so a bad key or value fails before anything runs."""
    points, seen = [], set()
    for values in expand_grid(grid):
        overrides = list(sets) + [_override(k, v) for k, v in values.items()]
        try:
            config = resolve(config_path, overrides)
        except (ValueError, KeyError, TypeError) as exc:
            _refuse_base(config_path, sets, resolve, exc)
            where = ", ".join(f"{k}={v}" for k, v in values.items())
            raise ValueError(f"grid point {where}: {_one_line(exc)}") from None
        pid = point_id(config)
        if pid in seen:
            continue  # two grid values resolving to the same config are one point
        seen.add(pid)
        points.append(Point(pid, values, config))
    return points


def _refuse_base(config_path: Path, sets: list[str], resolve: ResolveFn, exc: BaseException) -> None:
    """When the config + `--set`s fail alone with the point's error, say it as `replay` would (no grid point)."""
    try:
        resolve(config_path, sets)
    except (ValueError, KeyError, TypeError) as base_exc:
        if str(base_exc) == str(exc):
            raise base_exc from None


ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def _one_line(exc: BaseException) -> str:
    text = " ".join(ANSI_RE.sub("", str(exc)).split()) or type(exc).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def run_point(replay_fn: ReplayFn, config: dict, point_dir: str, isolate: bool | None = None,
              policy_workers: int | None = None) -> dict:
    """Run one point; any exception becomes a status=error row (SystemExit/KeyboardInterrupt propagate).

    With `isolate` (default: for the real replay) the replay runs in a forked child process, so one killed by a
    signal (the kernel's OOM killer sends SIGKILL) is an error row naming the signal, not a dead sweep; there
    `policy_workers` (when $ULACACHE_POLICY_WORKERS is unset) caps the processes its groups run in (a Ray task
    holds one CPU)."""
    start, cpu = time.perf_counter(), time.process_time()
    path = Path(point_dir)
    path.mkdir(parents=True, exist_ok=True)
    if isolate is None:
        isolate = replay_fn is sim_replay
    outcome = _run_isolated(replay_fn, config, path, policy_workers) if isolate else _attempt(replay_fn, config, path)
    outcome["point_wall_s"] = time.perf_counter() - start
    outcome.setdefault("point_cpu_s", time.process_time() - cpu)  # an isolated child reports its own
    return outcome


def _attempt(replay_fn: ReplayFn, config: dict, path: Path) -> dict:
    try:
        metrics = replay_fn(config, path)
        if not isinstance(metrics, dict):
            raise TypeError(f"replay returned {type(metrics).__name__}, expected a metrics dict")
        return {"status": "ok", "error": "", "metrics": _plain(metrics)}
    except MemoryError:
        return {"status": "error", "metrics": {}, "error": "MemoryError: out of memory; lower workload.num_requests "
                "or workload.max_concurrency, or sample more coarsely (fidelity.request_fraction, "
                "fidelity.policy_groups)"}
    except Exception as exc:  # noqa: BLE001 - failure isolation is the point
        return {"status": "error", "error": f"{type(exc).__name__}: {_one_line(exc)}", "metrics": {}}


def _child(conn, replay_fn: ReplayFn, config: dict, path: Path, policy_workers: int | None = None) -> None:
    import sys

    from sim.group_workers import ENV_VAR

    if policy_workers is not None:
        os.environ.setdefault(ENV_VAR, str(policy_workers))

    # fresh stdout/stderr objects: a parent thread (the progress bar) may have held their locks at the fork
    sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1)
    outcome = _attempt(replay_fn, config, path)
    outcome["point_cpu_s"] = time.process_time()
    conn.send(outcome)
    conn.close()


def death_message(exitcode: int) -> str:
    """'killed by SIGKILL (out of memory?)' for a negative exit code (a signal), else the exit status."""
    import signal

    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory? the kernel's OOM killer sends SIGKILL)" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"replay process exited with status {exitcode} and no result"


def _run_isolated(replay_fn: ReplayFn, config: dict, path: Path, policy_workers: int | None = None) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, replay_fn, config, path, policy_workers), daemon=True)
    proc.start()
    send.close()
    outcome = None
    try:
        while outcome is None:
            if recv.poll(0.2):
                try:
                    outcome = recv.recv()
                except EOFError:  # the child died before sending
                    break
            elif not proc.is_alive() and not recv.poll(0):
                break
        proc.join()
    finally:
        if proc.is_alive():  # interrupted: take the child down with us
            proc.kill()
            proc.join()
        recv.close()
    if outcome is None:
        import shutil

        for tmp in path.parent.glob(f".{path.name}.tmp-{proc.pid}-*"):  # what the dead child had staged
            shutil.rmtree(tmp, ignore_errors=True)
        return {"status": "error", "error": f"ChildProcessError: {death_message(proc.exitcode)}", "metrics": {}}
    return outcome


# ----------------------------------------------------------------------------------------------- results table
def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Temp sibling + os.replace; a failed write (disk full) removes the temp file and leaves `path` as it was."""
    from traces.atomic import atomic_write

    atomic_write(path, write)


def _scalar(value):
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(_plain(value))
    return value


class ResultsTable:
    """One row per point, rewritten atomically to results.parquet + results.csv on every add."""

    def __init__(self, sweep_dir: Path, grid_keys: list[str]):
        self.dir = Path(sweep_dir)
        self.grid_keys = list(grid_keys)
        self.rows: dict[str, dict] = {}
        for row in self._read_existing():
            clean = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
            self.rows[str(row["point_id"])] = clean

    def _read_existing(self) -> list[dict]:
        """Rows of an earlier run: results.parquet, else the results.csv beside it (one damaged copy is not fatal)."""
        import pandas as pd

        parquet, csv = self.dir / f"{RESULTS_NAME}.parquet", self.dir / f"{RESULTS_NAME}.csv"
        for path, read in ((parquet, pd.read_parquet), (csv, lambda p: pd.read_csv(p, dtype={"point_id": str}))):
            if path.exists():
                try:
                    df = read(path)
                except Exception:  # noqa: BLE001 - try the other copy
                    continue
                if "point_id" in df.columns:
                    return df.to_dict("records")
        if parquet.exists() or csv.exists():
            raise ValueError(f"{self.dir}: results table unreadable ({parquet.name} and {csv.name} both damaged)")
        return []

    def status(self, pid: str) -> str | None:
        row = self.rows.get(pid)
        return None if row is None else row.get("status")

    def add(self, point: Point, outcome: dict) -> dict:
        row = {"point_id": point.point_id, "status": outcome["status"], "error": outcome.get("error", "")}
        row.update({k: _scalar(v) for k, v in point.values.items()})
        for key, value in outcome.get("metrics", {}).items():
            row.setdefault(key, _scalar(value))
        row["point_wall_s"] = outcome.get("point_wall_s")
        row["point_cpu_s"] = outcome.get("point_cpu_s")
        row["point_dir"] = f"{POINTS_DIR}/{point.point_id}"
        for key, value in flatten(point.config).items():
            row.setdefault(key, value)
        self.rows[point.point_id] = row
        self.write()
        return row

    def frame(self):
        import pandas as pd

        df = pd.DataFrame(list(self.rows.values()))
        if df.empty:
            df = pd.DataFrame(columns=list(FIRST_COLUMNS) + self.grid_keys)
        first = [c for c in list(FIRST_COLUMNS) + self.grid_keys if c in df.columns]
        df = df[first + [c for c in df.columns if c not in first]]
        for col in df.columns:  # pyarrow needs one type per column
            if df[col].dtype == object:
                kinds = {type(v) for v in df[col] if v is not None and not (isinstance(v, float) and math.isnan(v))}
                if len(kinds) > 1 and not all(issubclass(k, numbers.Number) or k.__name__ == "bool_" for k in kinds):
                    df[col] = df[col].map(lambda v: None if v is None else str(v))
        return df

    def write(self) -> None:
        df = self.frame()
        self.dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.dir / f"{RESULTS_NAME}.parquet", lambda p: df.to_parquet(p, index=False))
        _atomic_write(self.dir / f"{RESULTS_NAME}.csv", lambda p: df.to_csv(p, index=False))


# ----------------------------------------------------------------------------------------------- executors
def _run_inprocess(todo: list[Point], replay_fn: ReplayFn, sweep_dir: Path, on_done,
                   isolate: bool | None = None) -> None:
    for point in todo:
        on_done(point, run_point(replay_fn, point.config, str(sweep_dir / POINTS_DIR / point.point_id), isolate))


def ray_start_error(exc: BaseException, workers: int, address: str | None) -> OSError:
    """A Ray that did not start (often an address-space limit: its processes map several GB each) as one line."""
    where = f"the Ray cluster at {address}" if address else f"a local Ray for --workers {workers}"
    return OSError(f"could not start {where} ({_one_line(exc)[:200]}); rerun with --workers 1 to replay the points "
                   "in this process, or raise the memory limit")


def _loopback_only(ray) -> None:
    """Make Ray resolve this node's IP to 127.0.0.1 (it maps a loopback `_node_ip_address` to the host's routable
    IP unless its "cluster" mode is off: the env var above, read when ray was first imported)."""
    constants = getattr(getattr(ray, "_private", None), "ray_constants", None)
    if constants is not None and hasattr(constants, "ENABLE_RAY_CLUSTER"):
        constants.ENABLE_RAY_CLUSTER = False


def _run_ray(todo: list[Point], replay_fn: ReplayFn, sweep_dir: Path, on_done, workers: int,
             address: str | None, isolate: bool | None = None) -> None:
    import logging

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not address:  # a local cluster is for this process only: its processes (spawned with this env) use loopback
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    started = False
    if not ray.is_initialized():
        try:
            if address:
                ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
            else:
                # address="local": always a fresh local instance, even when `ray start` left a cluster file around;
                # bound to 127.0.0.1, not every interface (Ray otherwise advertises and listens on the host's IP)
                _loopback_only(ray)
                ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level=logging.ERROR,
                         log_to_driver=False, _node_ip_address="127.0.0.1")
        except Exception as exc:  # noqa: BLE001 - Ray raises bare Exception when its processes do not come up
            ray.shutdown()  # whatever part of the node did start
            raise ray_start_error(exc, workers, address) from None
        started = True
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_point)
        pending = {remote.remote(replay_fn, p.config, str(sweep_dir / POINTS_DIR / p.point_id), isolate, 1): p
                   for p in todo}  # (each task holds one CPU: its replay runs its groups in one process)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                point = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a worker that died is one failed point
                    name = type(exc).__name__
                    cause = {"OutOfMemoryError": "killed by Ray's memory monitor (out of memory)",
                             "WorkerCrashedError": "worker process died (killed by a signal? out of memory?)"}
                    outcome = {"status": "error", "error": f"{name}: {cause.get(name) or _one_line(exc)}",
                               "metrics": {}, "point_wall_s": None}
                on_done(point, outcome)
    finally:
        if started:
            ray.shutdown()


# ----------------------------------------------------------------------------------------------- sweep
def _load_sweep_yaml(sweep_dir: Path) -> dict:
    path = sweep_dir / "sweep.yaml"
    if not path.exists():
        raise ValueError(f"{sweep_dir}: no sweep to resume (sweep.yaml missing)")
    from traces.strict_yaml import read_yaml_file

    data = read_yaml_file(path) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a sweep file")
    return data


def _check_sweep_manifest(sweep_dir: Path) -> None:
    """--resume writes into the dir: refuse one whose manifest names another command (a sweep dir from before
    manifests has none and is taken by its sweep.yaml)."""
    path = sweep_dir / ".ulacache-manifest.json"
    if not path.exists() and not path.is_symlink():
        return
    try:
        doc = json.loads(path.read_bytes()) if path.is_file() and path.stat().st_size < 1 << 20 else None
    except (OSError, ValueError):
        doc = None
    if not isinstance(doc, dict) or doc.get("command") != "sweep":
        what = f"`ulacache {doc['command']}`" if isinstance(doc, dict) and isinstance(doc.get("command"), str) \
            else "not a sweep's"
        raise ValueError(f"{sweep_dir}: its manifest is {what} output, not a sweep; nothing to resume")


def _recover(point: Point, sweep_dir: Path) -> dict | None:
    """A point whose metrics.json was written but whose row was not (killed in between)."""
    path = sweep_dir / POINTS_DIR / point.point_id / "metrics.json"
    if not path.exists():
        return None
    try:
        with open(path) as fh:
            metrics = json.load(fh)
    except (OSError, ValueError):
        return None
    return {"status": "ok", "error": "", "metrics": metrics, "point_wall_s": None} if isinstance(metrics, dict) \
        else None


def run_sweep(config_path, grid: dict[str, list], out_dir, sets: list[str] = (), workers: int = 1,
              address: str | None = None, resume: bool = False, progress: bool = False,
              replay_fn: ReplayFn = sim_replay, resolve: ResolveFn = sim_resolve, isolate: bool | None = None):
    """Run every grid point (skipping finished ones on resume); returns the results DataFrame. Each replay runs in
    a child process (`isolate`, default for the real replay): one killed by a signal is an error row naming it."""
    config_path, sweep_dir = Path(config_path), Path(out_dir)
    if not config_path.is_file():
        raise ValueError(f"{config_path}: config file not found")
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if not grid:
        raise ValueError("no --grid given: a sweep needs at least one key=v1,v2 list")
    if sweep_dir.is_symlink():  # as every output: the directory itself, not a link to it
        raise OSError(f"{sweep_dir}: is a symbolic link; give the directory it points to "
                      f"({os.path.realpath(sweep_dir)})")
    if resume:
        _check_sweep_manifest(sweep_dir)
        previous = _load_sweep_yaml(sweep_dir)
    else:
        if sweep_dir.exists() and (not sweep_dir.is_dir() or any(p.name != LOCK_NAME for p in sweep_dir.iterdir())):
            raise ValueError(f"{sweep_dir}: sweep dir exists and is not empty; pass --resume to continue it")
        previous = {}
    sets = parse_sets(sets)
    points = make_points(config_path, grid, sets, resolve)
    with _SweepLock(sweep_dir, resume) as lock:
        return _run_locked(config_path, grid, sweep_dir, sets, points, previous, lock, workers, address, progress,
                           replay_fn, isolate)


LOCK_NAME = ".ulacache-lock"


class _SweepLock:
    """One sweep at a time per sweep dir: an exclusive flock on `DIR/.ulacache-lock`, held for the whole sweep.

    A second sweep into the same dir (new or --resume) is refused in one line instead of both writing half the
    points; a new sweep that got the lock after another finished finds the dir no longer empty and is refused too.
    """

    def __init__(self, sweep_dir: Path, resume: bool):
        self.dir, self.resume = sweep_dir, resume
        self.fd: int | None = None
        self.created = False

    def __enter__(self) -> _SweepLock:
        import fcntl

        if self.dir.is_symlink():
            raise OSError(f"{self.dir}: is a symbolic link; give the directory it points to")
        self.created = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self.fd = os.open(self.dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except OSError as exc:
            self._undo()
            raise OSError(f"{self.dir}: cannot create the sweep lock ({exc.strerror or exc})") from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise ValueError(f"{self.dir}: another `ulacache sweep` is writing this sweep dir now; wait for it "
                             "(then --resume) or choose another --out") from None
        if not self.resume and any(p.name != LOCK_NAME for p in self.dir.iterdir()):
            self.__exit__()
            raise ValueError(f"{self.dir}: sweep dir exists and is not empty; pass --resume to continue it")
        return self

    def _undo(self) -> None:
        if self.created:
            try:
                (self.dir / LOCK_NAME).unlink(missing_ok=True)
                self.dir.rmdir()
            except OSError:
                pass

    def __exit__(self, *exc) -> bool:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock; the empty lock file stays (removing it would race a waiter)
            self.fd = None
        return False


def _run_locked(config_path: Path, grid: dict, sweep_dir: Path, sets: list[str], points: list[Point],
                previous: dict, lock: _SweepLock, workers: int, address: str | None, progress: bool,
                replay_fn: ReplayFn, isolate: bool | None):
    """The body of `run_sweep` once this process holds the sweep dir's lock."""
    from traces.atomic import MANIFEST, atomic_write_text


    known = {p["point_id"]: p for p in previous.get("points", []) if isinstance(p, dict) and "point_id" in p}
    for p in points:
        known[p.point_id] = {"point_id": p.point_id, "values": dict(p.values)}
    meta = {"config": str(config_path.resolve()), "grid": grid, "set": list(sets),
            "grid_keys": list(dict.fromkeys(list(previous.get("grid_keys", [])) + list(grid))),
            "points": list(known.values())}
    try:
        table = ResultsTable(sweep_dir, meta["grid_keys"])  # an unreadable table refuses before anything is written
    except BaseException:
        if not previous:
            lock._undo()
        raise
    if not (sweep_dir / MANIFEST).exists():  # names the dir a sweep's (a living dir: its files are not listed)
        atomic_write_text(sweep_dir / MANIFEST, json.dumps({"tool": "ulacache", "format": 1, "command": "sweep",
                                                             "files": {}, "living": True}, indent=1) + "\n")
    _atomic_write(sweep_dir / "sweep.yaml", lambda p: p.write_text(yaml.safe_dump(meta, sort_keys=False)))
    todo = []
    for point in points:
        if table.status(point.point_id) == "ok":
            continue
        recovered = _recover(point, sweep_dir)
        if recovered is not None:
            table.add(point, recovered)
            continue
        todo.append(point)

    bar = _Progress(len(points), len(points) - len(todo), enabled=progress)

    def on_done(point: Point, outcome: dict) -> None:
        if outcome["status"] == "ok":
            _ensure_metrics_file(sweep_dir / POINTS_DIR / point.point_id, outcome["metrics"])
        table.add(point, outcome)
        bar.advance(outcome["status"])

    with bar:
        if todo:
            if workers == 1 and not address:
                _run_inprocess(todo, replay_fn, sweep_dir, on_done, isolate)
            else:
                _run_ray(todo, replay_fn, sweep_dir, on_done, workers, address, isolate)
    return table.frame()


def _ensure_metrics_file(point_dir: Path, metrics: dict) -> None:
    """Remote workers may not share our filesystem: keep a metrics.json beside the table either way."""
    path = point_dir / "metrics.json"
    if not path.exists():
        point_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, lambda p: p.write_text(json.dumps(metrics, indent=2, default=str)))


class _Progress:
    """Rich progress bar over points (no-op when disabled)."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.enabled, self.errors = enabled, 0
        self.total, self.done = total, done
        self._progress = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[errors]} errors"), TimeElapsedColumn())
            self._progress.__enter__()
            self._task = self._progress.add_task("sweep", total=self.total, completed=self.done, errors=0)
        return self

    def advance(self, status: str) -> None:
        self.errors += status != "ok"
        if self._progress is not None:
            self._progress.update(self._task, advance=1, errors=self.errors)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
        return False


# ----------------------------------------------------------------------------------------------- demo
# The default small comparison for `make demo` (with configs/demo.yaml): together these feed every report figure
# except sim-vs-hw (needs hw validate results) and plans. ~1.5 min wall with 2 workers on the 2-core dev box.
DEMO_SWEEPS = {
    "compare": (["system=sglang,hisparse,ulacache", "workload.max_concurrency=1,4,16"],
                ["workload.num_requests=16"]),
    "policy": (["system=ulacache", "policy=pb-lru,lru", "ulacache.gpu_pool_slots=4096,8192,12288"],
               ["workload.num_requests=8", "workload.max_concurrency=8"]),
}


def run_demo_sweeps(config_path, out_dir, workers: int = 2, resume: bool = False, progress: bool = True,
                    sweeps: dict = DEMO_SWEEPS) -> dict:
    """Run each named sweep into OUT/<name> (one local Ray shared by all when workers > 1); returns
    {name: results DataFrame}. `reports.build_report(OUT)` then draws them together."""
    out_dir = Path(out_dir)
    started = False
    if workers > 1:
        import logging

        import ray

        if not ray.is_initialized():
            try:
                ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level=logging.ERROR,
                         log_to_driver=False)
            except Exception as exc:  # noqa: BLE001 - see _run_ray
                ray.shutdown()
                raise ray_start_error(exc, workers, None) from None
            started = True
    try:
        return {name: run_sweep(config_path, parse_grid(grid), out_dir / name, sets=sets, workers=workers,
                                resume=resume, progress=progress)
                for name, (grid, sets) in sweeps.items()}
    finally:
        if started:
            import ray

            ray.shutdown()
