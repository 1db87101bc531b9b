"""Which `pip install` extra provides a third-party module, so a command that finds one missing says what to install.

`pip install ulacache` gives the policy library with numpy only; the simulator, sweeps, reports, GPU backends and
libCacheSim peers come with the extras declared in pyproject.toml.
"""
from __future__ import annotations

# top-level module -> the extra that installs it
MODULE_EXTRAS = {
    "simpy": "sim", "pandas": "sim", "pyarrow": "sim", "yaml": "sim", "rich": "sim",
    "ray": "sweep",
    "matplotlib": "report",
    "cupy": "gpu", "cupy_backends": "gpu",
    "torch": "torch",
    "libcachesim": "peers",
}
# commands whose needs differ from the module's first extra (the report reads results with pandas, not simpy)
COMMAND_EXTRAS = {("report", "pandas"): "report"}


def missing_extra(exc: ModuleNotFoundError, command: str | None) -> str | None:
    """One line naming the extra that provides the missing module, or None when the module is not a known extra's
    (a missing module of our own is a bug, not an install step)."""
    module = (exc.name or "").split(".")[0]
    extra = COMMAND_EXTRAS.get((command, module), MODULE_EXTRAS.get(module))
    if extra is None:
        return None
    where = f"`ulacache {command}`" if command else "this command"
    return (f"{where} needs the '{extra}' extra (module {module!r} is not installed): "
            f"pip install 'ulacache[{extra}]' (from a checkout: pip install -e '.[{extra}]')")
