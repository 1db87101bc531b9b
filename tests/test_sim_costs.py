"""Cost model: defaults, calibration merge, unknown keys, the pure per-piece formulas."""
import pytest
import yaml

from sim.costs import CostModel
from sim.presets import HARDWARE_PRESETS, MODEL_PRESETS


def test_defaults_fill_from_the_preset():
    cm = CostModel.load("h200", "glm-5.2")
    hw = HARDWARE_PRESETS["h200"]
    assert cm["pcie_h2d_bw_bytes_s"] == hw.pcie_bw_bytes_s
    assert cm["launch_s"] == hw.kernel_launch_s
    assert cm.model is MODEL_PRESETS["glm-5.2"]


def test_link_time_is_latency_plus_occupancy_over_bandwidth():
    cm = CostModel.load("h200", "glm-5")
    rows, row = 2048, 656
    occ = cm.h2d_link_bytes(rows, row)
    assert occ == pytest.approx(rows * row / cm["h2d_row_efficiency"])
    assert cm.h2d_s(rows, row) == pytest.approx(cm["pcie_latency_s"] + occ / cm["pcie_h2d_bw_bytes_s"])
    assert cm.h2d_s(0, row) == 0.0
    assert cm.exchange_s(rows, rows // 2, row) == pytest.approx(cm.h2d_s(rows, row))
    assert cm.peer_s(rows, row) < cm.h2d_s(rows, row)


def test_calibration_overrides_and_tables(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"provenance": {"device": "H200", "date": "2026-11-30", "command": "x"},
                                   "costs": {"mgmt_per_ref_s": 1e-10, "h2d_row_efficiency_by_bytes":
                                             {656: 0.5, 1152: 0.9}}}))
    cm = CostModel.load("h200", "glm-5", calibration=cal)
    assert cm["mgmt_per_ref_s"] == 1e-10
    assert cm.h2d_link_bytes(1, 656) == pytest.approx(656 / 0.5)
    assert cm.h2d_link_bytes(1, 904) == pytest.approx(904 / 0.7)  # interpolated
    assert cm.management_s(2_000_000, 1_000_000, 0) == pytest.approx(cm.launch_s(5) + 2e-4)
    assert cm.provenance["calibration"] == str(cal)


@pytest.mark.parametrize("costs, msg", [
    ({"costs": {"no_such_key": 1}}, "unknown cost key"),
    ({"costs": {"mgmt_per_ref_s": "fast"}}, "non-negative number"),
    ({"costs": {"hbm_efficiency": 2.0}}, "must be in (0, 1]"),
    ({"provenance": {}, "costs": {}, "extra": 1}, "unknown calibration key"),
    ({"provenance": {}}, "needs a top-level 'costs:'"),
])
def test_bad_calibration_is_refused(tmp_path, costs, msg):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump(costs))
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        CostModel.load("h200", "glm-5", calibration=cal)


def test_compute_pieces_scale_sensibly():
    cm = CostModel.load("h200", "deepseek-v3.2")
    assert cm.attention_s(1024, 2 * 1024 * 2048, 16) > cm.attention_s(1024, 1024 * 2048, 16)
    assert cm.indexer_s(8 * 131072, 8 * 131072 * 4) > cm.indexer_s(131072, 131072 * 4)
    # decode at batch 256 reads (nearly) every expert: MoE time ~ weights / HBM bandwidth per layer
    full = cm.ffn_s(256, 8, attn_replicated=False)
    one = cm.ffn_s(1, 8, attn_replicated=False)
    assert full > 5 * one
    assert cm.collective_s(1e6, 1) == 0.0 and cm.collective_s(1e6, 8) > 0
