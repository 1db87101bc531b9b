"""Shared test set-up: GPU tests skip cleanly where no CUDA device is present; hypothesis runs derandomized by
default so CI is reproducible (HYPOTHESIS_PROFILE=explore draws fresh random examples)."""
import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _has_gpu() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        pass
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Test-sized requests for end-to-end replays (tests/test_sim_*.py take the `profile` fixture).
TINY_PROFILE = """
name: tiny
description: test-sized requests
input_tokens: {median_tokens: 3500, sigma: 0.5, min_tokens: 3000, cap_tokens: 4096}
output_tokens: {median_tokens: 24, sigma: 0.5, min_tokens: 8, max_tokens: 48}
arrival: {process: closed, rate_per_s: 1.0}
selections: {top_k: 2048, calib_history_tokens: 3500}
"""


@pytest.fixture(scope="session")
def profile(tmp_path_factory):
    """Path of the tiny request profile above, written once per session."""
    path = tmp_path_factory.mktemp("profile") / "tiny.yaml"
    path.write_text(TINY_PROFILE)
    return str(path)


@pytest.fixture
def refused_replay(capsys):
    """`refused_replay(cfg_path, out, sets)`: runs `ulacache replay CFG --out OUT --set ...`, asserts exit 2 with one
    `ulacache: error:` line and no traceback, and returns that line (shared by the CLI tests of bad keys)."""
    from ulacache_cli.main import main

    def run(cfg_path, out, sets) -> str:
        argv = ["replay", str(cfg_path), "--out", str(out), "--quiet"]
        for item in sets:
            argv += ["--set", item]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("ulacache: error:") and "\n" not in err, err
        return err
    return run


@pytest.fixture(scope="session")
def bench_module():
    """A loader of bench/ scripts as modules (bench/ holds scripts, not a package): bench_module("paper_configs")."""
    import importlib.util
    from pathlib import Path

    loaded: dict = {}

    def load(name: str):
        if name not in loaded:
            path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
            spec = importlib.util.spec_from_file_location(name, path)
            loaded[name] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded[name])
        return loaded[name]
    return load
