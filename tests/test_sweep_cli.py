"""Bad input to `ulacache sweep` / `plan` / `report` -> one line on stderr, exit status 2."""
from __future__ import annotations

import pytest

from ulacache_cli.main import main


def run(argv, capsys):
    status = main(argv)
    err = capsys.readouterr().err
    return status, err


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("system: sglang\n")
    return path


CASES = [
    (["sweep", "{cfg}", "--grid", "system", "--out", "{tmp}/s"], "bad --grid 'system'"),
    (["sweep", "{cfg}", "--grid", "system=a,,b", "--out", "{tmp}/s"], "empty value"),
    (["sweep", "{cfg}", "--grid", "a=1", "--grid", "a=2", "--out", "{tmp}/s"], "given twice"),
    (["sweep", "{tmp}/missing.yaml", "--grid", "system=sglang", "--out", "{tmp}/s"], "config file not found"),
    (["sweep", "{cfg}", "--out", "{tmp}/s"], "no --grid given"),
    (["sweep", "{cfg}", "--grid", "system=sglang", "--out", "{tmp}/s", "--resume"], "no sweep to resume"),
    (["sweep", "{cfg}", "--grid", "system=sglang", "--set", "oops", "--out", "{tmp}/s"], "bad --set"),
    (["sweep", "{cfg}", "--grid", "system=sglang", "--workers", "0", "--out", "{tmp}/s"], "--workers must be"),
    (["sweep", "{cfg}", "--grid", "system=sglang", "--out", "{tmp}"], "sweep dir exists and is not empty"),
    (["report", "{tmp}/nowhere"], "result dir not found"),
    (["report", "{tmp}/empty"], "no result files found"),
    (["plan", "--model", "glm-5.2", "--hardware", "h200", "--slo-tpot-ms", "-1", "--out", "{tmp}/p"],
     "--slo-tpot-ms must be > 0"),
    (["plan", "--model", "glm-5.2", "--hardware", "h200", "--slo-tpot-ms", "50", "--gpu-kv-gb", "0",
      "--out", "{tmp}/p"], "--gpu-kv-gb must be > 0"),
    (["plan", "--model", "glm-5.2", "--hardware", "h200", "--slo-tpot-ms", "50", "--systems", ",",
      "--out", "{tmp}/p"], "--systems is empty"),
    (["plan", "--model", "glm-5.2", "--hardware", "h200", "--slo-tpot-ms", "50", "--config",
      "{tmp}/missing.yaml", "--out", "{tmp}/p"], "config file not found"),
]


@pytest.mark.parametrize("argv,expect", CASES)
def test_bad_input_one_line_exit_2(argv, expect, cfg, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    argv = [a.format(cfg=cfg, tmp=tmp_path) for a in argv]
    status, err = run(argv, capsys)
    assert status == 2, err
    assert err.startswith("ulacache: error: ") and err.count("\n") == 1, err
    assert expect in err
