"""Which array backend the replay's policy caches run on (`--policy-backend`): an execution choice, like the policy
workers, that never changes a result (every backend computes the numpy reference's plans bit for bit:
ulacache/backends/README.md).

    numpy  the reference (default)
    cupy   the library's CUDA kernels on the current device (needs cupy and a CUDA device)
    torch  the torch backend (CPU or CUDA; what CI checks the plumbing with)
    auto   cupy where a CUDA device is usable, else numpy

The runner's caches then run in one process: a CUDA context does not survive a fork, and the group workers
(sim/group_workers.py) fork.
"""
from __future__ import annotations

CHOICES = ("numpy", "cupy", "torch", "auto")
ENV_VAR = "ULACACHE_POLICY_BACKEND"  # the backend when the caller names none


def cuda_device_count() -> int:
    """CUDA devices cupy can use here (0 without cupy, a driver or a device)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, no driver, no device: all mean "none here"
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
