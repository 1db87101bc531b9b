"""bench/full_fidelity_by_group.py and fidelity.only_group: every group's replay alone, weighted by its layers, gives
the full-fidelity replay's hit rate (the groups are independent caches fed the same decode batches)."""
import argparse

import pytest
import yaml

import sim

CFG = {"system": "ulacache", "attention": "tp", "hardware": {"preset": "h200", "num_gpus": 8}, "policy": "pb-lru",
       "cpu_storage": True, "model": {"preset": "glm-5", "num_index_groups": 4},
       "ulacache": {"gpu_pool_slots": 20000},
       "workload": {"num_requests": 4, "max_concurrency": 4, "seed": 3, "max_steps": 25}}


@pytest.fixture(scope="module")
def byg(bench_module):
    return bench_module("full_fidelity_by_group")


def test_the_groups_alone_give_the_full_runs_hit_rate_and_a_rerun_resumes(byg, tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    out = tmp_path / "r.json"
    args = argparse.Namespace(config=cfg, sets=[], groups=None, processes=2, check_full=True, out=out)
    got = byg.run(args)
    layers = got["layers"]
    assert len(layers) == 4 and len(set(layers)) > 1  # (unequal weights: the weighting is tested)
    rates = [got["groups"][str(g)]["gpu_hit_rate"] for g in range(4)]
    assert len(set(rates)) == 4 and max(rates) < 1.0  # groups that differ, under pressure
    comb, full = got["combined"], got["full_run"]
    assert comb["same_batches"] and comb["groups"] == comb["of_groups"] == 4
    assert comb["gpu_hit_rate"] == pytest.approx(full["gpu_hit_rate"], rel=1e-12)
    assert comb["decode_tokens"] == full["decode_tokens"]
    assert comb["gpu_hit_rate"] != pytest.approx(sum(rates) / 4, rel=1e-9)  # not an unweighted mean
    capsys.readouterr()
    args.check_full = False
    again = byg.run(args)  # every group kept in --out: none replayed
    assert "group " not in capsys.readouterr().out
    assert again["combined"] == comb


def test_only_group_is_checked_and_runs_one_group(tmp_path):
    with pytest.raises(ValueError, match="fidelity.only_group"):
        sim.replay({**CFG, "fidelity": {"only_group": 4}})
    m = sim.replay({**CFG, "fidelity": {"only_group": 1, "policy_groups": 0, "request_fraction": 1.0}})
    assert m["policy_groups_simulated"] == 1
