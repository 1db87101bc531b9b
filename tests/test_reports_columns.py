"""`ulacache report` over tables that lack columns: a figure degrades or is skipped with a note, never the whole
report; captions say which throughput figure (steady-state or whole-run) the results hold."""
from __future__ import annotations

import pandas as pd

from ulacache_cli.main import main

ROWS = [("a", "sglang", 1, 100.0, 90.0, 10.0, "steady window", 1), ("b", "sglang", 4, 350.0, 300.0, 11.0,
        "steady window", 4), ("c", "hisparse", 1, 80.0, 70.0, 12.0, "steady window", 1),
        ("d", "hisparse", 4, 250.0, 200.0, 14.0, "whole run", 2)]
COLS = ["point_id", "system", "workload.max_concurrency", "decode_throughput_tok_s", "run_throughput_tok_s",
        "tpot_ms_p50", "tpot_source", "max_admitted_concurrency"]


def _report(tmp_path, capsys, drop=()):
    df = pd.DataFrame(ROWS, columns=COLS).assign(status="ok", error="").drop(columns=list(drop))
    (tmp_path / "s").mkdir()
    df.to_csv(tmp_path / "s" / "results.csv", index=False)
    status = main(["report", str(tmp_path)])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    return (tmp_path / "report" / "index.html").read_text()


def test_no_admitted_column_draws_throughput_without_rings(tmp_path, capsys):
    page = _report(tmp_path, capsys, drop=["max_admitted_concurrency"])
    assert (tmp_path / "report" / "throughput_vs_concurrency.png").is_file()
    assert "admission limits are not marked: these results have no max_admitted_concurrency column" in page
    assert (tmp_path / "report" / "peak_speedups.png").is_file()


def test_captions_name_the_steady_state_figure(tmp_path, capsys):
    page = _report(tmp_path, capsys)
    assert "red rings mark caps" in page
    assert "steady-state decode throughput (decode_throughput_tok_s" in page
    assert "1 of 4 runs had no steady window" in page


def test_results_before_the_steady_metric_say_whole_run(tmp_path, capsys):
    page = _report(tmp_path, capsys, drop=["run_throughput_tok_s", "tpot_source"])
    assert "they predate the steady-state metric (no run_throughput_tok_s)" in page
    assert "not the whole-run average" not in page
