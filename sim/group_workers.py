"""Group workers: a replay's simulated indexer groups split over processes, so a policy step uses every core.

Each group's cache is independent of the others' (its own pools, its own selections: `select` is pure in the
request, step and group), so the groups can run side by side. A `GroupWorkers` forks processes from the
`PolicyRunner` as it stands (copy on write: nothing is pickled); each child keeps its share of the groups and drops
the rest, the parent drops the children's. On a device backend, and in a heavy run without a pilot, the runner
forks before it has built any cache and each process builds its own share (`keep_groups`; a CUDA context does not
survive a fork). The parent keeps the last round-robin share, the smallest where they differ, as it also runs the
engine. From then on the parent sends each child the per-group halves of the runner's calls (admit, grow, release,
step) in the order it makes them, runs its own groups meanwhile, and merges the children's results in group order,
so every metric is the same bit for bit as with one process.

    child 1 (groups 0, 2, ..)          parent (groups 1, 3, ..)
    recv step <------------------------ send step
    step own groups                     step own groups
    send results ----------------------> recv results
                                        merge in group order, ratios

Calls whose results the parent does not need (grow, release) are queued and go with the next call that waits for
its result (one message a step at batch size 1, not two); they get no reply unless they fail, and a failure is
raised in the parent at that call. A child whose parent is gone reads EOF and exits; the parent ends its
children in `close`. Memory: a child's resident set counts the parent's pages it maps since the fork (its peak RSS
is the parent's at the fork), so each child samples its private pages (/proc/self/smaps_rollup, at most once a
`SAMPLE_S`, and at the end) and the run's `peak_rss_bytes` is the parent's peak RSS plus each child's largest
sample: the shared pages once, the children's own once (peaks at different times add: at most a little above the
simultaneous peak, or below it by what a child held only between samples).
"""
from __future__ import annotations

import os
import pickle
import time
from multiprocessing.connection import Pipe

ENV_VAR = "ULACACHE_POLICY_WORKERS"  # processes for a replay's policy groups when the caller names none
SAMPLE_S = 1.0  # a child reads its private pages at most this often (a read walks its page tables: ~ms per GB)


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def resolve_processes(requested: int | None) -> int:
    """Processes for the policy groups: `requested` (>= 1), else $ULACACHE_POLICY_WORKERS, else the usable cores."""
    if requested is None:
        env = os.environ.get(ENV_VAR, "").strip()
        if env:
            try:
                requested = int(env)
            except ValueError:
                raise ValueError(f"{ENV_VAR}={env!r}: expected a whole number of processes >= 1") from None
        else:
            requested = usable_cores()
    if isinstance(requested, bool) or int(requested) < 1:
        raise ValueError(f"policy workers: expected a whole number of processes >= 1, got {requested!r}")
    return int(requested)


def private_bytes() -> int:
    """This process's private resident pages (Private_Clean + Private_Dirty of /proc/self/smaps_rollup), 0 where
    unreadable."""
    total = 0
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return total


def _serve(conn, runner, groups: list[int]) -> None:
    """The child's loop: keep `groups`, then run the calls the parent sends until it says stop (None) or is gone."""
    runner.workers = None  # (the parent's handles, copied by the fork)
    runner.after_fork()
    runner.keep_groups(groups)
    failed = False
    peak, sampled = private_bytes(), time.monotonic()
    while True:
        try:
            calls = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if calls is None:
            _send(conn, ("rss", (max(peak, private_bytes()), runner.device_pool_bytes())))
            return
        if time.monotonic() - sampled >= SAMPLE_S:  # (before the calls: the previous ones' result)
            peak, sampled = max(peak, private_bytes()), time.monotonic()
        for method, args, reply in calls:  # queued calls, then (last) the one the parent waits for
            if failed:  # the parent raises the first failure; later calls would run on a broken state
                break
            try:
                out = getattr(runner, method)(*args)
            except BaseException as exc:  # noqa: BLE001 - sent to the parent, raised there
                failed = True
                try:
                    _send(conn, ("err", exc))
                except Exception:  # an exception that does not pickle: its type and text
                    _send(conn, ("err", RuntimeError(f"{type(exc).__name__}: {exc}")))
                break
            if reply:
                _send(conn, ("ok", out))


def _send(conn, obj) -> None:
    """One pickled message (plain pickle: multiprocessing's own reducers are not needed for these)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class GroupWorkers:
    """Child processes each running a share of a PolicyRunner's groups (see the module docstring)."""

    def __init__(self, runner, shares: list[list[int]]):
        """Fork one child per share (`runner` must offer `after_fork`, `keep_groups` and `device_pool_bytes`); the
        parent keeps what the shares leave."""
        self.children: list[tuple[int, object]] = []  # (pid, connection)
        self.extra_rss_bytes = 0
        self.extra_device_bytes = 0  # the children's device allocators at their end (a device backend's), summed
        for groups in shares:
            here, there = Pipe(duplex=True)
            pid = os.fork()
            if pid == 0:  # the child: never returns into the parent's code
                code = 0
                try:
                    here.close()
                    for _, conn in self.children:  # earlier children's pipes are the parent's
                        conn.close()
                    _serve(there, runner, groups)
                except BaseException:  # noqa: BLE001 - the parent sees EOF and reports it
                    code = 1
                finally:
                    os._exit(code)
            there.close()
            self.children.append((pid, here))
        self._waiting = [0] * len(self.children)  # replies each child owes
        self._queued: list[tuple] = []  # calls without a reply, sent with the next one that has

    def send(self, method: str, *args, reply: bool = False) -> None:
        """Every child runs `runner.method(*args)` (in the order sent); `reply`: its result is collected by `gather`
        (calls without one wait in a queue until then)."""
        self._queued.append((method, args, reply))
        if reply:
            self._flush()

    def _flush(self) -> None:
        if not self._queued:
            return
        data = pickle.dumps(self._queued, protocol=pickle.HIGHEST_PROTOCOL)
        replies = sum(1 for call in self._queued if call[2])
        self._queued = []
        for i, (_, conn) in enumerate(self.children):
            conn.send_bytes(data)
            self._waiting[i] += replies

    def gather(self) -> list:
        """The result of the last call sent with `reply`, from every child (in child order); a child's failure is
        raised here."""
        out = []
        for i, (pid, conn) in enumerate(self.children):
            result = None
            while self._waiting[i]:
                try:
                    kind, value = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    raise RuntimeError(f"policy worker {pid} ended unexpectedly") from None
                if kind == "err":
                    self._waiting[i] = 0
                    raise value
                self._waiting[i] -= 1
                result = value
            out.append(result)
        return out

    def close(self) -> None:
        """Stop the children and wait for them; the sum of their largest private-memory samples goes to
        `extra_rss_bytes`. A queued call that failed in a child is raised here, once every child is gone."""
        failure = None
        try:
            self._flush()
        except (EOFError, OSError):
            pass
        for pid, conn in self.children:
            try:
                _send(conn, None)
                while True:
                    kind, value = pickle.loads(conn.recv_bytes())
                    if kind == "rss":
                        self.extra_rss_bytes += int(value[0])
                        self.extra_device_bytes += int(value[1])
                        break
                    if kind == "err" and failure is None:
                        failure = value
            except (EOFError, OSError):
                pass
            finally:
                conn.close()
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
        self.children = []
        if failure is not None:
            raise failure

    def kill(self) -> None:
        """End the children at once (the parent is failing)."""
        import signal

        for pid, conn in self.children:
            conn.close()
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self.children = []


__all__ = ["ENV_VAR", "GroupWorkers", "resolve_processes", "usable_cores"]
