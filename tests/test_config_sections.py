"""Typed config sections: one frozen dataclass per SCHEMA section, generated from SCHEMA (fields, defaults), read by
attribute; item access stays for callers not yet migrated (see sim.config._Section)."""
from __future__ import annotations

import dataclasses

import pytest

from sim.config import SCHEMA, SECTIONS, build, resolve


def test_one_frozen_dataclass_per_schema_section_with_its_defaults():
    assert set(SECTIONS) == {k for k, v in SCHEMA.items() if isinstance(v, dict)}
    for name, cls in SECTIONS.items():
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
        assert fields == {k: rule[0] for k, rule in SCHEMA[name].items()}, name
        assert cls.__name__.endswith("Config")


def test_sections_read_by_attribute_only_and_stay_frozen():
    cfg = build(resolve({"spec": {"draft_tokens": 4, "accept_probs": [0.1, 0.2, 0.3, 0.4]},
                         "workload": {"seed": 5, "num_requests": 32}}))
    for name in SECTIONS:
        section = getattr(cfg, name)
        assert isinstance(section, SECTIONS[name])
        assert list(section.as_dict()) == list(SCHEMA[name])
        with pytest.raises(TypeError):  # no item access: one way to read a section
            section[next(iter(SCHEMA[name]))]
    assert cfg.workload.seed == 5 and cfg.spec.draft_tokens == 4
    assert cfg.spec.accept_probs == (0.1, 0.2, 0.3, 0.4)  # a list in YAML, immutable here
    assert cfg.fidelity.request_fraction == 0.5  # the auto value (1/k, k = 32 // 16) is resolved, not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.workload.seed = 6
    with pytest.raises(AttributeError):
        cfg.workload.bogus
    assert cfg.memory.as_dict() == cfg.raw["memory"] and cfg.memory.host_kv_fraction == 0.75


def test_num_requests_defaults_to_two_per_slot_of_the_cap():
    """Without workload.num_requests a run draws 2 x max_concurrency requests (one refill per slot: a steady window),
    and the fidelity auto-stride follows the resolved count."""
    from sim.config import MAX_REQUESTS, default_num_requests

    cfg = build(resolve({"workload": {"max_concurrency": 24}}))
    assert cfg.workload.num_requests == 48 and cfg.raw["workload"]["num_requests"] is None
    assert cfg.fidelity.request_fraction == 1 / 3  # k = 48 // 16
    assert build(resolve({"workload": {"max_concurrency": 24, "num_requests": 7}})).workload.num_requests == 7
    assert default_num_requests(MAX_REQUESTS) == MAX_REQUESTS  # clamped to the request limit


def test_ulacache_split_keys():
    cfg = build(resolve({"ulacache": {"local_buffer_fraction": 0.25}}))
    assert cfg.ulacache.local_buffer_fraction == 0.25
    for bad in (1.0, -0.1):
        with pytest.raises(ValueError, match="local_buffer_fraction must be in"):
            resolve({"ulacache": {"local_buffer_fraction": bad}})
    with pytest.raises(ValueError, match="unknown config key 'ulacache.ws_reserve_slots'"):
        resolve({"ulacache": {"ws_reserve_slots": 2048}})  # no per-request working-set reserve any more
