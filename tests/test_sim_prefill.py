"""Prefill (issue 11 item 6): untimed leaves every outcome as it was; chunked prefill is timed beside decode (TTFT
grows with the prompt, shrinks with the chunk); the prompt KV each system puts in host memory is reported."""
import json

import pytest
import yaml

import sim
from sim.prefill import default_chunk_tokens
from sim.presets import HARDWARE_PRESETS
from ulacache_cli.main import main

BASE = {"model": {"preset": "glm-5", "weight_bytes": 100e9}, "hardware": {"preset": "h200", "num_gpus": 2},
        "memory": {"gpu_kv_bytes_per_gpu": 0.6e9, "cpu_kv_bytes_per_gpu": 20e9},
        "fidelity": {"policy_groups": 2, "pilot_steps": 0, "request_fraction": 1.0}}
PROFILE = """
name: fixed{n}
description: prompts of {n} tokens
input_tokens: {{median_tokens: {n}, sigma: 0.01, min_tokens: {n}, cap_tokens: {n}}}
output_tokens: {{median_tokens: 16, sigma: 0.01, min_tokens: 16, max_tokens: 16}}
arrival: {{process: closed, rate_per_s: 1.0}}
selections: {{top_k: 2048, calib_history_tokens: {n}}}
"""


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """fixed(n) -> path of a profile whose every prompt has n tokens (16 output tokens)."""
    root = tmp_path_factory.mktemp("fixed")

    def make(n: int) -> str:
        path = root / f"fixed{n}.yaml"
        path.write_text(PROFILE.format(n=n))
        return str(path)
    return make


def run(profile: str, system="ulacache", attention="dp", extra=None, **workload) -> dict:
    cfg = {**BASE, **(extra or {}), "system": system, "attention": attention,
           "workload": {"num_requests": 4, "max_concurrency": 4, "seed": 3, "profile": profile, **workload}}
    return sim.replay(cfg)


def test_untimed_is_the_default_and_names_itself(profile):
    m = run(profile)
    assert m["prefill_mode"] == "untimed" and m["prefill_s"] == 0.0 and m["ttft_ms_p50"] is None
    volatile = {"sim_wall_s", "sim_tokens_per_wall_s", "simpy_events_per_wall_s", "peak_rss_bytes",
                "est_peak_memory_bytes"}  # the machine's, not the simulation's
    same = run(profile, prefill="untimed")
    assert {k: v for k, v in m.items() if k not in volatile} == {k: v for k, v in same.items() if k not in volatile}


@pytest.mark.parametrize("mode", ["untimed", "chunked"])
def test_host_bytes_are_the_prompt_kv_each_system_spills(profile, mode):
    kv = 656 * 78  # glm-5: bytes of one token's KV over all layers
    ula = run(profile, "ulacache", "dp", {"ulacache": {"gpu_pool_slots": 6000}}, prefill=mode)
    assert ula["prompt_host_write_bytes"] == pytest.approx(ula["pcie_prompt_load_bytes"], rel=1e-12)
    assert ula["prompt_host_write_bytes"] > 0  # a GPU pool below the prompts: the rest is placed on the CPU
    assert run(profile, "sglang", "tp", prefill=mode)["prompt_host_write_bytes"] == 0.0
    his = run(profile, "hisparse", "tp", prefill="chunked")  # chunked: every prompt computed, tokens counted
    assert his["prefill_tokens"] > 0
    assert his["prompt_host_write_bytes"] == pytest.approx(2 * his["prefill_tokens"] * kv, rel=1e-12)  # per replica


ROOMY = {"memory": {"gpu_kv_bytes_per_gpu": 2.0e9, "cpu_kv_bytes_per_gpu": 20e9}}  # 4 prompts of 12K tokens fit


def test_chunked_ttft_grows_with_the_prompt(fixed):
    ttft = [run(fixed(n), "sglang", "tp", ROOMY, prefill="chunked")["ttft_ms_p50"] for n in (1000, 3000, 9000)]
    assert ttft[0] < ttft[1] < ttft[2]


def test_chunk_size_trades_ttft_against_step_time(fixed):
    out = [run(fixed(12000), "sglang", "tp", ROOMY, prefill="chunked", prefill_chunk_tokens=c)
           for c in (1024, 4096, 16384)]
    ttft = [m["ttft_ms_p50"] for m in out]
    assert ttft[0] > ttft[1] > ttft[2]  # fewer, larger pieces: the prompt is done sooner
    assert [m["prefill_chunk_tokens"] for m in out] == [1024, 4096, 16384]
    assert all(m["prefill_tokens"] == 4 * 12000 for m in out)
    longest = [m["prefill_s"] / max(1, -(-12000 // m["prefill_chunk_tokens"])) for m in out]
    assert longest[0] < longest[1] < longest[2]  # a step carrying a larger piece takes longer


def test_chunked_decodes_the_same_tokens_and_costs_time(profile):
    a, b = run(profile, "hisparse", "tp"), run(profile, "hisparse", "tp", prefill="chunked")
    assert b["completed_requests"] == a["completed_requests"] and b["decode_tokens"] == a["decode_tokens"]
    assert b["prefill_mode"] == "chunked" and b["prefill_s"] > 0 and b["makespan_s"] > a["makespan_s"]
    assert 0 < b["ttft_ms_p50"] <= b["ttft_ms_p90"]


def test_host_writes_share_the_pcie_links(fixed):
    """HiSparse writes whole prompts to the host: a slow D2H link delays its first tokens; SGLang writes none."""
    slow = {"pcie_d2h_bw_bytes_s": 1e8}

    def ttft(system, costs):
        cfg = {**BASE, "system": system, "attention": "tp", "costs": costs,
               "workload": {"num_requests": 2, "max_concurrency": 2, "seed": 3, "profile": fixed(4000),
                            "prefill": "chunked"}}
        return sim.replay(cfg)["ttft_ms_p50"]
    assert ttft("hisparse", slow) > 1.5 * ttft("hisparse", {})
    assert ttft("sglang", slow) == pytest.approx(ttft("sglang", {}), rel=1e-9)


def test_default_chunk_is_sglangs():
    assert default_chunk_tokens(HARDWARE_PRESETS["h200"].hbm_bytes) == 8192
    assert default_chunk_tokens(HARDWARE_PRESETS["b300"].hbm_bytes) == 16384


@pytest.mark.parametrize("sets, needle", [
    (["workload.prefill=eager"], "workload.prefill must be one of"),
    (["workload.prefill_chunk_tokens=0"], "workload.prefill_chunk_tokens must be >= 1"),
    (["workload.prefill_chunk_tokens=1"], ">= hardware.num_gpus under dp"),
    (["workload.prefill_chunk_tokens=lots"], "workload.prefill_chunk_tokens must be an integer"),
])
def test_bad_prefill_keys_exit_2_with_one_line(tmp_path, refused_replay, sets, needle):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"system": "sglang", "attention": "dp", "hardware": {"num_gpus": 2},
                                   "model": {"weight_bytes": 100e9},
                                   "workload": {"profile": "small", "num_requests": 2, "max_steps": 5}}))
    assert needle in refused_replay(cfg, tmp_path / "o", sets)
    assert not (tmp_path / "o").exists()


def test_metrics_file_carries_the_mode(tmp_path, profile):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "system": "ulacache", "attention": "tp",
                                   "workload": {"num_requests": 2, "max_concurrency": 2, "profile": profile}}))
    assert main(["replay", str(cfg), "--out", str(tmp_path / "o"), "--quiet",
                 "--set", "workload.prefill=chunked"]) == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["prefill_mode"] == "chunked" and m["prefill_chunk_tokens"] == 8192 and m["ttft_ms_p50"] > 0


def test_sweep_over_modes_and_its_report(tmp_path, profile):
    """A sweep over both modes writes one table (TTFT null where untimed) and the report draws from it."""
    from reports import build_report
    from sim.studies.sweep import parse_grid, run_sweep

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**BASE, "system": "sglang", "attention": "tp",
                                   "workload": {"num_requests": 2, "max_concurrency": 2, "profile": profile}}))
    df = run_sweep(cfg, parse_grid(["workload.prefill=untimed,chunked"]), tmp_path / "s", workers=1)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    by = df.set_index("workload.prefill")
    assert by.loc["chunked", "prefill_mode"] == "chunked" and by.loc["chunked", "ttft_ms_p50"] > 0
    assert by.loc["untimed", "prefill_s"] == 0.0
    index = build_report(tmp_path / "s", tmp_path / "rep")
    assert "throughput_vs_concurrency.png" in index.read_text()


def test_footprint_counts_prompts_being_prefilled(fixed):
    """Chunked: a request whose prompt is being prefilled holds its slots; the peak footprint sees them. In 1,024-token
    pieces the prompts finish one after another (each decodes its 16 tokens before the next prompt is done)."""
    m = run(fixed(9000), "sglang", "tp", ROOMY, prefill="chunked", prefill_chunk_tokens=1024)
    assert m["max_admitted_concurrency"] < m["cap_peak_concurrency"]  # decoding + admitted, being prefilled
    assert m["unique_history_positions"] >= m["cap_peak_concurrency"] * 9000
