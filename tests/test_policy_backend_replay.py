"""`--policy-backend`: a replay's policy caches on another array backend give the numpy reference's metrics bit for
bit (torch on the CPU here; cupy on a GPU, `-m gpu`), and a backend this machine cannot run is one line, exit 2."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sim
from sim.policy_backend import cuda_device_count, resolve

# Small, under pressure: GPU hit rates below 1 (misses, exchanges, TP buffer fetches), every group, every request.
REDUCED = ["workload.num_requests=6", "workload.max_concurrency=3", "workload.max_steps=12",
           "fidelity.policy_groups=0", "fidelity.request_fraction=1.0", "memory.gpu_kv_bytes_per_gpu=0.5e9",
           "spec.draft_tokens=2"]
WALL = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "peak_rss_bytes", "policy_backend",
        "policy_probe_step_ms", "policy_processes", "policy_threads", "est_peak_memory_bytes", "policy_device_pool_bytes",
        "selections_on"}  # (the estimate counts this process)


def _same_metrics(backend: str, sets: list[str], workers: int = 1, fresh: Path | None = None) -> None:
    """`fresh`: the backend's replay runs as `ulacache replay` in a new process (one without a CUDA context yet,
    which its group workers need) writing there."""
    ref = sim.replay("configs/demo.yaml", None, overrides=REDUCED + sets, policy_backend="numpy")
    if fresh is None:
        got = sim.replay("configs/demo.yaml", None, overrides=REDUCED + sets, policy_backend=backend,
                         policy_workers=workers)
    else:
        cmd = [sys.executable, "-m", "ulacache_cli", "replay", "configs/demo.yaml", "--out", str(fresh), "--quiet",
               "--policy-backend", backend, "--policy-workers", str(workers)]
        for kv in REDUCED + sets:
            cmd += ["--set", kv]
        subprocess.run(cmd, check=True)
        got = json.loads((fresh / "metrics.json").read_text())
    assert got["policy_backend"] == backend and ref["policy_backend"] == "numpy"
    assert got["policy_processes"] == workers  # a device backend's groups split before its caches exist
    assert "policy_device_pool_bytes" in got and "policy_device_pool_bytes" not in ref
    assert (ref["selections_on"], got["selections_on"]) == ("host", "device" if backend == "cupy" else "host")
    assert ref["gpu_hit_rate"] < 1.0 and ref["policy_calls"] > 0  # the policy did real work
    differ = {k: (ref[k], got.get(k)) for k in ref if k not in WALL and ref[k] != got.get(k)}
    assert not differ


@pytest.mark.parametrize("sets", [["attention=tp"], ["attention=dp"], ["system=hisparse", "attention=dp"]])
def test_torch_backend_replay_equals_numpy(sets):
    pytest.importorskip("torch")
    _same_metrics("torch", sets)


def test_torch_backend_in_group_workers_equals_numpy():
    """The groups split over 3 processes, each building its own torch caches after the fork."""
    pytest.importorskip("torch")
    _same_metrics("torch", ["attention=tp"], workers=3)


def test_torch_backend_in_group_workers_from_the_cli(tmp_path):
    pytest.importorskip("torch")
    _same_metrics("torch", ["system=hisparse", "attention=dp"], workers=2, fresh=tmp_path / "torch2")


def test_a_device_backend_with_a_pilot_runs_its_groups_in_one_process():
    """With a pilot the simulated groups are known only after it, when the caches exist: no split."""
    pytest.importorskip("torch")
    sets = ["workload.num_requests=4", "workload.max_concurrency=2", "workload.max_steps=6", "fidelity.policy_groups=2",
            "fidelity.pilot_steps=2"]
    got = sim.replay("configs/demo.yaml", None, overrides=sets, policy_backend="torch", policy_workers=3)
    assert got["policy_processes"] == 1 and got["policy_calls"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("sets", [["attention=tp"], ["attention=dp"], ["system=hisparse", "attention=dp"]])
def test_cupy_backend_replay_equals_numpy(sets):
    if cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    _same_metrics("cupy", sets)


@pytest.mark.gpu
def test_cupy_backend_in_group_workers_equals_numpy(tmp_path):
    """Each group worker makes its own CUDA context (forked before any): the same metrics as numpy."""
    if cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    _same_metrics("cupy", ["attention=tp"], workers=3, fresh=tmp_path / "cupy3")


@pytest.mark.gpu
def test_cupy_in_a_process_with_a_context_runs_its_groups_here():
    """A process that holds a CUDA context already cannot fork workers that use the device: one process, the
    same metrics."""
    if cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    import cupy

    cupy.zeros(1)  # (a context here)
    got = sim.replay("configs/demo.yaml", None, overrides=REDUCED + ["attention=tp"], policy_backend="cupy",
                     policy_workers=3)
    assert got["policy_processes"] == 1


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
