"""One `--set` parser (sim.config.parse_set) for replay, sweep (`--set` and `--grid`), plan (and sensitivity): they
accept the same items with the same typed values and refuse the same items with the same one-line message."""
from __future__ import annotations

import pytest

import sim
from sim.config import format_set, parse_grid_item, parse_set
from sim.studies.sweep import make_points, parse_grid, parse_sets, sim_resolve
from ulacache_cli.main import main

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("bcdefgh", "cdefghi"))

# (item, part of the message); none touches a key that plan sets itself (presets, attention, system, budgets, cap)
BAD = [
    ("oops", "expected dotted.key=value"),
    ("workload..seed=1", "expected dotted.key=value"),
    ("9x=1", "expected dotted.key=value"),
    ("spec.draft_tokens=", "expected dotted.key=value"),
    ("spec.draft_tokens= ", "expected dotted.key=value"),
    ("work-load.seed=1", "expected dotted.key=value"),
    ("workload.bogus=1", "unknown config key 'workload.bogus'"),
    ("bogus=1", "unknown config key 'bogus'"),
    ("spec.draft_tokens=17", "spec.draft_tokens must be in [0, 16]"),
    ("spec.draft_tokens=2.5", "spec.draft_tokens must be an integer"),
    ("workload.seed=-1", "workload.seed must be in [0, 2^32 - 1]"),
    ("workload.num_requests=.nan", "must be an integer, got nan"),
    ("fidelity.request_fraction=0", "request_fraction must be in (0, 1]"),
    ("memory.host_kv_fraction=yes", "must be a number, got True"),
    ("cpu_storage=maybe", "cpu_storage must be true or false"),
    ("policy=fifo", "policy must be one of"),
    ("costs={a: 1, a: 2}", "duplicate key 'a'"),
    ("costs={" + BOMB.replace("\n", ", ") + "}", "alias bomb"),
]


def _err(argv, capsys) -> str:
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith("ulacache: error: ") and err.count("\n") == 1, err
    return err[len("ulacache: error: "):].strip()


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("system: sglang\nworkload:\n  num_requests: 4\n  max_concurrency: 4\n")
    return path


@pytest.mark.parametrize("item,expect", BAD, ids=[b[0][:30] for b in BAD])
def test_replay_sweep_plan_refuse_alike(item, expect, cfg, tmp_path, capsys):
    replay = _err(["replay", str(cfg), "--out", str(tmp_path / "r"), "--quiet", "--set", item], capsys)
    sweep = _err(["sweep", str(cfg), "--grid", "fidelity.step_stride=1", "--set", item, "--out",
                  str(tmp_path / "s")], capsys)
    plan = _err(["plan", "--model", "glm-5.2", "--hardware", "h200", "--slo-tpot-ms", "50", "--config", str(cfg),
                 "--workers", "1", "--set", item, "--out", str(tmp_path / "p")], capsys)
    sensitivity = _err(["sensitivity", str(cfg), "--out", str(tmp_path / "t"), "--set", item], capsys)
    assert expect in replay
    assert replay == sweep == plan == sensitivity
    assert not any((tmp_path / d).exists() for d in ("r", "s", "p", "t"))


@pytest.mark.parametrize("item,expect", [b for b in BAD if "," not in b[0] and "{" not in b[0]],
                         ids=[b[0][:30] for b in BAD if "," not in b[0] and "{" not in b[0]])
def test_grid_values_refused_like_set(item, expect, cfg, tmp_path, capsys):
    """A one-value --grid item is refused with the --set message (the flag named, the point named for values)."""
    replay = _err(["replay", str(cfg), "--out", str(tmp_path / "r"), "--quiet", "--set", item], capsys)
    grid = _err(["sweep", str(cfg), "--grid", item, "--out", str(tmp_path / "s")], capsys)
    if replay.startswith("bad --set"):
        assert grid.startswith(f"bad --grid {item!r}: expected dotted.key=value")
    else:
        assert grid.endswith(replay) and grid.startswith("grid point ")


GOOD = ["spec.draft_tokens=4", "policy=lru", "policy='lru'", "cpu_storage=false", "memory.gpu_reserve_bytes=2.5e9",
        "memory.gpu_reserve_bytes=1e-05", "workload.trace=null", "fidelity.request_fraction=0.5",
        "ulacache.gpu_pool_slots=1000", "workload.seed= 7 ", "costs.launch_s=3e-6"]
PLAN_KEYS = ["model.preset=glm-5.2", "hardware.preset=h200", "hardware.num_gpus=8", "attention=dp", "system=sglang"]


@pytest.mark.parametrize("item", GOOD)
def test_replay_sweep_plan_accept_alike(item, cfg, tmp_path, monkeypatch):
    replay = sim.load_config(cfg, [item])
    assert sim_resolve(cfg, parse_sets([item])) == replay  # sweep --set
    assert make_points(cfg, parse_grid([item]), [])[0].config == replay  # sweep --grid (one value)
    seen = []

    class Stop(Exception):
        pass

    def spy(path, overrides):
        seen.append(sim_resolve(path, overrides))
        raise Stop

    monkeypatch.setattr("sim.studies.sweep.sim_resolve", spy)
    from sim.studies.plan import run_plan

    with pytest.raises(Stop):
        run_plan(model="glm-5.2", hardware="h200", num_gpus=8, slo_tpot_ms=50, systems=["sglang"], attention="dp",
                 out_dir=tmp_path / "p", config=cfg, sets=[item], workers=1)
    assert seen == [sim.load_config(cfg, [item] + PLAN_KEYS)]


@pytest.mark.parametrize("value", ["8", "true", "pb-lru", "1e9", "null", "a: b", "[1", " x", 8, 0.5, 2.5e9, 1e-05, -3e20, float("inf"), True,
                                   None, "", "'q'"])
def test_format_set_reads_back(value):
    """Sweep and plan turn typed grid values back into `key=text`; the text must read back as the same value."""
    assert parse_set(format_set("k", value)) == ("k", value)


def test_grid_item_types_each_value_as_set():
    key, values = parse_grid_item("workload.seed=1, 2,true,pb-lru,'3'")
    assert key == "workload.seed" and values == [1, 2, True, "pb-lru", "3"]
    assert [parse_set(f"k={t}")[1] for t in ("1", "true", "'3'")] == [1, True, "3"]
    with pytest.raises(ValueError, match="grid values are scalars"):
        parse_grid_item("spec.accept_probs=[0.5]")
