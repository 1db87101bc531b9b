"""Replay-config sections: one frozen dataclass per `section:` mapping, one field per key, each with its help, unit
and choices in the field's metadata (what the loader, `--set` and docs/config.md read).

The sections every run reads are declared here; a system's own section (`hisparse:`, `ulacache:`) is declared beside
its System class in sim/systems.py and registered there (`register_section`), so the loader (sim/config.py) names no
system-specific key. Key kinds come from the annotations: int, float, bool, str, `X | None` (null allowed) and
`tuple[float, ...] | None` (a YAML list of numbers).
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass

SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}


def key(default, help: str, unit: str = "", choices: tuple = ()) -> typing.Any:
    """A config key: its default, what it means (`help`), its unit and, for an enumerated key, its choices."""
    return dataclasses.field(default=default, metadata={"help": help, "unit": unit, "choices": tuple(choices)})


def kind_of(hint) -> str:
    """The loader's kind of an annotation: int | float | bool | str, `opt_` + one of them, or list_float."""
    args = typing.get_args(hint)
    optional = (typing.get_origin(hint) in (typing.Union, types.UnionType)) and type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else hint
    if typing.get_origin(base) is tuple:
        return "list_float"
    if base not in SCALARS:
        raise TypeError(f"config key annotation {hint!r} has no loader kind")
    return ("opt_" if optional else "") + SCALARS[base]


@functools.cache
def kinds(cls: type) -> dict[str, str]:
    """Field name -> loader kind of a config dataclass's plain keys (fields annotated as other types are left out)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        try:
            out[f.name] = kind_of(hints[f.name])
        except TypeError:
            continue
    return out


class Section:
    """Base of the typed sections: read as `cfg.workload.seed` (attributes only; `as_dict()` for a plain copy)."""

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def check(self, model) -> None:
        """Range rules of this section's keys once resolved (`model`: the ModelSpec); a one-line ValueError."""


SECTIONS: dict[str, type[Section]] = {}  # section name -> class: the shared ones below, then each system's


def register_section(name: str, cls: type[Section]) -> type[Section]:
    """Make `name:` a config section read into `cls` (a frozen Section dataclass); one class per name."""
    if not (dataclasses.is_dataclass(cls) and issubclass(cls, Section)):
        raise TypeError(f"config section {name}: {cls!r} is not a Section dataclass")
    if SECTIONS.setdefault(name, cls) is not cls:
        raise ValueError(f"config section {name} registered twice ({SECTIONS[name].__name__}, {cls.__name__})")
    return cls


@dataclass(frozen=True)
class SpecConfig(Section):
    """Speculative decoding (MTP / EAGLE verify tokens)."""

    draft_tokens: int = key(0, "verify tokens per request per step (0 = speculative decoding off)", "tokens")
    accept_mean: float | None = key(None, "mean tokens accepted per verify step; none = 1 + 2/3 (q - 1) "
                                          "(3.0 at q = 4)", "tokens")
    accept_probs: tuple[float, ...] | None = key(None, "explicit P(accept = 1..draft_tokens); overrides accept_mean",
                                                 "probabilities")


@dataclass(frozen=True)
class WorkloadConfig(Section):
    """The requests a replay serves: generated from a profile or read from a trace."""

    profile: str = key("multi-lexsum", "request-length profile the generator draws from: `multi-lexsum`, `small` "
                                       "(traces/profiles/) or a profile YAML path")
    num_requests: int | None = key(None, "requests drawn; none = 2 x max_concurrency: the first wave fills the cap, "
                                         "the second refills each slot once as it frees, holding the running "
                                         "concurrency at the cap through a steady window", "count")
    max_concurrency: int = key(256, "most requests running at once", "count")
    seed: int = key(0, "request generator seed (32 bits)")
    trace: str | None = key(None, "trace dir (requests.parquet + trace.yaml); none = generate from profile", "path")
    max_steps: int = key(0, "stop after this many decode steps (0 = run to completion)", "steps")
    prefill: str = key("untimed", "how prompts are served: untimed (their KV arrives with the request, a PD decode "
                                  "node) or chunked (co-located prefill, sim/prefill.py)", choices=("untimed", "chunked"))
    prefill_chunk_tokens: int | None = key(None, "prefill chunk per step, all ranks; none = SGLang's default by GPU "
                                                 "memory", "tokens")


@dataclass(frozen=True)
class MemoryConfig(Section):
    """KV budgets per GPU; every system gets the same ones."""

    gpu_kv_bytes_per_gpu: float | None = key(None, "GPU KV budget; none = HBM - weights - gpu_reserve_bytes", "bytes")
    cpu_kv_bytes_per_gpu: float | None = key(None, "CPU KV budget; none = host memory x host_kv_fraction / GPUs",
                                             "bytes")
    gpu_reserve_bytes: float = key(8e9, "HBM kept for activations, CUDA graphs and workspace", "bytes")
    host_kv_fraction: float = key(0.75, "share of host memory for KV when cpu_kv_bytes_per_gpu is none", "fraction")


@dataclass(frozen=True)
class FidelityConfig(Section):
    """How much of the policy work a replay simulates (sampling; docs/cost-model.md "What is sampled"). The section
    may also be one word: `fidelity: full` (or `--set fidelity=full`) simulates every group, every request and every
    step (policy_groups 0, request_fraction 1.0, step_stride 1), `fidelity: default` resets it to the defaults."""

    policy_groups: int = key(2, "indexer groups simulated by the policy (0 = all); the others copy the nearest",
                             "count")
    request_fraction: float | None = key(None, "share of requests whose selections run through the policy; none = "
                                               "1/k with k = num_requests // 16 clamped to [1, 16] (~16+ simulated "
                                               "requests), so a small config stays within minutes and a few GB; "
                                               "1.0 for a full run", "fraction")
    step_stride: int = key(1, "run the policy every Nth step; the steps between reuse the last ratios", "steps")
    pilot_steps: int = key(8, "policy steps on all groups before stratifying (0 = stratify up front)", "steps")
    only_group: int = key(-1, "simulate this one indexer group alone, standing for every layer, with no pilot (-1 = "
                              "off): a full run's groups one at a time (bench/full_fidelity_by_group.py)", "group")


@dataclass(frozen=True)
class OutputConfig(Section):
    """What a replay writes beyond its metrics."""

    trace_event_steps: int = key(20, "decode steps recorded in --trace-events (keeps files small)", "steps")


for _name, _cls in (("spec", SpecConfig), ("workload", WorkloadConfig), ("memory", MemoryConfig),
                    ("fidelity", FidelityConfig), ("output", OutputConfig)):
    register_section(_name, _cls)
