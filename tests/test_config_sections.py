"""Typed config sections: one literal frozen dataclass per section, every key a field with its help and unit; each
system's own section declared beside its System and registered under its name; the loader's keys, kinds, defaults
and choices read from the fields (sim.config.schema / default_tree)."""
from __future__ import annotations

import dataclasses

import pytest

from sim.config import SECTIONS, SimConfig, build, default_tree, resolve, schema, section_names
from sim.sections import Section, kind_of, register_section
from sim.systems import SYSTEMS


def test_every_key_is_a_field_with_help_and_its_default_is_the_loaders():
    tree = default_tree()
    assert set(section_names()) == set(SECTIONS)
    for name in section_names():
        cls = SECTIONS[name]
        assert cls.__name__.endswith("Config") and issubclass(cls, Section)
        assert cls.__dataclass_params__.frozen
        for f in dataclasses.fields(cls):
            assert f.metadata["help"], f"{name}.{f.name} has no help"
            assert tree[name][f.name] == f.default, f"{name}.{f.name}"
        assert set(schema()[name]) == {f.name for f in dataclasses.fields(cls)}
    for top in ("system", "attention", "policy", "cpu_storage"):
        f = {f.name: f for f in dataclasses.fields(SimConfig)}[top]
        assert f.metadata["help"] and tree[top] == f.default
    assert schema()["system"] == ("str", tuple(SYSTEMS))  # the choices are the systems' registry


def test_each_system_registers_its_own_section():
    for name, system in SYSTEMS.items():
        if system.config_section is not None:
            assert SECTIONS[name] is system.config_section
    assert {"hisparse", "ulacache"} <= set(SECTIONS)
    assert "hisparse" not in {f.name for f in dataclasses.fields(SimConfig)}  # not listed by the config module
    with pytest.raises(ValueError, match="registered twice"):
        register_section("hisparse", SECTIONS["ulacache"])
    with pytest.raises(TypeError, match="not a Section dataclass"):
        register_section("bogus", dict)


def test_kinds_come_from_the_annotations():
    assert [kind_of(t) for t in (int, float, bool, str, int | None, float | None, str | None,
                                 tuple[float, ...] | None)] == \
        ["int", "float", "bool", "str", "opt_int", "opt_float", "opt_str", "list_float"]
    with pytest.raises(TypeError):
        kind_of(dict)
    assert schema()["workload"]["prefill"] == ("str", ("untimed", "chunked"))
    assert schema()["hisparse"]["host_to_device_ratio"] == ("opt_int", ())


def test_sections_read_by_attribute_only_and_stay_frozen():
    cfg = build(resolve({"spec": {"draft_tokens": 4, "accept_probs": [0.1, 0.2, 0.3, 0.4]},
                         "workload": {"seed": 5, "num_requests": 32}}))
    for name in SECTIONS:
        section = getattr(cfg, name)
        assert isinstance(section, SECTIONS[name])
        assert list(section.as_dict()) == [f.name for f in dataclasses.fields(SECTIONS[name])]
        with pytest.raises(TypeError):  # no item access: one way to read a section
            section[next(iter(section.as_dict()))]
    assert cfg.workload.seed == 5 and cfg.spec.draft_tokens == 4
    assert cfg.spec.accept_probs == (0.1, 0.2, 0.3, 0.4)  # a list in YAML, immutable here
    assert cfg.fidelity.request_fraction == 0.5  # the auto value (1/k, k = 32 // 16) is resolved, not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.workload.seed = 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hisparse.page_slots = 6
    with pytest.raises(AttributeError):
        cfg.workload.bogus
    with pytest.raises(AttributeError):
        cfg.bogus
    assert cfg.memory.as_dict() == cfg.raw["memory"] and cfg.memory.host_kv_fraction == 0.75
    assert cfg.hisparse.as_dict() == cfg.raw["hisparse"]


def test_config_pickles_and_copies():
    import copy
    import pickle

    cfg = build(resolve({"workload": {"num_requests": 32}}))
    for other in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg)):
        assert other.hisparse == cfg.hisparse and other.ulacache.num_recent_buckets == 32


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


def test_fidelity_may_be_named_by_one_word():
    """`fidelity: full` is the unsampled replay (the same section as its three keys), `default` the defaults, in a
    file or as `--set fidelity=...` (which resets what the file set); any other word is a one-line error."""
    full = build(resolve({"fidelity": "full"})).fidelity
    keys = build(resolve({}, ["fidelity.policy_groups=0", "fidelity.request_fraction=1.0"])).fidelity
    assert full == keys and (full.policy_groups, full.request_fraction, full.step_stride) == (0, 1.0, 1)
    reset = build(resolve({"fidelity": {"policy_groups": 4, "step_stride": 3}}, ["fidelity=default"])).fidelity
    assert reset == build(resolve({})).fidelity
    assert build(resolve({"fidelity": {"step_stride": 3}}, ["fidelity=full"])).fidelity.step_stride == 1
    with pytest.raises(ValueError, match="fidelity must be a mapping or one of full, default, got 'fast'"):
        resolve({"fidelity": "fast"})
