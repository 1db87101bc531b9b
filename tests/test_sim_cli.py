"""`ulacache replay` through the front door: a good run, and bad configs -> one line on stderr, exit 2."""
import json

import pytest
import yaml

from ulacache_cli.main import main

TINY = {
    "system": "sglang", "attention": "dp", "hardware": {"num_gpus": 2}, "model": {"weight_bytes": 100e9},
    "workload": {"profile": "small", "num_requests": 2, "max_steps": 5},
}


def _write(tmp_path, data, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_replay_writes_metrics(tmp_path, capsys):
    cfg = _write(tmp_path, TINY)
    rc = main(["replay", str(cfg), "--out", str(tmp_path / "o"), "--set", "system=ulacache", "--quiet",
               "--trace-events", str(tmp_path / "t.json")])
    assert rc == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert m["system"] == "ulacache" and m["decode_steps"] == 5
    assert (tmp_path / "o" / "config.yaml").exists() and (tmp_path / "t.json").exists()


@pytest.mark.parametrize("sets, needle", [
    (["nonsense=1"], "unknown config key 'nonsense'"),
    (["workload.bogus=1"], "unknown config key 'workload.bogus'"),
    (["workload.num_requests=many"], "workload.num_requests must be an integer"),
    (["cpu_storage=maybe"], "cpu_storage must be true or false"),
    (["system=vllm"], "system must be one of"),
    (["hardware.preset=a100"], "unknown hardware.preset"),
    (["hardware.hbm_bytes=50e9"], "cannot hold the weights"),
    (["model.weight_bytes=2e12"], "cannot hold the weights"),
    (["costs.no_such=1"], "unknown cost key"),
    (["spec.draft_tokens=4", "spec.accept_mean=9"], "spec.accept_mean must be in"),
])
def test_bad_configs_exit_2_with_one_line(tmp_path, refused_replay, sets, needle):
    err = refused_replay(_write(tmp_path, TINY), tmp_path / "o", sets)
    assert needle in err, err


def test_unknown_key_in_file_and_missing_file(tmp_path, capsys):
    cfg = _write(tmp_path, {**TINY, "colour": "blue"})
    assert main(["replay", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "unknown config key 'colour'" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "none.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_bad_calibration_file(tmp_path, capsys):
    cfg = _write(tmp_path, TINY)
    cal = _write(tmp_path, {"provenance": {}, "costs": {"warp_speed": 9}}, "cal.yaml")
    assert main(["replay", str(cfg), "--out", str(tmp_path / "o"), "--calibration", str(cal)]) == 2
    assert "unknown cost key 'warp_speed'" in capsys.readouterr().err


def test_trace_not_matching_the_model(tmp_path, capsys):
    import traces

    trace = traces.generate_trace(tmp_path / "tr", profile="small", num_requests=2, seed=0, model="glm-5")
    cfg = _write(tmp_path, {**TINY, "model": {"preset": "glm-5.2", "weight_bytes": 100e9}})
    assert main(["replay", str(cfg), "--out", str(tmp_path / "o"), "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "78 indexer groups" in err and "needs 21" in err
    cfg = _write(tmp_path, {**TINY, "model": {"preset": "glm-5", "weight_bytes": 100e9}})
    assert main(["replay", str(cfg), "--out", str(tmp_path / "o2"), "--trace", str(trace), "--quiet"]) == 0
