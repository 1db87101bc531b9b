"""Write docs/config.md from the config classes: every replay-config key with its default, unit and meaning, the
hardware and model presets, the cost-model keys, and the library's `CacheConfig`.

It reads the dataclasses themselves (`dataclasses.fields` of `sim.config.SimConfig` and its section classes), so a
new key shows up without editing this script. Meaning and unit come from each field's metadata (`help`, `unit`,
`choices`) where the class declares them; otherwise from the comment beside (or just above) the field in its source,
and the unit from the key's name (`_bytes`, `_s`, `_slots`, ...).

    python docs/gen_config_reference.py [--out docs/config.md] [--check]
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
import typing
from pathlib import Path

from page_main import page_main  # docs/page_main.py: docs/ is sys.path[0] when this script runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# unit by the key's name, most specific first (the project names carry units: `num_`, `_bytes`, `_s`, `_tok_s`)
INFIX_UNITS = (("_efficiency_by_", "fraction"), ("_bytes_per_", "bytes"))
SUFFIX_UNITS = (("_bytes_s", "bytes/s"), ("_tok_s", "tokens/s"), ("_bytes", "bytes"), ("_ms", "ms"), ("_s", "s"),
                ("_slots", "token slots"), ("_tokens", "tokens"), ("_fraction", "fraction"), ("_ratio", "ratio"),
                ("_flops", "FLOP/s"), ("_steps", "steps"), ("_params", "parameters"), ("_probs", "probabilities"),
                ("_efficiency", "fraction"), ("_gb", "GB"))
PREFIX_UNITS = (("num_", "count"), ("max_", "count"))


def unit_of(name: str, meta: typing.Mapping) -> str:
    if meta.get("unit") or meta.get("units"):
        return str(meta.get("unit") or meta.get("units"))
    for infix, unit in INFIX_UNITS:
        if infix in name:
            return unit
    for suffix, unit in SUFFIX_UNITS:
        if name.endswith(suffix):
            return unit
    for prefix, unit in PREFIX_UNITS:
        if name.startswith(prefix):
            return unit
    return ""


def source_comments(source: str, names: typing.Iterable[str]) -> dict[str, str]:
    """name -> the comment on its declaration line (`name: T = x  # ...` or `"name": (...),  # ...`), else the
    full-line comments right above it."""
    lines = source.splitlines()
    out: dict[str, str] = {}
    for name in names:
        pattern = re.compile(rf'^\s*("{name}"\s*:|{name}\s*:|{name}\s*=)')
        for i, line in enumerate(lines):
            if not pattern.match(line):
                continue
            _, hash_, comment = line.partition("  # ")
            above = []
            j = i - 1
            while j >= 0 and lines[j].strip().startswith("#"):
                above.insert(0, lines[j].strip().lstrip("#").strip())
                j -= 1
            text = " ".join(above + ([comment.strip()] if hash_ else []))
            if text:
                out[name] = text
            break
    return out


def docstring_fields(cls: type) -> dict[str, str]:
    """`name: text` entries of a class docstring (the library's CacheConfig style: several per line, continued on
    the lines below)."""
    out: dict[str, str] = {}
    current = None
    for line in (inspect.getdoc(cls) or "").splitlines():
        if not line.strip():
            current = None
            continue
        for part in re.split(r"(?<=[.;])\s+(?=[a-z_]+: )", line.strip()):
            match = re.match(r"^([a-z_]+): (.*)$", part)
            if match:
                current = match.group(1)
                out[current] = match.group(2)
            elif current:
                out[current] += " " + part
    return out


def _source(cls: type) -> str:
    """The class's own source (its field comments are the fallback meaning)."""
    return inspect.getsource(cls)


def _cell(value) -> str:
    if isinstance(value, str):
        return f"`{value}`"
    if value is None:
        return "none"
    if isinstance(value, float) and (abs(value) >= 1e6 or 0 < abs(value) < 1e-3):
        return f"`{value:.4g}`"
    return f"`{value}`"


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _choices(cls: type, field: dataclasses.Field) -> tuple:
    if field.metadata.get("choices"):
        return tuple(field.metadata["choices"])
    hint = typing.get_type_hints(cls).get(field.name)
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    return _registry(cls, field.name)


def _registry(cls: type, name: str) -> tuple:
    """Choices from a registry named after the field: `MODES` beside the class, `ulacache.policies.POLICIES`..."""
    plural = name.upper() + ("ES" if name.endswith("s") else "S")
    plural = plural[:-2] + "IES" if plural.endswith("YS") else plural
    module = sys.modules[cls.__module__]
    found = getattr(module, plural, None)
    if found is None:
        package = cls.__module__.rpartition(".")[0]
        try:
            found = getattr(importlib.import_module(f"{package}.{plural.lower()}"), plural, None)
        except ImportError:
            found = None
    if isinstance(found, dict):
        return tuple(found)
    return tuple(found) if isinstance(found, (tuple, list)) and all(isinstance(v, str) for v in found) else ()


def field_rows(cls: type, prefix: str, defaults: dict | None = None) -> list[str]:
    """One markdown row per field of a config dataclass: key, default, unit, meaning."""
    fields = dataclasses.fields(cls)
    comments = source_comments(_source(cls), [f.name for f in fields])
    comments.update({k: v for k, v in docstring_fields(cls).items() if k not in comments})
    rows = []
    for f in fields:
        meta = f.metadata
        meaning = str(meta.get("help") or meta.get("doc") or meta.get("description") or comments.get(f.name, ""))
        choices = _choices(cls, f)
        if choices:
            meaning = f"one of {', '.join(f'`{c}`' for c in choices)}: {meaning}".strip(": ")
        default = (defaults or {}).get(f.name, _default(f))
        shown = "(per preset)" if default is dataclasses.MISSING else _cell(default)
        rows.append(f"| `{prefix}{f.name}` | {shown} | {unit_of(f.name, meta)} | {meaning.replace('|', '/')} |")
    return rows


TABLE = "| key | default | unit | meaning |\n|---|---|---|---|"


def _top_level(sim_config) -> tuple[list[str], list[tuple[str, type]]]:
    """Rows of SimConfig's plain keys, and its (name, class) config sections (dataclass-typed fields)."""
    hints = typing.get_type_hints(sim_config.SimConfig)
    tree = sim_config.default_tree()
    rows, sections = [], []
    for f in dataclasses.fields(sim_config.SimConfig):
        kind = hints.get(f.name)
        if dataclasses.is_dataclass(kind):
            sections.append((f.name, kind))
        elif f.name in tree and not isinstance(tree[f.name], dict):
            meaning = f.metadata["help"]
            choices = _choices(sim_config.SimConfig, f)
            if choices:
                meaning = f"one of {', '.join(f'`{c}`' for c in choices)}: {meaning}".strip(": ")
            rows.append(f"| `{f.name}` | {_cell(tree[f.name])} | {unit_of(f.name, f.metadata)} | {meaning} |")
    for name, cls in getattr(sim_config, "SECTIONS", {}).items():  # sections registered beside SimConfig's own
        if name not in dict(sections):
            sections.append((name, cls))
    return rows, sections


def preset_rows(cls: type, presets: dict, prefix: str) -> list[str]:
    """key | unit | one column per preset | meaning."""
    comments = source_comments(_source(cls), [f.name for f in dataclasses.fields(cls)])
    names = list(presets)
    out = [f"| key | unit | {' | '.join(f'`{n}`' for n in names)} | meaning |",
           "|---|---|" + "---|" * len(names) + "---|"]
    for f in dataclasses.fields(cls):
        values = " | ".join(_cell(getattr(presets[n], f.name)) for n in names)
        meaning = str(f.metadata.get("help") or comments.get(f.name, ""))
        out.append(f"| `{prefix}{f.name}` | {unit_of(f.name, f.metadata)} | {values} | {meaning} |")
    return out


def cost_rows(path: Path) -> list[str]:
    """The cost-model keys from their defaults file: key, default, unit, the comment beside it (and the indented
    comment lines that continue it)."""
    rows: list[list[str]] = []
    for line in path.read_text().splitlines():
        match = re.match(r"^([a-z0-9_]+):\s*(.*?)\s*(?:#\s*(.*))?$", line)
        if match:
            key, value, comment = match.groups()
            rows.append([key, value or "{}", comment or ""])
        elif rows and re.match(r"^\s+#", line):
            rows[-1][2] += " " + line.strip().lstrip("#").strip()
        else:
            rows.append(["", "", ""])  # a blank or heading line ends the continuation
    return [TABLE] + [f"| `costs.{k}` | `{v}` | {unit_of(k, {})} | {c.replace('|', '/')} |" for k, v, c in rows if k]


def render() -> str:
    import sim.config as sim_config
    from sim.presets import HARDWARE_PRESETS, MODEL_PRESETS
    from ulacache.config import CacheConfig

    top, sections = _top_level(sim_config)
    out = [HEADER, "## Top-level keys\n", TABLE, *top, ""]
    for name, cls in sections:
        if name == "hardware":
            out += ["## `hardware.*`\n", "`hardware.preset` picks a column; any field below can be overridden "
                    "(`--set hardware.num_gpus=4`).\n", *preset_rows(cls, HARDWARE_PRESETS, "hardware."), ""]
        elif name == "model":
            out += ["## `model.*`\n", "`model.preset` picks a column; any field can be overridden.\n",
                    *preset_rows(cls, MODEL_PRESETS, "model."), ""]
        else:
            doc = inspect.getdoc(cls) if cls.__doc__ else ""  # the section class's docstring, whole
            out += [f"## `{name}.*`\n", doc + "\n" if doc else "", TABLE, *field_rows(cls, f"{name}."), ""]
    costs_file = ROOT / "sim" / "costs.yaml"
    if costs_file.exists():
        out += ["## `costs.*`\n", COSTS_NOTE, *cost_rows(costs_file), ""]
    out += ["## Library: `ulacache.CacheConfig`\n", LIBRARY_NOTE, TABLE, *field_rows(CacheConfig, ""), ""]
    return "\n".join(line for line in out if line is not None).rstrip() + "\n"


HEADER = """# Configuration reference

A replay config is YAML of dotted keys (`workload.max_concurrency: 64`), or the same keys given as
`--set workload.max_concurrency=64` to `ulacache replay`, `sweep` and `plan` (`--grid key=v1,v2` for a sweep).
Every key has a default, so a config of only `system`, `attention`, `hardware.preset`, `model.preset`, `policy`,
`cpu_storage`, `spec.draft_tokens` and `workload.*` runs. Unknown keys, duplicate keys and wrong types are refused
in one line naming the key. The resolved config of each run is written beside its metrics as `config.yaml`.

This page is generated from the config classes (`python docs/gen_config_reference.py`, or `make docs`); edit the
classes, not this page.
"""
COSTS_NOTE = """Cost-model constants. Lowest to highest precedence: the hardware preset's roofline, these defaults
(`sim/costs.yaml`), the preset's committed calibration (`hw/calibration/h200.yaml`; `--calibration none` skips it),
then a config's `costs:` section. Where each value comes from and how sensitive the results are to it: see
[cost-model.md](cost-model.md).
"""
LIBRARY_NOTE = """`UlaCache(CacheConfig(...))` of the policy library (also `CacheConfig.from_dict` / `from_yaml`,
which refuse unknown keys). Sizes are token slots of one layer group, per rank.
"""


def main() -> int:
    return page_main(__doc__.splitlines()[0], ROOT / "docs" / "config.md", render)


if __name__ == "__main__":
    sys.exit(main())
