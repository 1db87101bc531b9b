"""Array backends behind one protocol, chosen by `CacheConfig.backend` from a registry.

numpy is the reference oracle. cupy and torch backends register lazily: their modules import cupy/torch only when
the backend is requested, so `import ulacache` never needs them.
"""
from __future__ import annotations

import importlib

from .base import Array, Backend

# name -> "module:attribute" of the backend class; modules are imported on first use only.
BACKENDS: dict[str, str] = {
    "numpy": "ulacache.backends.numpy_backend:NumpyBackend",
    "torch": "ulacache.backends.torch_backend:TorchBackend",
    "cupy": "ulacache.backends.cupy_backend:CupyBackend",
}


def get_backend(name: str) -> Backend:
    """An instance of the backend called `name`; ValueError for an unknown or unavailable one."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}")
    module_name, attr = BACKENDS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"backend {name!r} is not available here: {exc}") from None
    return getattr(module, attr)()


__all__ = ["Array", "Backend", "BACKENDS", "get_backend"]
