"""Replay configs: YAML (+ `--set dotted.key=value` overrides) -> a resolved dict -> a frozen `SimConfig`.

Every key is a field of a frozen dataclass with its default, help, unit and choices: the top-level keys of
`SimConfig` below, the shared sections in sim/sections.py, each system's own section beside its System in
sim/systems.py. The loader reads its keys, kinds (from the annotations), defaults and choices from those fields, so a
config of only the pinned keys (docs/architecture.md) runs; unknown keys and wrong types are rejected with a one-line
`ValueError` naming the key. `hardware.*` / `model.*` take a `preset` plus any preset field.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.presets import HARDWARE_PRESETS, MODEL_PRESETS, HardwareSpec, ModelSpec, build_hardware, build_model
from sim.sections import (
    SECTIONS,
    FidelityConfig,
    MemoryConfig,
    OutputConfig,
    Section,
    SpecConfig,
    WorkloadConfig,
    kinds,
)
from sim.sections import key as setting
from sim.systems import SYSTEMS as SYSTEM_CLASSES  # the `system:` choices; registers the systems' sections
from traces.errors import TraceError
from traces.strict_yaml import load_yaml, read_yaml_file

ATTENTION = ("dp", "tp")
POLICIES = ("pb-lru", "lru")
FREE_SECTIONS = ("hardware", "model", "costs")  # validated by the presets / the cost model
# Limits a serving engineer would expect (beyond them a value is a typo, not a workload); each error says why.
MAX_INT = 2**63 - 1  # int64: what the arrays and parquet files hold
MAX_SEED = 2**32 - 1  # the request generator keys its RNG on 32 bits: larger seeds would alias smaller ones
MAX_REQUESTS = 1_000_000  # a replay simulates every request; a million is days of a node's traffic
MAX_DRAFT_TOKENS = 16  # SGLang's EAGLE/MTP recipes for these models use 4 (3 steps); chains past 16 are not modelled


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """A resolved replay config. Its plain keys are the top-level ones; `spec` .. `output` are the sections every
    run reads (sim/sections.py); each system's own section (declared beside its System in sim/systems.py) is in
    `system_sections` and read as `cfg.<system name>`."""

    system: str = setting("ulacache", "which serving system the replay simulates", choices=tuple(SYSTEM_CLASSES))
    attention: str = setting("tp", "attention parallelism across the node's GPUs (data-parallel or "
                                   "tensor-parallel)", choices=ATTENTION)
    policy: str = setting("pb-lru", "UlaCache's GPU-pool replacement policy (PB-LRU, or exact timestamp LRU as the "
                                    "ablation)", choices=POLICIES)
    cpu_storage: bool = setting(True, "UlaCache: back the GPU pool with an exclusive CPU pool (capacity = GPU + "
                                      "CPU slots)")
    hardware: HardwareSpec  # free section: a preset plus any of its fields (sim/presets.py)
    model: ModelSpec  # free section: a preset plus any of its fields
    spec: SpecConfig
    workload: WorkloadConfig
    memory: MemoryConfig
    system_sections: dict[str, Section]  # name -> a system's own section (registered by sim/systems.py)
    fidelity: FidelityConfig
    output: OutputConfig
    costs: dict  # free section: validated by the cost model (sim.costs), keys are its cost keys
    raw: dict  # the resolved dict (written as config.yaml)

    def __getattr__(self, name: str):
        """A system's own section by its name (`cfg.<system name>`)."""
        sections = self.__dict__.get("system_sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def num_gpus(self) -> int:
        return self.hardware.num_gpus

    @property
    def query_tokens(self) -> int:
        return max(1, self.spec.draft_tokens)


def _rules(cls: type) -> dict[str, tuple[str, tuple]]:
    """key -> (kind, choices) of a config dataclass's plain keys, from its annotations and field metadata."""
    found = kinds(cls)
    return {f.name: (found[f.name], tuple(f.metadata.get("choices", ())))
            for f in dataclasses.fields(cls) if f.name in found}


def section_names() -> list[str]:
    """Every section in SimConfig's order, the systems' own where SimConfig holds `system_sections`."""
    own = {f.name for f in dataclasses.fields(SimConfig)}
    out = []
    for f in dataclasses.fields(SimConfig):
        if f.name == "system_sections":
            out += [name for name in SECTIONS if name not in own]
        elif f.name in SECTIONS:
            out.append(f.name)
    return out


def schema() -> dict:
    """The loader's view of the config classes: top-level key -> (kind, choices); section -> {key: (kind, choices)}."""
    out: dict[str, Any] = dict(_rules(SimConfig))
    for name in section_names():
        out[name] = _rules(SECTIONS[name])
    return out


def default_tree() -> dict:
    """Every key at its default (the fields' defaults), in the order config.yaml is written."""
    tree: dict[str, Any] = {f.name: copy.deepcopy(f.default) for f in dataclasses.fields(SimConfig)
                            if f.name in kinds(SimConfig)}
    for name in section_names():
        tree[name] = SECTIONS[name]().as_dict()
    tree["hardware"] = {"preset": "h200", "num_gpus": 8}
    tree["model"] = {"preset": "glm-5.2"}
    tree["costs"] = {}
    return tree


def default_num_requests(max_concurrency: int) -> int:
    """Requests a run draws when `workload.num_requests` is not given: two per slot of the concurrency cap. The first
    `max_concurrency` fill the batch; each later one refills a slot as a request completes, so the running
    concurrency stays at the cap (or at the admission ceiling below it) from the first completion until the last
    admission -- the steady window `decode_throughput_tok_s` is measured over (sim/run.py) -- about one request
    lifetime, by when every slot has been refilled once on average."""
    return int(min(2 * max_concurrency, MAX_REQUESTS))


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float range
        return False


def _check(key: str, value, rule: tuple[str, tuple]):
    """One key's value, typed by its kind and checked against its choices (one-line errors naming the key)."""
    kind, choices = rule
    if kind.startswith("opt_"):
        if value is None:
            return None
        kind = kind[4:]
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"config key {key} must be true or false, got {value!r}")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and (not math.isfinite(value) or not value.is_integer())):
            raise ValueError(f"config key {key} must be an integer, got {value!r}")
        value = int(value)
        if abs(value) > MAX_INT:
            raise ValueError(f"config key {key} must be an integer within +-(2^63 - 1), got {value}")
    elif kind == "float":
        if isinstance(value, str):  # YAML 1.1 reads 2.5e9 (no sign in the exponent) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"config key {key} must be a number, got {value!r}")
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise ValueError(f"config key {key} must be a finite number, got {value!r}")
    elif kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"config key {key} must be a string, got {value!r}")
    elif kind == "list_float":
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or not value or len(value) > 1024 or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v) for v in value):
            raise ValueError(f"config key {key} must be a list of finite numbers, got {str(value)[:80]}")
        value = [float(v) for v in value]
    if choices and value not in choices:
        raise ValueError(f"config key {key} must be one of {list(choices)}, got {value!r}")
    return value


def _merge(tree: dict, user: dict, schema, prefix: str = ""):
    if not isinstance(user, dict):
        raise ValueError(f"config section {prefix.rstrip('.') or '<top>'} must be a mapping, got {user!r}")
    for key, value in user.items():
        name = f"{prefix}{key}"
        if not isinstance(key, str):
            raise ValueError(f"config key {name!r} is not a string")
        if schema is None:  # free section: keep, validated later
            tree[key] = value
            continue
        if key not in schema:
            if prefix == "" and key in FREE_SECTIONS:
                if not isinstance(value, dict):
                    raise ValueError(f"config section {key} must be a mapping, got {value!r}")
                _merge(tree.setdefault(key, {}), value, None, f"{key}.")
                continue
            raise ValueError(f"unknown config key {name!r}")
        rule = schema[key]
        if isinstance(rule, dict):
            _merge(tree[key], value, rule, f"{name}.")
        else:
            tree[key] = _check(name, value, rule)


# One `--set` grammar for replay, sweep (`--set` and each `--grid` value) and plan: a dotted key of identifiers,
# `=`, and a non-empty value read by the strict YAML reader (duplicate keys and alias bombs refused); text that is not
# valid YAML stays a string. Typing and range checks are the config classes' (`_merge`), the same for every command.
KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def parse_value(text: str, where: str = "--set") -> Any:
    """A `--set`/`--grid` value as YAML reads it (8 -> int, true -> bool, pb-lru -> str, [1, 2] -> list)."""
    try:
        return load_yaml(text, where)
    except TraceError as exc:
        if "not valid YAML" not in str(exc):
            raise ValueError(str(exc)) from None
        return text.strip()


def _split(item: str, what: str) -> tuple[str, str]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not KEY_RE.match(key) or not text.strip():
        hint = ",value2,..." if what == "--grid" else ""
        raise ValueError(f"bad {what} {item!r}: expected dotted.key=value{hint} (key: dotted names of letters, "
                         f"digits and _; value: non-empty, null for none)")
    return key, text


def parse_set(item: str, what: str = "--set") -> tuple[str, Any]:
    """`dotted.key=value` -> (key, typed value); a one-line ValueError naming the flag otherwise."""
    key, text = _split(item, what)
    return key, parse_value(text, f"{what} {key}")


def parse_grid_item(item: str) -> tuple[str, list]:
    """`key=v1,v2,...` -> (key, [typed values]); each value typed exactly as `--set key=v` would be."""
    key, text = _split(item, "--grid")
    texts = [t.strip() for t in text.split(",")]
    if any(not t for t in texts):
        raise ValueError(f"bad --grid {item!r}: empty value in the list")
    values = [parse_value(t, f"--grid {key}") for t in texts]
    if any(isinstance(v, (dict, list)) for v in values):
        raise ValueError(f"bad --grid {item!r}: grid values are scalars (use --set for a list or mapping)")
    return key, values


def format_set(key: str, value: Any) -> str:
    """(key, value) -> `key=text` that `parse_set` reads back as the same value (quoted where YAML would retype)."""
    import json

    if isinstance(value, str):
        try:
            same = parse_value(value) == value
        except ValueError:
            same = False
        return f"{key}={value if same else json.dumps(value)}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"{key}={'.nan' if value != value else ('.inf' if value > 0 else '-.inf')}"
        mantissa, e, exponent = repr(value).partition("e")  # YAML 1.1 reads 1e-05 as a string, 1.0e-05 as a float
        return f"{key}={mantissa if '.' in mantissa or not e else mantissa + '.0'}{e}{exponent}"
    return f"{key}={json.dumps(value)}"


def parse_override(item: str) -> tuple[list[str], Any]:
    key, value = parse_set(item)
    return key.split("."), value


def _nest(parts: list[str], value) -> dict:
    out: dict = {}
    node = out
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


# `fidelity: <level>` (or `--set fidelity=<level>`) names a whole fidelity section: `full` simulates every group,
# every request, every step (the unsampled replay the sampled default is measured against, docs/cost-model.md);
# `default` is the section's defaults. A mapping sets keys one by one as any section does.
FIDELITY_LEVELS = {"full": {"policy_groups": 0, "request_fraction": 1.0, "step_stride": 1}, "default": None}


def _fidelity_level(user: dict) -> dict:
    """`user` with a named fidelity level replaced by its keys (a one-line error for an unknown name)."""
    level = user.get("fidelity")
    if not isinstance(level, str):
        return user
    if level not in FIDELITY_LEVELS:
        raise ValueError(f"config key fidelity must be a mapping or one of {', '.join(FIDELITY_LEVELS)}, "
                         f"got {level!r}")
    keys = FIDELITY_LEVELS[level]
    return {**user, "fidelity": dict(default_tree()["fidelity"] if keys is None else keys)}


def resolve(user: dict | None, overrides: list[str] | None = None) -> dict:
    """Defaults + user dict + overrides, type-checked, as a plain nested dict (presets validated too)."""
    tree, rules = default_tree(), schema()
    _merge(tree, _fidelity_level(user or {}), rules)
    for item in overrides or []:
        parts, value = parse_override(item)
        _merge(tree, _fidelity_level(_nest(parts, value)), rules)
    build(tree)  # validates presets, cross-field rules
    return tree


def load_config(path: str | Path | dict, overrides: list[str] | None = None) -> dict:
    """Read a YAML config (or take a dict) and resolve it; raises ValueError/OSError with one-line messages."""
    for item in overrides or []:  # a malformed --set is the flag's error, not the file's (same for every command)
        parse_set(item)
    if isinstance(path, dict):
        user = path
    else:
        path = Path(path)
        if not path.is_file():
            raise OSError(f"config file not found: {path}")
        user = read_yaml_file(path)
        user = {} if user is None else user
        if not isinstance(user, dict):
            raise ValueError(f"{path}: a config must be a YAML mapping")
    try:
        return resolve(user, overrides)
    except ValueError as exc:
        if isinstance(path, Path):
            raise ValueError(f"{path}: {exc}") from None
        raise


# Validation bounds of hardware overrides (a value past them is a unit slip, and overflows the step clock):
HW_RANGES = {  # suffix -> (low, high, unit, why)
    "_bytes_s": (1e6, 1e15, "bytes/s", "1 MB/s to 1 PB/s; an H200 has 55.5 GB/s PCIe, 4.8 TB/s HBM"),
    "_flops": (1e9, 1e18, "FLOP/s", "a B300 has 4.5e15"),
    "_s": (0.0, 1.0, "s", "a launch or link latency is microseconds"),
    "_bytes": (1e6, 1e15, "bytes", "an H200 has 141 GB of HBM"),
}


def _check_numbers(section: str, values: dict) -> None:
    """hardware.* / model.* overrides: finite numbers (named), hardware figures within HW_RANGES."""
    for key, value in values.items():
        if isinstance(value, str):  # YAML 1.1 strings such as 2e12 are converted by the presets
            try:
                value = float(value)
            except ValueError:
                continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not _finite(value):
            raise ValueError(f"config key {section}.{key} must be a finite number, got {value!r}")
        if section != "hardware" or key == "num_gpus":
            continue
        for suffix, (lo, hi, unit, why) in HW_RANGES.items():
            if key.endswith(suffix):
                if not lo <= value <= hi:
                    raise ValueError(f"config key hardware.{key} must be in [{lo:g}, {hi:g}] {unit} ({why}), "
                                     f"got {value!r}")
                break


def _fidelity(fid: dict, num_requests: int, num_groups: int) -> dict:
    """The fidelity section checked, with its default request fraction filled in."""
    if fid["request_fraction"] is None:
        fid = {**fid, "request_fraction": 1.0 / min(16, max(1, num_requests // 16))}
    if not 0 < fid["request_fraction"] <= 1:
        raise ValueError("config key fidelity.request_fraction must be in (0, 1]")
    if fid["policy_groups"] < 0 or fid["policy_groups"] > num_groups:
        raise ValueError(f"config key fidelity.policy_groups must be in [0, {num_groups}]")
    if not -1 <= fid["only_group"] < num_groups:
        raise ValueError(f"config key fidelity.only_group must be -1 (off) or in [0, {num_groups - 1}]")
    return fid


def build(tree: dict) -> SimConfig:
    """Resolved dict -> SimConfig (validates preset overrides and cross-field rules)."""
    from sim.calibration import check_costs

    for section in ("hardware", "model"):
        if isinstance(tree.get(section), dict):
            _check_numbers(section, tree[section])
    if isinstance(tree.get("costs"), dict):
        check_costs(tree["costs"], "config costs")
    hw = dict(tree.get("hardware") or {})
    hw_preset = hw.pop("preset", "h200")
    if not isinstance(hw_preset, str):
        raise ValueError(f"hardware.preset must be a string; choose from {sorted(HARDWARE_PRESETS)}")
    model = dict(tree.get("model") or {})
    model_preset = model.pop("preset", "glm-5.2")
    if not isinstance(model_preset, str):
        raise ValueError(f"model.preset must be a string; choose from {sorted(MODEL_PRESETS)}")
    hardware = build_hardware(hw_preset, hw)
    model_spec = build_model(model_preset, model)
    _check_limits(tree, hardware, model_spec)
    if not isinstance(tree.get("costs"), dict):
        raise ValueError("config section costs must be a mapping")
    spec, wl, fid = tree["spec"], tree["workload"], tree["fidelity"]
    if wl["num_requests"] is None:
        wl = {**wl, "num_requests": default_num_requests(wl["max_concurrency"])}
    positive = [("workload.num_requests", wl["num_requests"]), ("workload.max_concurrency", wl["max_concurrency"]),
                ("fidelity.step_stride", fid["step_stride"])]
    for name, value in positive:
        if value < 1:
            raise ValueError(f"config key {name} must be >= 1, got {value}")
    if spec["draft_tokens"] < 0:
        raise ValueError("config key spec.draft_tokens must be >= 0")
    q = max(1, spec["draft_tokens"])
    if q > 1 and spec["accept_mean"] is not None and not 1.0 <= spec["accept_mean"] <= q:
        raise ValueError(f"config key spec.accept_mean must be in [1, {q}] for spec.draft_tokens="
                         f"{spec['draft_tokens']}, got {spec['accept_mean']}")
    if spec["accept_probs"] is not None and q > 1:
        probs = spec["accept_probs"]
        if len(probs) != q or min(probs) < 0 or abs(sum(probs) - 1) > 1e-6:
            raise ValueError(f"config key spec.accept_probs must be {q} probabilities summing to 1")
    fid = _fidelity(fid, wl["num_requests"], model_spec.num_index_groups)
    mem = tree["memory"]
    if not 0 < mem["host_kv_fraction"] <= 1:
        raise ValueError("config key memory.host_kv_fraction must be in (0, 1]")
    resolved = {**tree, "fidelity": fid, "workload": wl}  # request_fraction, num_requests filled in
    sections = {name: SECTIONS[name](**{k: tuple(v) if isinstance(v, list) else v for k, v in resolved[name].items()})
                for name in section_names()}  # lists (accept_probs) as tuples: a frozen section stays frozen
    for section in sections.values():
        section.check(model_spec)
    own = {f.name for f in dataclasses.fields(SimConfig)}
    return SimConfig(
        **{name: tree[name] for name in kinds(SimConfig)}, hardware=hardware, model=model_spec,
        costs=dict(tree["costs"]), raw=copy.deepcopy(tree), **{k: v for k, v in sections.items() if k in own},
        system_sections={k: v for k, v in sections.items() if k not in own})


def _check_limits(tree: dict, hardware: HardwareSpec, model: ModelSpec) -> None:
    """Legal-looking but absurd values: refused with the limit and the reason in the message."""
    import dataclasses

    for what, spec in (("hardware", hardware), ("model", model)):
        for f in dataclasses.fields(spec):
            value = getattr(spec, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not _finite(value):
                raise ValueError(f"config key {what}.{f.name} must be a finite number, got {value!r}")
    if not 1 <= hardware.num_gpus <= 72:
        raise ValueError(f"config key hardware.num_gpus must be in [1, 72] (one NVLink domain, e.g. GB200 NVL72), "
                         f"got {hardware.num_gpus}")
    if tree["attention"] == "tp" and model.num_heads % hardware.num_gpus:
        raise ValueError(f"attention tp over hardware.num_gpus={hardware.num_gpus}: the TP degree must divide "
                         f"{model.name}'s {model.num_heads} attention heads (1, 2, 4, 8, ... GPUs); use attention dp")
    wl, spec = tree["workload"], tree["spec"]
    for name in ("num_requests", "max_concurrency"):
        if wl[name] is not None and wl[name] > MAX_REQUESTS:
            raise ValueError(f"config key workload.{name} must be <= {MAX_REQUESTS:,} (a replay simulates every "
                             f"request), got {wl[name]:,}")
    if not 0 <= wl["seed"] <= MAX_SEED:
        raise ValueError(f"config key workload.seed must be in [0, 2^32 - 1] (the generator keys on 32 bits; "
                         f"larger seeds would repeat smaller ones), got {wl['seed']}")
    if spec["draft_tokens"] > MAX_DRAFT_TOKENS:
        raise ValueError(f"config key spec.draft_tokens must be in [0, {MAX_DRAFT_TOKENS}] (SGLang's EAGLE/MTP "
                         f"recipes use 4; longer draft chains are not modelled), got {spec['draft_tokens']}")
    mem = tree["memory"]
    for name in ("gpu_kv_bytes_per_gpu", "cpu_kv_bytes_per_gpu", "gpu_reserve_bytes"):
        if mem[name] is not None and mem[name] < 0:
            raise ValueError(f"config key memory.{name} must be >= 0 bytes, got {mem[name]}")
        if mem[name] is not None and mem[name] > HW_RANGES["_bytes"][1]:
            raise ValueError(f"config key memory.{name} must be <= {HW_RANGES['_bytes'][1]:g} bytes per GPU (a "
                             f"petabyte), got {mem[name]:g}")
    if mem["gpu_kv_bytes_per_gpu"] is not None and mem["gpu_kv_bytes_per_gpu"] < 1:
        raise ValueError("config key memory.gpu_kv_bytes_per_gpu must be > 0 bytes (the GPU holds the KV of every "
                         f"running request; null for HBM - weights - reserve), got {mem['gpu_kv_bytes_per_gpu']}")
    non_negative = [("workload.max_steps", wl["max_steps"]), ("fidelity.pilot_steps", tree["fidelity"]["pilot_steps"]),
                    ("output.trace_event_steps", tree["output"]["trace_event_steps"])]
    for name, value in non_negative:
        if value < 0:
            raise ValueError(f"config key {name} must be >= 0, got {value}")
    chunk = wl["prefill_chunk_tokens"]
    if chunk is not None and (chunk < 1 or (tree["attention"] == "dp" and chunk < hardware.num_gpus)):
        raise ValueError(f"config key workload.prefill_chunk_tokens must be >= 1 (>= hardware.num_gpus under dp "
                         f"attention: SGLang divides it over the DP ranks), got {chunk}")


def as_plain(cfg: SimConfig) -> dict:
    return copy.deepcopy(cfg.raw)

