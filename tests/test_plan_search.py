"""`search_peak` against brute force on synthetic monotone / unimodal throughput curves with an admission ceiling."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.studies.plan import Evaluation, search_peak


def synthetic(peak: int, slope: float, slo_edge: int, ceiling: int, fail_at: int = 0):
    """Throughput rises to `peak` then falls (slope 0 = monotone); TPOT crosses 100 ms just after `slo_edge`;
    caps above `ceiling` admit `ceiling` requests (a plateau)."""
    calls = []

    def evaluate(c: int) -> Evaluation:
        calls.append(c)
        if c == fail_at:
            return Evaluation(c, 0.0, math.inf, 0, ok=False, error="boom")
        n = min(c, ceiling)
        thr = 1000.0 * n if n <= peak else 1000.0 * peak - slope * (n - peak)
        tpot = 50.0 + 50.0 * n / (slo_edge + 0.5)
        return Evaluation(c, thr, tpot, n)

    return evaluate, calls


def brute(evaluate, limit: int, slo: float):
    feasible = [e for e in (evaluate(c) for c in range(1, limit + 1)) if e.feasible(slo)]
    return max(feasible, key=lambda e: (e.throughput_tok_s, -e.concurrency)) if feasible else None


@settings(max_examples=300, deadline=None)
@given(peak=st.integers(1, 300), slope=st.sampled_from([0.0, 1.0, 37.5, 900.0]), edge=st.integers(1, 300),
       ceiling=st.integers(1, 300), limit=st.integers(1, 400))
def test_matches_brute_force(peak, slope, edge, ceiling, limit):
    evaluate, calls = synthetic(peak, slope, edge, ceiling)
    got = search_peak(evaluate, 100.0, limit)
    want = brute(synthetic(peak, slope, edge, ceiling)[0], limit, 100.0)
    assert got.best is not None and want is not None
    assert got.best.throughput_tok_s == want.throughput_tok_s
    assert min(got.best.concurrency, ceiling) == min(want.concurrency, ceiling)
    assert got.best.tpot_ms <= 100.0
    assert len(calls) == len(set(calls))  # memoized: no cap replayed twice
    assert len(calls) <= 4 * math.ceil(math.log2(limit + 1)) + 6  # a search, not a scan


def test_monotone_finds_slo_edge_exactly():
    evaluate, calls = synthetic(peak=10_000, slope=0.0, slo_edge=73, ceiling=10_000)
    got = search_peak(evaluate, 100.0, 1024)
    assert got.best.concurrency == 73 and got.slo_edge == 73 and got.reason == "SLO edge bracketed"
    assert len(calls) <= 16


def test_interior_peak_found_by_golden_section():
    evaluate, _ = synthetic(peak=37, slope=500.0, slo_edge=200, ceiling=10_000)
    got = search_peak(evaluate, 100.0, 1024)
    assert got.best.concurrency == 37 and got.best.throughput_tok_s == 37_000


def test_admission_ceiling_stops_bracket():
    evaluate, calls = synthetic(peak=10_000, slope=0.0, slo_edge=10_000, ceiling=21)
    got = search_peak(evaluate, 100.0, 4096)
    assert got.ceiling == 21 and got.best.admitted == 21 and max(calls) == 32


def test_infeasible_at_one_and_failures():
    evaluate, _ = synthetic(peak=5, slope=0.0, slo_edge=0, ceiling=100)
    got = search_peak(evaluate, 100.0, 64)
    assert got.best is None and got.reason == "SLO missed at concurrency 1"
    evaluate, _ = synthetic(peak=5, slope=0.0, slo_edge=50, ceiling=100, fail_at=1)
    assert "boom" in search_peak(evaluate, 100.0, 64).reason
    # a failed replay inside the range counts as infeasible, the search still answers
    evaluate, _ = synthetic(peak=500, slope=0.0, slo_edge=50, ceiling=100, fail_at=32)
    got = search_peak(evaluate, 100.0, 64)
    assert got.best is not None and got.best.concurrency < 32


def test_rel_tol_trades_replays_for_precision():
    exact_eval, exact_calls = synthetic(peak=10_000, slope=0.0, slo_edge=700, ceiling=10_000)
    loose_eval, loose_calls = synthetic(peak=10_000, slope=0.0, slo_edge=700, ceiling=10_000)
    exact = search_peak(exact_eval, 100.0, 4096)
    loose = search_peak(loose_eval, 100.0, 4096, rel_tol=0.05)
    assert exact.best.concurrency == 700
    assert 700 * 0.94 <= loose.best.concurrency <= 700 and len(loose_calls) < len(exact_calls)


def test_search_limit_without_num_requests(tmp_path, monkeypatch):
    """A base config without workload.num_requests (each cap then draws 2 x cap requests) searches up to its
    max_concurrency; with num_requests given, up to that."""
    import sim.studies.plan as plan

    seen = []

    def fake(job):
        seen.append(job["limit"])
        return {"best": None, "slo_edge": None, "ceiling": None, "reason": "test", "search_limit": job["limit"],
                "num_replays": 0, "search_wall_s": 0.0, "evaluations": []}

    monkeypatch.setattr(plan, "_search_system", fake)
    monkeypatch.setattr(plan, "plot_plan", lambda p, path: None)
    base = tmp_path / "base.yaml"
    base.write_text("system: ulacache\nworkload: {max_concurrency: 48}\n")
    kw = dict(model="glm-5", hardware="h200", num_gpus=8, slo_tpot_ms=50.0, systems=["sglang"], attention="tp")
    plan.run_plan(out_dir=tmp_path / "a", config=base, **kw)
    plan.run_plan(out_dir=tmp_path / "b", config=base, sets=["workload.num_requests=12"], **kw)
    assert seen == [48, 12]


def test_buffer_fractions_search_ulacache_splits(tmp_path, monkeypatch):
    """--buffer-fractions adds one UlaCache search per local-buffer share (TP only) and names the best split."""
    import pytest

    import sim.studies.plan as plan

    def fake(job):
        frac = next((float(o.split("=")[1]) for o in job["overrides"] if "local_buffer_fraction" in o), None)
        thr = {None: 100.0, 0.1: 150.0, 0.3: 120.0}[frac]
        best = {"concurrency": 8, "throughput_tok_s": thr, "tpot_ms": 10.0, "admitted": 8, "ok": True, "error": ""}
        return {"best": best, "slo_edge": 8, "ceiling": None, "reason": "test", "search_limit": job["limit"],
                "num_replays": 1, "search_wall_s": 0.0, "evaluations": [best]}

    monkeypatch.setattr(plan, "_search_system", fake)
    monkeypatch.setattr(plan, "plot_plan", lambda p, path: None)
    kw = dict(model="glm-5", hardware="h200", num_gpus=8, slo_tpot_ms=50.0, systems=["ulacache"])
    out = plan.run_plan(out_dir=tmp_path / "a", attention="tp", buffer_fractions=[0.1, 0.3], **kw)
    assert list(out["systems"]) == ["ulacache", "ulacache@buffer=0.1", "ulacache@buffer=0.3"]
    assert out["split_choice"] == "ulacache@buffer=0.1"
    with pytest.raises(ValueError, match="only under TP"):
        plan.run_plan(out_dir=tmp_path / "b", attention="dp", buffer_fractions=[0.1], **kw)


def test_caps_without_a_steady_window_are_named():
    """The demo's 541 -> 740 tok/s jump between caps 22 and 23 at the same admission (20): at requests-per-cap 1
    cap 22 had no steady window (whole-run figure) and cap 23 one of 2 steps; plan names such caps."""
    from sim.studies.plan import _evaluation, unsteady_caps

    evals = [_evaluation(c, {"decode_throughput_tok_s": t, "tpot_ms_p50": 20.0, "max_admitted_concurrency": 20,
                             "steady_window_steps": w}, "tpot_ms_p50")
             for c, t, w in ((16, 495.0, 0), (22, 541.0, 0), (23, 736.0, 2), (32, 756.0, 61))]
    entry = {"evaluations": [e.__dict__ for e in evals]}
    assert unsteady_caps(entry) == [16, 22, 23]
    assert evals[0].steady_window_steps == 0 and _evaluation(1, {"tpot_ms_p50": 1.0}, "tpot_ms_p50").ok
