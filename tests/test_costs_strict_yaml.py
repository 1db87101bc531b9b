"""The cost model reads its YAML (sim/costs.yaml, an explicit --calibration) with the strict reader: duplicate keys
and alias bombs are refused in one line naming the file, never last-wins or expanded."""
from __future__ import annotations

import pytest

import sim.costs
from sim.costs import CostModel
from ulacache_cli.main import main

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("bcdefgh", "cdefghi"))


@pytest.mark.parametrize("text,expect", [
    ("costs:\n  launch_s: 4.0e-6\n  launch_s: 9.0e-6\n", "duplicate key 'launch_s'"),
    ("provenance:\n" + "".join("  " + line + "\n" for line in BOMB.splitlines()) + "costs: {}\n", "alias bomb"),
])
def test_explicit_calibration_read_strictly(text, expect, tmp_path, capsys):
    path = tmp_path / "cal.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=expect) as info:
        CostModel.load("h200", "glm-5.2", calibration=path)
    assert str(path) in str(info.value)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("system: sglang\nworkload: {num_requests: 2, max_concurrency: 2, max_steps: 2}\n")
    status = main(["replay", str(cfg), "--out", str(tmp_path / "o"), "--quiet", "--calibration", str(path)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("ulacache: error: ") and err.count("\n") == 1 and expect in err, err
    assert not (tmp_path / "o").exists()


def test_a_valid_calibration_still_loads(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text("provenance: {note: test}\ncosts:\n  launch_s: 9.0e-6\n")
    assert CostModel.load("h200", "glm-5.2", calibration=path)["launch_s"] == 9.0e-6


def test_defaults_file_read_strictly(tmp_path, monkeypatch):
    bad = tmp_path / "costs.yaml"
    bad.write_text(sim.costs.DEFAULTS_PATH.read_text() + "launch_s: 1.0\n")  # a second launch_s
    monkeypatch.setattr(sim.costs, "DEFAULTS_PATH", bad)
    with pytest.raises(ValueError, match="duplicate key 'launch_s'"):
        CostModel.load("h200", "glm-5.2", calibration="none")


@pytest.mark.parametrize("reader", ["sim.calibration.read", "hw.validate.load_costs"])
def test_every_calibration_reader_is_strict(reader, tmp_path):
    """The calibration module and the hardware validator read the file themselves too: the same refusal."""
    import importlib

    mod_name, fn_name = reader.rsplit(".", 1)
    read = getattr(importlib.import_module(mod_name), fn_name)
    path = tmp_path / "cal.yaml"
    path.write_text("provenance: {note: a}\nprovenance: {note: b}\ncosts: {launch_s: 4.0e-6}\n")
    with pytest.raises(ValueError, match="duplicate key 'provenance'") as info:
        read(path)
    assert str(path) in str(info.value)
