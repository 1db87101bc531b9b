"""`ulacache sensitivity` (+-50% on each assumed constant) and its tornado figure, on a tiny SGLang config."""
import json

import pandas as pd
import pytest
import yaml

from sim.config import build, resolve
from sim.costs import CostModel
from sim.studies import sensitivity

TINY = {"system": "sglang", "attention": "dp", "hardware": {"preset": "h200", "num_gpus": 8},
        "model": {"preset": "glm-5.2"}, "spec": {"draft_tokens": 0}, "workload": {"num_requests": 8, "seed": 3}}


def test_perturbation_is_clipped_to_the_valid_range_and_reads_back():
    cfg = build(resolve({**TINY, "spec": {"draft_tokens": 4}}))
    costs = CostModel.load(cfg.hardware, cfg.model)
    by_key = {c.key: c for c in sensitivity.ASSUMED}
    frac = by_key["memory.host_kv_fraction"]
    assert sensitivity.perturbed(frac, 0.75, 1.5, cfg) == 1.0  # 1.125 is not a valid fraction
    acc = by_key["spec.accept_mean"]
    assert sensitivity.base_value(cfg, costs, acc.key) == pytest.approx(3.0)
    assert sensitivity.perturbed(acc, 3.0, 1.5, cfg) == 4.0  # at most the verify tokens
    kern = by_key["costs.moe_kernels_per_layer"]
    assert sensitivity.perturbed(kern, 3.0, 0.5, cfg) == 2.0  # integer counts stay integers
    assert sensitivity.base_value(cfg, costs, "costs.step_overhead_s") == costs["step_overhead_s"]
    for value in (1e-05, 8e9, 0.36):  # YAML 1.1 reads '1e-05' as a string; the --set text must read back a number
        c = by_key["costs.step_overhead_s"]
        assert yaml.safe_load(sensitivity._text(value, c)) == pytest.approx(value)
    # constants that cannot act on the config are skipped
    applies = {c.key for c in sensitivity.ASSUMED if c.applies(cfg, costs)}
    assert "spec.accept_mean" in applies and "costs.hisparse_per_ref_s" not in applies
    hs = build(resolve({**TINY, "system": "hisparse"}))
    measured = CostModel.load(hs.hardware, hs.model)  # the committed calibration has HiSparse's per-batch table
    fallback = CostModel.load(hs.hardware, hs.model, calibration="none")
    by = {c.key: c for c in sensitivity.ASSUMED}
    eff = by["costs.hisparse_swapin_efficiency"]
    assert eff.applies(hs, fallback) and eff.applies(hs, measured) == (not measured["hisparse_swapin_efficiency_by_batch"])


def test_headline_tpot_from_steps():
    m = {"decode_steps": 10, "decode_tokens": 300.0, "mean_concurrency": 10.0, "step_ms_mean": 30.0,
         "decode_throughput_tok_s": 1000.0, "max_admitted_concurrency": 10}
    assert sensitivity.headline(m)["tpot_ms"] == pytest.approx(10.0)  # 3 tokens per request per 30-ms step


@pytest.fixture(scope="module")
def sens_dir(tmp_path_factory):
    from ulacache_cli.main import main

    root = tmp_path_factory.mktemp("sens")
    cfg = root / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY))
    out = root / "results" / "sens"
    assert main(["sensitivity", str(cfg), "--out", str(out), "--quiet", "--set", "workload.max_steps=8"]) == 0
    return cfg, out


def test_sensitivity_run_writes_table_and_moves_what_it_should(sens_dir):
    cfg, out = sens_dir
    table = pd.read_parquet(out / "sensitivity.parquet")
    assert len(pd.read_csv(out / "sensitivity.csv")) == len(table)
    meta = json.loads((out / "sensitivity.json").read_text())
    built = build(resolve(TINY))
    applicable = [c.key for c in sensitivity.ASSUMED if c.applies(built, CostModel.load(built.hardware, built.model))]
    assert sorted(set(table["constant"])) == sorted(applicable) and len(table) == 2 * len(applicable)
    assert meta["replays"] == 1 + len(table) and meta["base"]["throughput_tok_s"] > 0
    row = table.set_index(["constant", "factor"])
    # slower compute -> lower throughput, longer TPOT; a larger GPU reserve -> fewer requests fit (SGLang: GPU-bound)
    assert row.loc[("costs.flops_efficiency", 0.5), "d_throughput_tok_s_pct"] < 0
    assert row.loc[("costs.flops_efficiency", 0.5), "d_tpot_ms_pct"] > 0
    assert row.loc[("memory.gpu_reserve_bytes", 1.5), "d_admitted_pct"] < 0
    assert row.loc[("memory.gpu_reserve_bytes", 0.5), "d_admitted_pct"] > 0
    assert (row.xs("costs.step_overhead_s")["d_admitted_pct"] == 0).all()  # step costs never move admission
    assert meta["ranking"][0] in applicable


def test_sensitivity_refuses_to_overwrite(sens_dir):
    from ulacache_cli.main import main

    cfg, out = sens_dir
    before = (out / "sensitivity.csv").read_bytes()
    assert main(["sensitivity", str(cfg), "--out", str(out), "--quiet"]) == 2
    assert (out / "sensitivity.csv").read_bytes() == before


def test_tornado_figure_and_report_section(sens_dir, tmp_path):
    from reports import tornado
    from reports.html import build_report

    _, out = sens_dir
    ranked = tornado.draw(out, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000
    spans = ranked.abs().max(axis=1)
    assert list(spans) == sorted(spans, reverse=True)
    index = build_report(out.parent, tmp_path / "report")
    page = index.read_text()
    assert "Sensitivity to assumed constants" in page and (tmp_path / "report" / "tornado_0.png").exists()


def test_topology_ranges_apply_to_host_traffic_and_read_back(monkeypatch):
    """Node-topology values act only where KV crosses PCIe (UlaCache, HiSparse); each end of each range is a valid
    override of the config, and its row carries the replay's figures against the base."""
    from sim.config import load_config

    ula = build(resolve({**TINY, "system": "ulacache", "attention": "tp", "hardware": {"preset": "b300"}}))
    costs = CostModel.load(ula.hardware, ula.model)
    ranges = {t.key: t.bounds(ula, costs) for t in sensitivity.TOPOLOGY}
    assert all(v is not None for v in ranges.values())
    assert ranges["hardware.pcie_bw_bytes_s"] == (55.5e9, 111e9) and ranges["hardware.gpus_per_switch"] == (1, 2)
    lo, hi = ranges["costs.pcie_host_cap_bytes_s"]
    assert lo == pytest.approx(costs["pcie_host_cap_bytes_s"] / 2) and hi >= costs["pcie_host_cap_bytes_s"]
    sg = build(resolve(TINY))
    assert all(t.bounds(sg, CostModel.load(sg.hardware, sg.model)) is None for t in sensitivity.TOPOLOGY)
    h200 = build(resolve({**TINY, "system": "hisparse"}))
    assert {t.key for t in sensitivity.TOPOLOGY if t.bounds(h200, CostModel.load(h200.hardware, h200.model))} == {
        t.key for t in sensitivity.TOPOLOGY} - {"hardware.pcie_bw_bytes_s"}  # H200's Gen5 link is measured
    tree = resolve({**TINY, "system": "ulacache", "attention": "tp", "hardware": {"preset": "b300"}})
    seen = []

    def fake_replay(tree, out, calibration=None, overrides=(), policy_workers=None):
        seen.append(list(overrides))
        cfg = build(load_config(tree, list(overrides)))  # the override must build
        steps = 10.0 if cfg.hardware.pcie_bw_bytes_s > 60e9 else 12.0
        return {"decode_steps": 10, "decode_tokens": 100, "mean_concurrency": 10.0,
                "decode_throughput_tok_s": 1000.0 / steps, "step_ms_mean": steps}

    monkeypatch.setattr("sim.replay", fake_replay)
    base = {"throughput_tok_s": 1000.0 / 12.0, "tpot_ms": 12.0, "admitted": 7.0}
    rows, skipped = sensitivity.topology_rows(tree, ula, costs, None, base)
    assert skipped == [] and len(rows) == 2 * len(sensitivity.TOPOLOGY) == len(seen)
    pcie = {r["end"]: r for r in rows if r["constant"] == "hardware.pcie_bw_bytes_s"}
    assert pcie["low"]["d_throughput_tok_s_pct"] == pytest.approx(0.0)
    assert pcie["high"]["d_throughput_tok_s_pct"] == pytest.approx(20.0) and pcie["high"]["admitted"] == 7.0
