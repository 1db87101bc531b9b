"""The node model's gather-after-exchange term on CPU: its fit from calibration points, its derivation from a TP
run's gather timings, its use by the shared predictor (`hw validate` live and `--from-json`) and by the simulator's
node, and the offline re-prediction of stored validation runs. One GPU test runs the calibration measurement."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CAL = ROOT / "hw" / "calibration" / "h200.yaml"
KEY = "peer_after_exchange_latency_s"


def _points(lat_per_home: float, noise: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    pts = []
    for k in (2, 3, 4):
        for n in (4096, 16384, 65536):
            for ex in (16384, 65536):
                warm = 5e-6 + n * 656 / 300e9
                after = (warm + lat_per_home * (k - 1)) * (1 + noise * rng.standard_normal())
                pts.append({"num_gpus": k, "num_rows": n, "exchange_rows": ex, "row_bytes": 656, "warm_s": warm,
                            "after_s": after, "wait_s": 1e-5})
    return pts


def test_fit_recovers_a_per_home_latency():
    from hw.nodefit import fit_peer_after_exchange

    fit = fit_peer_after_exchange(_points(90e-6))
    assert fit[KEY] == pytest.approx(90e-6, rel=1e-9)
    assert set(fit["by_num_gpus"]) == {2, 3, 4}
    assert all(v == pytest.approx(90e-6) for v in fit["by_num_gpus"].values())  # per home: flat in k
    assert fit["median_rel_err"] < 1e-9
    noisy = fit_peer_after_exchange(_points(90e-6, noise=0.02))
    assert noisy[KEY] == pytest.approx(90e-6, rel=0.25) and noisy["median_rel_err"] < 0.05
    # no extra in the data (gathers after an exchange as fast as warm ones): latency 0
    assert fit_peer_after_exchange(_points(0.0))[KEY] == 0.0
    with pytest.raises(ValueError):
        fit_peer_after_exchange([])


def test_derive_takes_the_measurement_into_the_node_calibration_only():
    """`derive` on raw data with gather-after-exchange points writes the key into the node calibration; raw data
    without them (the committed 2-GPU run) leaves it out and says so in the provenance."""
    from hw.calibrate import derive

    raw = json.loads((ROOT / "hw" / "results" / "calibration.json").read_text())
    node, single = derive(json.loads(json.dumps(raw)))
    assert KEY not in node["costs"] and KEY not in single["costs"]
    assert "NOT MEASURED" in node["provenance"]["links"]
    raw["node"]["gather_after_exchange"] = _points(80e-6)
    node, single = derive(raw)
    assert node["costs"][KEY] == pytest.approx(80e-6)
    assert KEY not in single["costs"]
    assert "+80.0 us per home rank" in node["provenance"]["links"]


def test_predictor_adds_the_term_per_home_after_an_exchange_only():
    from hw.validate import load_costs, predict_parts

    base, _ = load_costs(CAL)
    more, _ = load_costs(CAL, {KEY: 1e-4})

    class Plan:
        num_refs, num_unique, num_misses = 524288, 190000, 70000
        h2d_rows_per_rank, d2h_rows_per_rank = [35000] * 4, [35000] * 4
        peer_rows_per_rank = [44000] * 4

    for ranks in (2, 4):
        p0, p1 = predict_parts(base, Plan, 656, ranks), predict_parts(more, Plan, 656, ranks)
        assert p1["peer_s"] - p0["peer_s"] == pytest.approx(1e-4 * (ranks - 1))
        assert p1["exchange_s"] == p0["exchange_s"] and p1["management_s"] == p0["management_s"]
    Plan.h2d_rows_per_rank = Plan.d2h_rows_per_rank = [0, 0]  # no exchange: the gathers are warm
    assert predict_parts(more, Plan, 656, 2)["peer_s"] == predict_parts(base, Plan, 656, 2)["peer_s"]


def test_simulator_node_chains_the_term_on_fetches_after_promotion():
    """The simpy step: a TP rank's peer fetch of rows promoted this step waits for the promotion, then pays the
    term per home (num_gpus - 1); fetches of resident rows do not."""
    import simpy

    from sim.costs import CostModel
    from sim.hardware import Node
    from sim.timing import GroupWork, StepTimer

    def stall(costs, after_bytes, peer_bytes):
        env = simpy.Environment()
        timer = StepTimer(env, Node(env, 4, costs))
        w = GroupWork(layers=1, indexer_s=0.0, allgather_s=0.0, mgmt_s=0.0, h2d_bytes=1e6, d2h_bytes=0.0,
                      peer_bytes=peer_bytes, attention_s=1e-5, ffn_s=0.0, collective_s=0.0, prefetch=True,
                      d2h_blocking=False, peer_after_h2d_bytes=after_bytes)
        return timer.run([[w]] * 4, [0, 1, 2, 3], {})[1]["transfer_stall_s"]

    base = CostModel.load("h200", "glm-5", calibration=CAL)
    more = CostModel.load("h200", "glm-5", calibration=CAL, overrides={KEY: 1e-4})
    assert stall(more, 1e6, 0.0) - stall(base, 1e6, 0.0) == pytest.approx(3 * 1e-4, rel=1e-6)  # 3 homes
    assert stall(more, 0.0, 1e6) == pytest.approx(stall(base, 0.0, 1e6))


def _run(ranks: int, steps: int = 6):
    """A stored-validation-shaped run whose measured times are the committed model's prediction x 1.25."""
    from hw.repredict import _Plan
    from hw.validate import load_costs, predict_s

    costs, node = load_costs(CAL)
    per_step = []
    for i in range(steps):
        s = {"step": i, "num_refs": 524288, "num_unique": 190000 + i, "num_misses": 70000 + i, "warmup": i == 0,
             "rows_per_rank": {"h2d": [35000 + i] * ranks, "d2h": [35000] * ranks,
                               "peer": [44000] * ranks if ranks > 1 else [0]}}
        s["predicted_s"] = predict_s(costs, _Plan(s), 656, ranks, node)
        s["measured_s"] = s["predicted_s"] * 1.25
        s["rel_err"] = (s["predicted_s"] - s["measured_s"]) / s["measured_s"]
        s["parts_s"] = {"gather_r0": costs.peer_s(44000, 656) + 9e-5, "peer_r0": costs.peer_s(44000, 656) + 1e-4,
                        "gather_r1": costs.peer_s(44000, 656) + 9e-5, "peer_r1": costs.peer_s(44000, 656) + 1e-4}
        per_step.append(s)
    return {"date": "d", "command": "c", "device": {"gpu": "test"}, "ranks": ranks, "mode": "tp", "row_bytes": 656,
            "per_step": per_step}


def test_repredict_reproduces_a_run_and_scores_an_override():
    from hw.repredict import repredict
    from hw.validate import load_costs

    run = _run(2)
    res = repredict(run, *load_costs(CAL))
    assert res["after"]["steps"] == 5  # the warm-up step is left out
    assert res["after"]["median_abs"] == pytest.approx(0.2) and res["before"]["median_abs"] == pytest.approx(0.2)
    more = repredict(run, *load_costs(CAL, {KEY: 1e-4}))
    assert more["predicted_s_median"] - res["predicted_s_median"] == pytest.approx(1e-4)
    assert more["after"]["median_abs"] < res["after"]["median_abs"]


def test_after_exchange_from_parts():
    from hw.nodefit import after_exchange_from_parts
    from hw.validate import load_costs

    d = after_exchange_from_parts(_run(2), load_costs(CAL)[0])
    assert d[KEY] == pytest.approx(9e-5) and d["wait_median_s"] == pytest.approx(1e-5) and d["samples"] == 10
    with pytest.raises(ValueError):
        after_exchange_from_parts(_run(1) | {"per_step": []}, load_costs(CAL)[0])


def test_from_json_cli_on_a_committed_run(tmp_path, capsys):
    """The committed TP-2 validation re-predicted with its committed calibration reproduces its stored predictions;
    with the term overridden every step's prediction grows by it."""
    from ulacache_cli.main import main

    run = ROOT / "hw" / "results" / "validate_tp2.json"
    out = tmp_path / "re.json"
    assert main(["hw", "validate", "--from-json", str(run), "--calibration", str(CAL), "--out", str(out)]) == 0
    res = json.loads(out.read_text())["runs"][str(run)]
    assert all(s["predicted_s"] == pytest.approx(s["predicted_s_stored"], rel=1e-9) for s in res["per_step"])
    out2 = tmp_path / "re2.json"
    assert main(["hw", "validate", "--from-json", str(run), "--calibration", str(CAL), "--cost", f"{KEY}=5e-5",
                 "--out", str(out2)]) == 0
    data = json.loads(out2.read_text())
    assert data["cost_overrides"] == {KEY: 5e-5} and data["device"]
    assert all(s["predicted_s"] - s["predicted_s_stored"] == pytest.approx(5e-5, rel=1e-6)
               for s in data["runs"][str(run)]["per_step"])


@pytest.mark.parametrize("argv,msg", [
    (["synthetic", "--from-json", "x.json"], "not both"),
    (["--from-json", "hw/results/calibration.json"], "no per_step"),
    (["--from-json", "pyproject.toml"], "not a readable"),
    (["--from-json", "hw/results/validate_tp2.json", "--cost", "nope"], "KEY=NUMBER"),
    (["--from-json", "hw/results/validate_tp2.json", "--cost", "no_such_key=1"], "unknown cost key"),
    (["synthetic", "--cost", f"{KEY}=1"], "only for --from-json"),
    ([], "required"),
    (["--from-json", "hw/results/validate_tp2.json", "--out", "hw/results/validate_tp2.json"], "overwritten"),
])
def test_from_json_bad_input_is_one_line(argv, msg, capsys, monkeypatch):
    from ulacache_cli.main import main

    monkeypatch.chdir(ROOT)
    rc = main(["hw", "validate", *argv] + ([] if "--out" in argv else ["--out", ""]))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and msg in err[0], err


@pytest.mark.gpu
def test_gather_after_exchange_measurement_runs():
    cp = pytest.importorskip("cupy")
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs 2 GPUs")
    from hw.copybench import bench_gather_after_exchange

    pts = bench_gather_after_exchange(656, [1024, 4096], gpus=[0, 1], exchange_sizes=[4096], host_rows=50_000,
                                      gpu_rows=20_000, repeat=3)
    assert len(pts) == 2 and all(p["after_s"] > 0 and p["warm_s"] > 0 and p["num_gpus"] == 2 for p in pts)


class _FakeCp:
    """Just enough of cupy, on numpy, to run the measurement's control flow on CPU (timing events count calls)."""

    uint8, int64 = np.uint8, np.int64

    def __init__(self):
        self.clock = [0.0]
        fake = self

        class Ctx:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def synchronize(self):
                pass

        class Event:
            def __init__(self):
                fake.clock[0] += 1.0
                self.t = fake.clock[0]

        class Stream(Ctx):
            def __init__(self, non_blocking=False):
                pass

            def record(self):
                return Event()

            def wait_event(self, ev):
                assert isinstance(ev, Event)

        class Device(Ctx):
            def __init__(self, g):
                self.g = g

        class Cuda:
            pass

        self.cuda = Cuda()
        self.cuda.Device, self.cuda.Stream = Device, Stream
        self.cuda.get_elapsed_time = lambda a, b: (b.t - a.t) * 1e-3

    full, zeros, ones, asarray = staticmethod(np.full), staticmethod(np.zeros), staticmethod(np.ones), \
        staticmethod(np.asarray)


def test_gather_after_exchange_measurement_control_flow_on_cpu(monkeypatch):
    """The GPU measurement's bookkeeping without a GPU: the first gathers read exactly the rows each peer promoted
    in that repeat, one gather per peer, an even split; points for every k and size that fits."""
    import hw.copybench as cb
    import ulacache.backends.cupy_copy as cc
    import ulacache.backends.cupy_pipeline as pipe

    calls = []

    class HostPool:
        def __init__(self, n, rb):
            self.array = np.zeros((n, rb), np.uint8)

    def exchange_rows(gpu, host, gi, hi, vic, rb, **kw):
        calls.append(("ex", id(gpu), np.array(gi)))
        old = gpu[gi].copy()
        gpu[gi] = host.array[hi]
        host.array[hi[vic.astype(bool)]] = old[vic.astype(bool)]

    def gather_rows(dst, src, di, si, rb, **kw):
        calls.append(("gather", id(src), np.array(si)))
        dst[di] = src[si]

    monkeypatch.setattr(cb, "cupy", lambda: _FakeCp())
    monkeypatch.setattr(cb, "enable_peer_access", lambda n: None)
    monkeypatch.setattr(cc, "HostPool", HostPool)
    monkeypatch.setattr(cc, "exchange_rows", exchange_rows)
    monkeypatch.setattr(cc, "gather_rows", gather_rows)
    monkeypatch.setattr(pipe, "spin", lambda ns: None)
    pts = cb.bench_gather_after_exchange(32, [60, 300], gpus=[0, 1, 2], exchange_sizes=[64, 128], host_rows=1000,
                                         gpu_rows=500, repeat=3)
    # 300 rows need 300 (k = 2) or 150 (k = 3) rows per peer: more than either exchange promoted, so skipped
    got = sorted((p["exchange_rows"], p["num_gpus"], p["num_rows"]) for p in pts)
    assert got == [(64, 2, 60), (64, 3, 60), (128, 2, 60), (128, 3, 60)]
    assert all(p["after_s"] > 0 and p["warm_s"] > 0 and p["wait_s"] > 0 for p in pts)
    # in every repeat: each GPU's first gathers (one per peer) read the first rows that peer's exchange promoted
    i = 0
    while i < len(calls):
        j = i
        exchanged = {}
        while j < len(calls) and calls[j][0] == "ex":
            exchanged[calls[j][1]] = calls[j][2]
            j += 1
        k = len(exchanged)
        gathers = calls[j:j + k * 2 * (k - 1)]
        assert k >= 2 and all(c[0] == "gather" for c in gathers)
        for g in range(k):
            mine = gathers[g * 2 * (k - 1):(g + 1) * 2 * (k - 1)]
            after = mine[:k - 1]
            for src, si in ((c[1], c[2]) for c in after):
                assert src in exchanged and np.array_equal(si, exchanged[src][:si.size])
            assert sum(c[2].size for c in after) == sum(c[2].size for c in mine[k - 1:])  # warm: same count
        i = j + len(gathers)


def test_two_gpu_fit_reproduces_on_the_topology():
    """The committed 2-GPU calibration, re-fitted on the measured host's topology (one socket), gives the committed
    host cap bit for bit, within the committed fit error; the data place that shared cap above the switch level
    (both GPUs read more than one Gen5 x16 uplink carries); and the h200 preset's topology (4 GPUs a socket) predicts
    every 2-GPU point exactly as the measured host does (hw validate's predictions are unchanged)."""
    import yaml

    from hw.calibrate import derive
    from hw.nodefit import MEASURED_HOST, predict
    from sim.costs import CostModel
    from sim.hardware import concurrent_exchange_s, topology_of

    raw = json.loads((ROOT / "hw" / "results" / "calibration.json").read_text())
    node, _ = derive(raw)
    committed = yaml.safe_load(CAL.read_text())["costs"]
    assert node["costs"]["pcie_host_cap_bytes_s"] == committed["pcie_host_cap_bytes_s"]
    fit = raw["node_fit"]
    assert fit["median_rel_err"] < 0.06 and fit["max_rel_err"] < 0.1
    assert fit["shared_level"]["level"] == "socket"
    assert fit["shared_level"]["max_read_payload_bytes_s"] > fit["shared_level"]["uplink_raw_bytes_s"]
    cm = CostModel.load("h200", "glm-5")
    assert topology_of(cm).socket_of(1) == 0 and MEASURED_HOST.num_sockets == 1
    for p in fit["points"]:
        mine = concurrent_exchange_s(cm, p["row_bytes"], [p["num_rows"]] * p["num_gpus"],
                                     [p["num_rows"] if p["op"] == "swap" else 0] * p["num_gpus"])[0]
        assert mine == pytest.approx(predict(cm.values, p["op"], p["num_gpus"], p["num_rows"], p["row_bytes"]),
                                     rel=1e-12)
        assert mine == pytest.approx(p["predicted_s"], rel=1e-12)
