"""bench/paper_configs.py: the grid, resume and the summary table (no replay runs here)."""
import json

import pytest


@pytest.fixture(scope="module")
def pc(bench_module):
    return bench_module("paper_configs")


def _ok(**metrics):
    return {"status": "ok", "metrics": metrics}


def test_grid_is_8_configs_x_3_systems_x_4_caps_most_wanted_first(pc):
    runs = pc.grid()
    assert len(runs) == 96 and len({r["key"] for r in runs}) == 96
    assert [r["cap"] for r in runs[:24]] == [256] * 24 and [r["cap"] for r in runs[24:48]] == [1] * 24
    assert len(pc.grid((1, 256))) == 48


def test_config_holds_pinned_keys_and_the_step_bound(pc):
    one = pc.config_of("h200", "tp", 4, "ulacache", 1, 2, 160, 320)
    assert one["workload"] == {"num_requests": 1, "max_concurrency": 1, "seed": 11, "max_steps": 0}
    assert one["model"] == {"preset": "glm-5"} and one["hardware"] == {"preset": "h200", "num_gpus": 8}
    assert one["policy"] == "pb-lru" and one["cpu_storage"] is True and one["spec"] == {"draft_tokens": 4}
    off = pc.config_of("b300", "dp", 0, "sglang", 64, 2, 160, 320)["workload"]
    assert off == {"num_requests": 128, "max_concurrency": 64, "seed": 11, "max_steps": 320}
    assert pc.config_of("b300", "dp", 4, "sglang", 64, 3, 160, 320)["workload"]["max_steps"] == 160


def test_resume_skips_only_ok_records(pc):
    runs = pc.grid((1,))
    records = {runs[0]["key"]: {"status": "ok"}, runs[1]["key"]: {"status": "error"},
               runs[2]["key"]: {"status": "not run"}}
    left = pc.todo(runs, records)
    assert runs[0] not in left and runs[1] in left and runs[2] in left and len(left) == len(runs) - 1


def test_table_peaks_tpot_and_admission(pc):
    key = lambda s, c: pc.run_key("h200", "dp", 4, s, c)  # noqa: E731
    records = {
        key("ulacache", 1): _ok(decode_throughput_tok_s=200.0, tail_throughput_tok_s=210.0, tpot_ms_mean=15.0,
                                max_admitted_concurrency=1, tpot_source="whole run"),
        key("ulacache", 16): _ok(decode_throughput_tok_s=1500.0, tail_throughput_tok_s=1400.0),
        key("ulacache", 64): _ok(decode_throughput_tok_s=3000.0, tail_throughput_tok_s=3100.0,
                                 steady_window_steps=0),
        key("ulacache", 256): _ok(decode_throughput_tok_s=2900.0, tail_throughput_tok_s=float("nan"),
                                  max_admitted_concurrency=150),
        key("sglang", 256): {"status": "error", "error": "killed by SIGKILL"},
        key("sglang", 16): _ok(decode_throughput_tok_s=None),
    }
    rows = {(r["hardware"], r["attention"], r["spec"], r["system"]): r for r in pc.table_rows(records)}
    assert len(rows) == 24
    u = rows[("h200", "dp", "on", "ulacache")]
    assert (u["peak_decode_throughput_tok_s"], u["peak_decode_throughput_tok_s_cap"]) == (3000.0, 64)
    assert (u["peak_tail_throughput_tok_s"], u["peak_tail_throughput_tok_s_cap"]) == (3100.0, 64)  # nan ignored
    assert u["peak_decode_steady_window_steps"] == 0
    assert u["batch1_tpot_ms"] == 15.0 and u["admitted_at_cap256"] == 150 and u["caps_missing"] == []
    s = rows[("h200", "dp", "on", "sglang")]
    assert s["peak_decode_throughput_tok_s"] is None and s["admitted_at_cap256"] is None
    assert s["caps_missing"] == [1, 64, 256]
    assert rows[("b300", "tp", "off", "hisparse")]["caps_missing"] == [1, 16, 64, 256]


def test_save_writes_json_and_markdown_and_load_reads_back(pc, tmp_path):
    path = tmp_path / "paper_configs_x.json"
    assert pc.load_records(path) == {"meta": {}, "records": {}}
    key = pc.run_key("b300", "tp", 0, "hisparse", 256)
    data = {"meta": {"label": "x", "commit": "abc1234", "definitions": "what each column is"},
            "records": {key: _ok(decode_throughput_tok_s=456.7, max_admitted_concurrency=32),
                        pc.run_key("b300", "tp", 0, "hisparse", 1): {"status": "error", "error": "exit 1"}}}
    pc.save(path, data)
    back = pc.load_records(path)
    assert back["records"] == json.loads(json.dumps(data["records"]))
    assert len(back["table"]) == 24
    md = path.with_suffix(".md").read_text()
    assert "abc1234" in md and "what each column is" in md
    assert "| b300 | tp | off | hisparse | 457 (256) | — | — | 32 | 1,16,64 |" in md
    assert "b300-tp-specoff-hisparse-c1: error exit 1" in md and "†" not in md
    assert not list(tmp_path.glob(".*.tmp"))


def test_memory_estimate_most_specific_key_wins(pc):
    table = {"ulacache": 6.0, "ulacache-tp": 32.0, "ulacache-tp-c1": 45.0, "default": 2.0}
    run = {"system": "ulacache", "attention": "tp", "cap": 1}
    assert pc.mem_estimate_gb(run, table) == 45.0
    assert pc.mem_estimate_gb({**run, "cap": 16}, table) == 32.0
    assert pc.mem_estimate_gb({**run, "attention": "dp"}, table) == 6.0
    assert pc.mem_estimate_gb({**run, "system": "sglang"}, table) == 2.0


def test_resume_reruns_a_record_of_other_settings(pc):
    import argparse

    args = argparse.Namespace(requests_per_cap=2, steps_on=160, steps_off=320)
    run = pc.grid((16,))[0]
    records = {run["key"]: {"status": "ok", "config": pc.run_config(run, args)}}
    assert pc.todo([run], records, lambda r: pc.run_config(r, args)) == []
    longer = argparse.Namespace(requests_per_cap=2, steps_on=400, steps_off=800)
    assert pc.todo([run], records, lambda r: pc.run_config(r, longer)) == [run]


def test_compare_puts_both_labels_side_by_side(pc):
    key = pc.run_key("h200", "tp", 4, "ulacache", 256)
    a = {"meta": {"label": "before", "commit": "85e086c"},
         "records": {key: _ok(decode_throughput_tok_s=1861.0, max_admitted_concurrency=64)}}
    b = {"meta": {"label": "after", "commit": "f00"},
         "records": {key: _ok(decode_throughput_tok_s=4100.0, max_admitted_concurrency=170)}}
    md = pc.compare_markdown(a, b)
    assert "before (85e086c) → after (f00)" in md
    assert "| h200 | tp | on | ulacache | 1,861 (256) → 4,100 (256) | — → — | — → — | 64 → 170 |" in md
