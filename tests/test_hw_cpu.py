"""The hw package on a CPU-only host: imports without cupy, fitting helpers, the committed calibration loads in the
simulator's cost model, and `hw validate --backend numpy` runs the same index logic for 1..8 ranks with no entry
lost or corrupted."""
from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_imports_without_cupy():
    import hw.bench  # noqa: F401
    import hw.calibrate  # noqa: F401
    import hw.executors  # noqa: F401
    import hw.validate  # noqa: F401
    import ulacache.backends.cupy_copy  # noqa: F401  (cupy only inside functions)
    import ulacache_cli.hw  # noqa: F401


def test_fit_latency_bandwidth_recovers_a_line():
    from hw.fit import fit_latency_bandwidth

    rows = np.array([4096, 16384, 65536, 131072])
    t = 8e-6 + rows * 656 / (55e9 * 0.8)
    f = fit_latency_bandwidth(rows, t, 656, 55e9)
    assert f["latency_s"] == pytest.approx(8e-6, rel=1e-6)
    assert f["efficiency"] == pytest.approx(0.8, rel=1e-9)
    with pytest.raises(ValueError):
        fit_latency_bandwidth([5, 5], [1.0, 1.0], 656, 55e9)


def test_fit_nonnegative_drops_negative_terms():
    from hw.fit import fit_nonnegative

    rng = np.random.default_rng(0)
    X = np.column_stack([np.ones(12), rng.integers(1, 10**6, 12), rng.integers(1, 10**5, 12)]).astype(float)
    y = X @ np.array([5e-5, 2e-11, 0.0]) * (1 + 0.01 * rng.standard_normal(12))
    f = fit_nonnegative(X, y, ["c", "a", "b"])
    assert min(f["c"], f["a"], f["b"]) >= 0
    assert f["median_rel_err"] < 0.05


def test_committed_calibrations_load_in_the_cost_model():
    from sim.costs import CostModel

    for name in ("h200.yaml", "h200_single_gpu.yaml"):
        path = ROOT / "hw" / "calibration" / name
        c = CostModel.load("h200", "glm-5", calibration=path)
        assert c.management_s(2_097_152, 800_000, 500_000) > 0
        assert c.exchange_s(1000, 1000, 656) > c.h2d_s(1000, 656) * 0.99


def test_payload_rows_encode_the_address():
    from hw.validate import payload_rows

    rows = payload_rows(np.array([0, 1, 2**40 + 3]), 656)
    assert rows.shape == (3, 656)
    assert len({r.tobytes() for r in rows}) == 3
    assert int(rows[2, :8].view(np.int64)[0]) == 2**40 + 3


def _args(**kw):
    base = dict(trace="synthetic", ranks=1, mode=None, calibration=str(ROOT / "hw/calibration/h200.yaml"), steps=4,
                requests=4, history=16384, gpu_slots=16000, local_buffer_slots=30000, row_bytes=656, draft_tokens=3,
                backend="numpy", warmup_steps=1, out="")
    base.update(kw)
    return Namespace(**base)


@pytest.mark.parametrize("ranks,mode", [(1, "dp"), (2, "dp"), (2, "tp"), (4, "tp"), (8, "tp")])
def test_validate_dry_run_keeps_every_entry(ranks, mode):
    """4- and 8-rank TP logic (issue 7) on the CPU: exchanges, new-token writes and peer gathers into local buffers
    keep every entry's bytes equal to its address's encoding."""
    from hw.validate import run

    out = run(_args(ranks=ranks, mode=mode, gpu_slots=16000 if ranks < 4 else 6000))
    assert out["mismatched_steps"] == 0
    assert out["integrity"]["bad"] == 0
    assert out["integrity"]["checked_entries"] > 60_000
    assert out["exchanges"] > 0
    if mode == "tp":
        assert out["peer_fetches"] > 0 and out["integrity"]["checked_buffer_copies"] > 0
    assert all(s["predicted_s"] > 0 for s in out["per_step"])


def test_validate_cli_bad_input_is_one_line(tmp_path, capsys):
    from ulacache_cli.main import main

    rc = main(["hw", "validate", "synthetic", "--backend", "numpy", "--calibration", str(tmp_path / "nope.yaml")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "calibration file not found" in err[0]


def test_committed_results_carry_provenance():
    for path in sorted((ROOT / "hw" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        assert data.get("date") and data.get("command") and data.get("device"), path.name


def test_node_fit_recovers_a_host_cap():
    """Points made by the node model with a known shared cap: the fit finds it and predicts every point."""
    from hw.nodefit import fit_host_caps, predict

    links = {"pcie_h2d_bw_bytes_s": 55e9, "pcie_d2h_bw_bytes_s": 55e9, "pcie_latency_s": 3e-6,
             "nvlink_bw_bytes_s": 390e9, "nvlink_latency_s": 5e-6,
             "h2d_row_efficiency_by_bytes": {656: 0.8, 1152: 0.9}, "d2h_row_efficiency_by_bytes": {656: 0.56,
                                                                                                   1152: 0.62},
             "peer_row_efficiency_by_bytes": {656: 0.8, 1152: 0.86}}
    truth = {**links, "pcie_host_cap_bytes_s": 90e9}
    pts = [{"op": op, "num_gpus": k, "num_rows": n, "row_bytes": rb, "time_s": predict(truth, op, k, n, rb)}
           for op in ("read_only", "swap") for k in (1, 2, 4) for n in (32768, 131072) for rb in (656, 1152)]
    fit = fit_host_caps(links, pts)
    assert fit["caps"]["pcie_host_cap_bytes_s"] == pytest.approx(90e9, rel=0.03)
    assert fit["median_rel_err"] < 0.02 and fit["error"] < fit["error_no_caps"]
    # no sharing in the data: no cap is fitted
    flat = [{**p, "time_s": predict(links, p["op"], p["num_gpus"], p["num_rows"], p["row_bytes"])} for p in pts]
    assert all(v is None for v in fit_host_caps(links, flat)["caps"].values())
