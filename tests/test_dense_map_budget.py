"""`--dense-map-gb` (sim.replay's `dense_map_gb`, CacheConfig.dense_map_bytes): the TP address maps stay dense past the
library's rule, and the replay simulates exactly the same run."""
import pytest
from replay_cases import FULL, RUN_ONLY, SMALL_TP

import sim
import ulacache.slot_map as slot_map

CFG = SMALL_TP


def _maps_built(monkeypatch) -> list[str]:
    """The kinds of map each TP buffer starts with, recorded as the replay builds them."""
    made, real = [], slot_map.make_slot_maps

    def spy(*args, **kw):
        maps = real(*args, **kw)
        made.append(type(maps).__name__)
        return maps
    monkeypatch.setattr(slot_map, "make_slot_maps", spy)
    return made


@pytest.mark.parametrize("sets", [FULL + ["fidelity.only_group=1"], []], ids=["one-group", "default-fidelity"])
def test_a_dense_budget_changes_the_maps_not_the_run(monkeypatch, sets):
    monkeypatch.setattr(slot_map, "DENSE_LIMIT_BYTES", 0)  # the library's rule: hash maps for every buffer
    made = _maps_built(monkeypatch)
    rule = sim.replay(CFG, overrides=sets)
    assert set(made) == {"HashSlotMaps"}
    made.clear()
    dense = sim.replay(CFG, overrides=sets, dense_map_gb=1.0)
    assert set(made) == {"DenseSlotMaps"}
    assert 0.0 < rule["gpu_hit_rate"] < 1.0  # under pressure: evictions and exchanges happen in the maps
    assert {k: v for k, v in rule.items() if k not in RUN_ONLY} == {k: v for k, v in dense.items() if k not in RUN_ONLY}


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), 1e4, True, "8"])
def test_a_bad_budget_is_one_line(bad):
    with pytest.raises(ValueError, match="--dense-map-gb must be a number > 0 and <= 1000"):
        sim.replay(CFG, dense_map_gb=bad)
