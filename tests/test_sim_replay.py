"""End-to-end replays on a tiny workload: every system x attention mode, outputs, capacity ordering, fidelity."""
import json

import pandas as pd
import pytest

import sim


def _config(profile, **over):
    cfg = {
        "system": "ulacache", "attention": "tp", "model": {"preset": "glm-5.2", "weight_bytes": 100e9},
        "hardware": {"preset": "h200", "num_gpus": 2},
        "workload": {"profile": profile, "num_requests": 8, "max_concurrency": 64, "seed": 1},
        "memory": {"gpu_kv_bytes_per_gpu": 1.0e9, "cpu_kv_bytes_per_gpu": 4e9},
        "fidelity": {"policy_groups": 3},
    }
    for key, value in over.items():
        node = cfg
        parts = key.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return cfg


@pytest.mark.parametrize("attention", ["dp", "tp"])
@pytest.mark.parametrize("system", ["sglang", "hisparse", "ulacache"])
def test_every_system_and_mode_runs_and_writes_outputs(profile, tmp_path, system, attention):
    out = tmp_path / "run"
    trace = tmp_path / "trace.json"
    m = sim.replay(_config(profile, system=system, attention=attention, spec__draft_tokens=2), out,
                   trace_events=trace)
    for key in ("system", "attention", "num_requests", "completed_requests", "max_admitted_concurrency",
                "decode_throughput_tok_s", "tpot_ms_p50", "tpot_ms_mean", "gpu_hit_rate", "pcie_bytes_per_token",
                "nvlink_bytes_per_token", "physical_kv_slots", "unique_history_positions", "sim_wall_s"):
        assert key in m
    assert m["system"] == system and m["attention"] == attention
    assert m["completed_requests"] == m["num_requests"] - m["rejected_requests"] == 8
    assert m["decode_throughput_tok_s"] > 0 and 0 <= m["gpu_hit_rate"] <= 1
    assert m["physical_kv_slots"] >= m["unique_history_positions"] > 0
    assert json.loads((out / "metrics.json").read_text())["system"] == system
    tl = pd.read_parquet(out / "timeline.parquet")
    parts = ["indexer_s", "allgather_s", "mgmt_s", "transfer_stall_s", "attention_s", "ffn_s", "collective_s",
             "draft_s", "overhead_s"]
    assert len(tl) == m["decode_steps"]
    assert ((tl[parts].sum(axis=1) - tl["step_s"]).abs() <= 1e-9 + 1e-6 * tl["step_s"]).all()
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert any(n.endswith("compute") for n in names)
    if system == "sglang":
        assert m["pcie_bytes_per_token"] == 0 and m["gpu_hit_rate"] == 1.0
    if system == "hisparse" or (system == "ulacache" and m["gpu_hit_rate"] < 1):
        assert any("pcie" in n for n in names)
    if attention == "tp" and system in ("sglang", "hisparse"):
        assert m["cap_replica_slots"] == pytest.approx(m["cap_unique_slots"])  # 2 ranks: one replica each
    if system == "ulacache":
        assert m["cap_replica_slots"] == 0


@pytest.mark.parametrize("hw, model", [("h200", "glm-5"), ("b300", "deepseek-v3.2"), ("b300", "glm-5.2")])
def test_presets_run(profile, hw, model):
    m = sim.replay(_config(profile, hardware__preset=hw, model__preset=model, workload__num_requests=4,
                           fidelity__policy_groups=2))
    assert m["completed_requests"] == 4 and m["model"] == model and m["hardware"] == hw


@pytest.mark.parametrize("attention", ["dp", "tp"])
def test_admitted_concurrency_orders_as_capacity_at_matched_budgets(attention):
    """Histories well above HiSparse's 4096-slot buffer (8K-16K prompts), budgets scaled down as in the demo."""
    got = {}
    for system in ("sglang", "hisparse", "ulacache"):
        cfg = {"system": system, "attention": attention, "spec": {"draft_tokens": 2},
               "workload": {"profile": "small", "num_requests": 64, "max_concurrency": 64, "max_steps": 2},
               "memory": {"gpu_kv_bytes_per_gpu": 2.5e9, "cpu_kv_bytes_per_gpu": 10e9},
               "fidelity": {"policy_groups": 2, "pilot_steps": 0}}
        got[system] = sim.replay(cfg)
    conc = {s: got[s]["max_admitted_concurrency"] for s in got}
    assert conc["ulacache"] >= conc["hisparse"] >= conc["sglang"] >= 1, conc
    assert conc["ulacache"] > conc["sglang"], conc
    assert len({got[s]["cap_gpu_kv_budget_bytes_per_gpu"] for s in got}) == 1  # matched budgets
    # TP replication: sglang's physical slots are num_gpus x its unique history; ulacache keeps history once
    s, u = got["sglang"], got["ulacache"]
    copies = 8 if attention == "tp" else 1
    assert s["physical_kv_slots"] == pytest.approx(copies * s["unique_history_positions"])
    assert u["cap_unique_slots"] == u["unique_history_positions"]
    assert u["physical_kv_slots"] == pytest.approx(u["cap_unique_slots"] + u["cap_buffer_slots"])


def test_speculative_decoding_moves_more_tokens_per_step(profile):
    off = sim.replay(_config(profile, system="sglang"))
    on = sim.replay(_config(profile, system="sglang", spec__draft_tokens=4))
    assert on["decode_tokens"] == off["decode_tokens"]
    assert on["decode_steps"] < off["decode_steps"]


def test_replay_is_deterministic(profile):
    a = sim.replay(_config(profile, spec__draft_tokens=2))
    b = sim.replay(_config(profile, spec__draft_tokens=2))
    for key in ("decode_throughput_tok_s", "gpu_hit_rate", "pcie_bytes_per_token", "decode_steps"):
        assert a[key] == b[key]


def test_sampled_groups_agree_with_full_run(profile):
    """Fidelity knob: the policy on 3 of 21 indexer groups (stratified after a pilot) vs all 21 groups."""
    base = dict(system="ulacache", attention="dp", workload__num_requests=16, spec__draft_tokens=2,
                ulacache__gpu_pool_slots=16384, workload__max_concurrency=16)
    full = sim.replay(_config(profile, fidelity__policy_groups=0, **base))
    sampled = sim.replay(_config(profile, fidelity__policy_groups=3, **base))
    assert full["policy_groups_simulated"] == 21 and sampled["policy_groups_simulated"] == 3
    assert 0.2 < full["gpu_hit_rate"] < 0.95  # a case with real misses
    assert abs(sampled["gpu_hit_rate"] - full["gpu_hit_rate"]) <= 0.01
    assert abs(sampled["decode_throughput_tok_s"] / full["decode_throughput_tok_s"] - 1) <= 0.03


def test_generated_workload_replay_does_not_load_pandas():
    """A replay of a generated workload reads numpy columns: pandas (~0.6 CPU-s to import) stays unloaded."""
    import subprocess
    import sys

    code = ("import sys, sim; sim.replay({'system': 'hisparse', 'attention': 'dp', 'workload': {'num_requests': 2, "
            "'max_concurrency': 1, 'max_steps': 2}}); print(sorted(m for m in ('pandas', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
