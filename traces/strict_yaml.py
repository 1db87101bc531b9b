"""A strict YAML reader for user files: safe types only, duplicate keys refused, alias/merge bombs refused.

`yaml.safe_load` silently keeps the last of two equal keys and builds "billion laughs" documents (nested anchors)
as shared references that explode when walked; both are refused here with one line naming the file.
"""
from __future__ import annotations

import re

import yaml

from traces.errors import TraceError

MAX_VALUES = 100_000  # scalars + containers after expanding aliases; a replay config has ~100
# bytes of one YAML file, checked before reading it: a config or calibration is a few KB, the largest sweep.yaml
# (one line per grid point) a few hundred KB; PyYAML parses ~1 MB/s, so 50 MB would hang for a minute and take GBs
MAX_YAML_BYTES = 16 << 20


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys and oversized merges."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    hash(key)
                except TypeError:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark, "found an unhashable key",
                        key_node.start_mark) from None
                if key in seen:
                    raise ValueError(f"duplicate key {key!r} at line {key_node.start_mark.line + 1} (each key "
                                     "may appear once in a mapping)")
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def flatten_mapping(self, node):
        super().flatten_mapping(node)
        if len(node.value) > MAX_VALUES:
            raise yaml.constructor.ConstructorError(None, None, f"merge keys expand to more than {MAX_VALUES:,} "
                                                    "entries", node.start_mark)


# YAML 1.1 (PyYAML) reads a float only with a dot and a signed exponent: `4e-6`, `2.5e9` and `1e3` stay strings.
# Users write them as YAML 1.2 and JSON do, so they are floats here too (quoted '4e-6' stays a string).
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def count_values(obj, limit: int = MAX_VALUES) -> int:
    """Values in `obj` with every shared (aliased) node counted each time it appears; raises past `limit`."""
    memo: dict[int, int] = {}
    active: set[int] = set()

    def walk(x) -> int:
        if isinstance(x, dict):
            children = [v for kv in x.items() for v in kv]
        elif isinstance(x, (list, tuple)):
            children = x
        else:
            return 1
        key = id(x)
        if key in memo:
            return memo[key]
        if key in active:
            raise ValueError("a recursive YAML alias (a node that contains itself)")
        active.add(key)
        total = 1
        for child in children:
            total += walk(child)
            if total > limit:
                raise ValueError(f"YAML aliases expand to more than {limit:,} values (an alias bomb?)")
        active.discard(key)
        memo[key] = total
        return total

    return walk(obj)


def load_yaml(text: str, where: str, limit: int = MAX_VALUES):
    """Parse one YAML document; TraceError (a ValueError) with one line naming `where` for anything refused."""
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
        count_values(data, limit)
    except yaml.YAMLError as exc:
        raise TraceError(f"{where}: not valid YAML ({' '.join(str(exc).split())[:160]})") from None
    except RecursionError:
        raise TraceError(f"{where}: YAML nested too deeply") from None
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from None
    return data


def read_yaml_file(path, limit: int = MAX_VALUES):
    """Read a UTF-8 YAML file strictly (bad UTF-8 is an error naming the file and the byte offset)."""
    from pathlib import Path

    path = Path(path)
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise TraceError(f"{path}: {size:,} bytes is over the {MAX_YAML_BYTES >> 20} MiB limit for a YAML file "
                         "(configs, calibrations and trace metadata are a few KB)")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    return load_yaml(text, str(path), limit)
