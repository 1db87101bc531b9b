"""HiSparse calibration path (CPU): the cost derivation recovers known per-call constants from graph timings, and
merging a `hw hisparse` JSON updates only the HiSparse keys of a calibration YAML."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hw.hisparse_bench import derive_costs

H2D = 55e9
FIXED, PER_REF, MTP_FIXED, MTP_REF = 9e-6, 2e-10, 14e-6, 1.5e-10


def _points():
    plain, mtp, planned = [], [], []
    for B, eff in ((1, 0.2), (4, 0.5), (16, 0.9), (64, 0.85), (256, 0.6)):
        skip = FIXED + PER_REF * B * 2048
        mskip = MTP_FIXED + MTP_REF * B * 4 * 2048
        nbytes = 300.0 * B * 656
        copy = nbytes / (eff * H2D)
        plain.append({"batch": B, "top_k": 2048, "skip_io_us": skip * 1e6, "eager_idle_skip_io_us": skip * 1e6 + 30,
                      "copy_gbps": nbytes / copy / 1e9})
        mtp.append({"batch": B, "top_k": 2048, "steps": 4, "skip_io_us": mskip * 1e6,
                    "copy_gbps": nbytes / copy / 1e9 * 1.1})
        planned.append({"batch": B, "empty_us": 3.0, "copy_gbps": nbytes / copy / 1e9 * 0.5})
    return plain, mtp, planned


def test_derive_costs_recovers_constants():
    costs, fits = derive_costs(*_points(), H2D)
    assert costs["hisparse_swapin_fixed_s"] == pytest.approx(FIXED, rel=1e-6)
    assert costs["hisparse_per_ref_s"] == pytest.approx(PER_REF, rel=1e-6)
    assert costs["hisparse_mtp_swapin_fixed_s"] == pytest.approx(MTP_FIXED, rel=1e-6)
    assert costs["hisparse_mtp_per_ref_s"] == pytest.approx(MTP_REF, rel=1e-6)
    assert costs["hisparse_swapin_efficiency_by_batch"] == {1: 0.2, 4: 0.5, 16: 0.9, 64: 0.85, 256: 0.6}
    assert costs["hisparse_mtp_swapin_efficiency_by_batch"][16] == 0.99
    assert costs["hisparse_planned_copy_efficiency_by_batch"][4] == 0.25
    assert costs["hisparse_planned_copy_fixed_s"] == pytest.approx(3e-6)
    # the eager (idle GPU) fit carries the launch path: a larger constant than the graph's
    assert fits["plain_eager_idle"]["const_s"] > costs["hisparse_swapin_fixed_s"] + 20e-6


def test_merge_updates_only_hisparse_keys(tmp_path: Path):
    from hw.calibrate import merge_hisparse

    src = Path(__file__).resolve().parents[1] / "hw" / "calibration" / "h200.yaml"
    cal = tmp_path / "h200.yaml"
    cal.write_text(src.read_text())
    before = yaml.safe_load(cal.read_text())
    costs, _ = derive_costs(*_points(), H2D)
    res = {"date": "2026-12-06T00:00:00Z", "command": "python3 -m hw hisparse", "timing": "graph, busy",
           "device": {"gpu": "NVIDIA H200", "source_digest": "abc"}, "costs": costs}
    js = tmp_path / "hs.json"
    js.write_text(json.dumps(res))
    merge_hisparse(str(cal), str(js))
    after = yaml.safe_load(cal.read_text())
    for k, v in before["costs"].items():
        if not k.startswith("hisparse_"):
            assert after["costs"][k] == v
    merged = {**after["costs"], **after["provenance"].get("pending_costs", {})}
    assert merged["hisparse_swapin_fixed_s"] == pytest.approx(FIXED)
    assert merged["hisparse_swapin_efficiency_by_batch"][256] == 0.6  # int keys again
    assert after["provenance"]["hisparse"]["timing"] == "graph, busy"
    assert {k: v for k, v in after["provenance"].items() if k != "hisparse"} == \
        {k: v for k, v in before["provenance"].items() if k != "hisparse"} | (
            {"pending_costs": after["provenance"]["pending_costs"]} if "pending_costs" in after["provenance"] else {})


def test_merge_refuses_a_run_cut_short(tmp_path: Path):
    """A `hw hisparse` run stopped by a device's time limit saves its checks and timed batches but no costs: merging
    it is one clear error, and the calibration is left as it was."""
    from hw.calibrate import merge_hisparse

    cal = tmp_path / "h200.yaml"
    cal.write_text((Path(__file__).resolve().parents[1] / "hw" / "calibration" / "h200.yaml").read_text())
    before = cal.read_text()
    js = tmp_path / "hs.json"
    js.write_text(json.dumps({"date": "2026-12-07T00:00:00Z", "complete": False, "plain": [], "mtp": []}))
    with pytest.raises(ValueError, match="incomplete"):
        merge_hisparse(str(cal), str(js))
    assert cal.read_text() == before
