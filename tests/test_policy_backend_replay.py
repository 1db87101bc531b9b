"""`--policy-backend`: a replay's policy caches on another array backend give the numpy reference's metrics bit for
bit (torch on the CPU here; cupy on a GPU, `-m gpu`), and a backend this machine cannot run is one line, exit 2."""
import subprocess
import sys

import pytest

import sim
from sim.policy_backend import cuda_device_count, resolve

# Small, under pressure: GPU hit rates below 1 (misses, exchanges, TP buffer fetches), every group, every request.
REDUCED = ["workload.num_requests=6", "workload.max_concurrency=3", "workload.max_steps=12",
           "fidelity.policy_groups=0", "fidelity.request_fraction=1.0", "memory.gpu_kv_bytes_per_gpu=0.5e9",
           "spec.draft_tokens=2"]
WALL = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "peak_rss_bytes", "policy_backend",
        "policy_probe_step_ms", "policy_processes", "est_peak_memory_bytes"}  # (the estimate counts this process)


def _same_metrics(backend: str, sets: list[str]) -> None:
    runs = {b: sim.replay("configs/demo.yaml", None, overrides=REDUCED + sets, policy_backend=b)
            for b in ("numpy", backend)}
    ref, got = runs["numpy"], runs[backend]
    assert got["policy_backend"] == backend and ref["policy_backend"] == "numpy"
    assert ref["gpu_hit_rate"] < 1.0 and ref["policy_calls"] > 0  # the policy did real work
    differ = {k: (ref[k], got.get(k)) for k in ref if k not in WALL and ref[k] != got.get(k)}
    assert not differ


@pytest.mark.parametrize("sets", [["attention=tp"], ["attention=dp"], ["system=hisparse", "attention=dp"]])
def test_torch_backend_replay_equals_numpy(sets):
    pytest.importorskip("torch")
    _same_metrics("torch", sets)


@pytest.mark.gpu
@pytest.mark.parametrize("sets", [["attention=tp"], ["attention=dp"], ["system=hisparse", "attention=dp"]])
def test_cupy_backend_replay_equals_numpy(sets):
    if cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    _same_metrics("cupy", sets)


def test_resolve_names_and_auto(monkeypatch):
    monkeypatch.delenv("ULACACHE_POLICY_BACKEND", raising=False)
    assert resolve(None) == "numpy" and resolve("numpy") == "numpy"
    assert resolve("auto") == ("cupy" if cuda_device_count() else "numpy")
    with pytest.raises(ValueError, match="choose one of"):
        resolve("jax")
    monkeypatch.setenv("ULACACHE_POLICY_BACKEND", "jax")
    with pytest.raises(ValueError, match="'jax'"):
        resolve(None)


def test_cli_refuses_cupy_without_a_device(tmp_path):
    if cuda_device_count():
        pytest.skip("a CUDA device is usable here")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "ulacache_cli", "replay", "configs/demo.yaml", "--out", str(out),
                           "--policy-backend", "cupy", "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "needs cupy" in proc.stderr
    assert not out.exists()
