"""Entry point of the `ulacache` command.

Each sub-command (or group of them) has its front-end module in this package (COMMAND_MODULES) with a
`register(subparsers)` function; the handler it sets as `func` returns an exit status. User errors (bad input, bad configs, missing files) are raised as
`ValueError` / `OSError` (or subclasses) and become one line on stderr with exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ulacache.errors import CapacityError
from ulacache_cli.extras import missing_extra

# Modules that add sub-commands; each must stay cheap to import (heavy imports go inside the handlers).
COMMAND_MODULES = ("ulacache_cli.trace", "ulacache_cli.replay", "ulacache_cli.sweep", "ulacache_cli.policy_compare",
                   "ulacache_cli.sensitivity", "ulacache_cli.hw", "ulacache_cli.report", "ulacache_cli.demo")


_SIM_HINT = ("lower workload.num_requests or workload.max_concurrency, or sample more coarsely "
             "(fidelity.request_fraction, fidelity.policy_groups)")
MEMORY_HINTS = {"replay": _SIM_HINT, "sweep": _SIM_HINT, "plan": _SIM_HINT,
                "trace": "lower --num-requests, --capture-steps, --query-tokens or --sample-requests"}


class UsageError(ValueError):
    """A user error detected by the front door itself."""


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors as the one `ulacache: error:` line (exit 2) instead of usage + message."""

    def error(self, message: str):
        print(f"ulacache: error: {' '.join(message.split())} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ulacache",
        description="KV-cache management for long-context sparse-attention serving: traces, replay, sweeps, "
        "hardware validation and reports.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a sub-command module not built yet must not break the others
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, KeyError) and text.startswith("'"):
        text = f"unknown key {text}"
    return " ".join(text.split())


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = args.func(args)
    except KeyboardInterrupt:
        print("ulacache: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:  # a command whose extra is not installed: name it (ulacache_cli/extras.py)
        line = missing_extra(exc, args.command)
        if line is None:
            raise
        print(f"ulacache: error: {line}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, KeyError, OSError, EOFError, OverflowError) as exc:
        print(f"ulacache: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except CapacityError as exc:  # admission should prevent it: one line naming the knobs, not a traceback
        print(f"ulacache: error: {_one_line(exc)} (the pools are too small for what was admitted; raise "
              "memory.gpu_kv_bytes_per_gpu / memory.cpu_kv_bytes_per_gpu or set ulacache.gpu_pool_slots)",
              file=sys.stderr)
        return 2
    except MemoryError:  # the last line of defence: the estimates refuse most such runs before they start
        hint = MEMORY_HINTS.get(args.command, MEMORY_HINTS["replay"])
        print(f"ulacache: error: out of memory in `ulacache {args.command}`; {hint}", file=sys.stderr)
        return 2
    except RecursionError:
        print("ulacache: error: input nested too deeply", file=sys.stderr)
        return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
