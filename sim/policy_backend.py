"""Which array backend the replay's policy caches run on (`--policy-backend`): an execution choice, like the policy
workers, that never changes a result (every backend computes the numpy reference's plans bit for bit:
ulacache/backends/README.md).

    numpy  the reference (default)
    cupy   the library's CUDA kernels on the current device (needs cupy and a CUDA device)
    torch  the torch backend (CPU or CUDA; what CI checks the plumbing with)
    auto   cupy where a CUDA device is usable, else numpy

A CUDA context does not survive a fork, and the group workers (sim/group_workers.py) fork: on a device backend
they are forked before any cache exists (full fidelity; with a pilot the groups run in one process), and this
module asks whether a device is usable in a child process, so the replay's own process has no CUDA context to lose.
"""
from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys

CHOICES = ("numpy", "cupy", "torch", "auto")
ENV_VAR = "ULACACHE_POLICY_BACKEND"  # the backend when the caller names none


@functools.lru_cache(maxsize=1)
def cuda_device_count() -> int:
    """CUDA devices cupy can use here (0 without cupy, a driver or a device), asked in a child process so that this
    one makes no CUDA context (the group workers fork after this)."""
    if importlib.util.find_spec("cupy") is None:
        return 0
    try:
        out = subprocess.run([sys.executable, "-c", _COUNT], capture_output=True, text=True, timeout=300)
        return int(out.stdout.split()[-1]) if out.returncode == 0 and out.stdout.split() else 0
    except (OSError, subprocess.SubprocessError, ValueError):
        return 0


_COUNT = """
try:
    import cupy
    print(int(cupy.cuda.runtime.getDeviceCount()))
except Exception:  # no driver, no device: none here
    print(0)
"""


def cuda_context_here() -> bool:
    """Whether this process holds a CUDA context already (cupy used before, e.g. by an earlier replay in the same
    process): asked of the driver without initialising it."""
    if "cupy" not in sys.modules:
        return False
    try:
        from cupy.cuda import driver

        return bool(driver.ctxGetCurrent())
    except Exception:  # the driver not initialised (or none): no context
        return False


def device_pool_bytes() -> int:
    """What this process's device allocator holds (cupy's pool: the most it needed at once, to its rounding; torch
    on CUDA: its peak allocation); 0 where neither was used."""
    if "cupy" in sys.modules:
        return int(sys.modules["cupy"].get_default_memory_pool().total_bytes())
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    return 0


def resolve(name: str | None) -> str:
    """The backend to run: `name` (None: $ULACACHE_POLICY_BACKEND, else numpy), `auto` resolved; ValueError (one
    line) for an unknown name or a backend this machine cannot run."""
    import os

    if name is None:
        name = os.environ.get(ENV_VAR, "").strip() or "numpy"
    if name not in CHOICES:
        raise ValueError(f"policy backend {name!r}: choose one of {', '.join(CHOICES)}")
    if name == "auto":
        return "cupy" if cuda_device_count() > 0 else "numpy"
    if name == "cupy" and cuda_device_count() == 0:
        raise ValueError("policy backend 'cupy' needs cupy (pip install '.[gpu]') and a CUDA device; none is usable "
                         "here (--policy-backend auto falls back to numpy)")
    if name == "torch":
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ValueError("policy backend 'torch' needs torch (pip install '.[torch]')") from None
    return name
