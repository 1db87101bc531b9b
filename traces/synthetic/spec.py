"""The synthetic selection generator's parameters (all of them are stored in trace.yaml), validated."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from traces.errors import TraceError

GENERATOR = "stratified-mixture-v1"
MODEL_GROUPS = {"glm-5.2": 21, "glm-5": 78, "deepseek-v3.2": 61}
MAX_HISTORY_TOKENS = 1 << 26  # strata stay < 2**16 positions long (16-bit draws)


@dataclass(frozen=True)
class SelectionSpec:
    """Parameters of the synthetic selection generator (all of them are stored in trace.yaml)."""

    num_groups: int = 21
    top_k: int = 2048
    generator: str = GENERATOR
    num_sink: int = 16
    num_recent: int = 64
    early_groups: int = 2
    early_num_sink: int = 0
    early_num_recent: int = 16
    early_overlap: float = 0.015
    deep_start_frac: float = 0.33
    deep_overlap: float = 0.44
    deep_overlap_spread: float = 0.05
    fresh_frac: float = 0.30
    min_candidates: int = 2
    max_candidates: int = 8
    drift_steps: int = 256
    band_groups: int = 4
    spec_share: float = 0.6
    calib_history_tokens: int = 98304

    @classmethod
    def from_dict(cls, data: dict | None, source: str = "selection spec") -> SelectionSpec:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise TraceError(f"{source}: unknown key '{key}' (known: {', '.join(sorted(known))})")
        try:
            spec = cls(**data)
        except TypeError as exc:
            raise TraceError(f"{source}: {exc}") from None
        spec.validate(source)
        return spec

    def to_dict(self) -> dict:
        return asdict(self)

    def validate(self, source: str = "selection spec") -> None:
        def bad(msg: str) -> TraceError:
            return TraceError(f"{source}: {msg}")

        for name in ("num_groups", "top_k", "num_sink", "num_recent", "early_groups", "early_num_sink",
                     "early_num_recent", "min_candidates", "max_candidates", "drift_steps", "band_groups",
                     "calib_history_tokens"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise bad(f"{name} must be a non-negative integer, got {v!r}")
        for name in ("early_overlap", "deep_start_frac", "deep_overlap", "deep_overlap_spread", "fresh_frac",
                     "spec_share"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= float(v) <= 1.0:
                raise bad(f"{name} must be a number in [0, 1], got {v!r}")
        if self.generator != GENERATOR:
            raise bad(f"unknown generator '{self.generator}' (known: {GENERATOR})")
        if self.num_groups < 1 or self.top_k < 1:
            raise bad("num_groups and top_k must be >= 1")
        for s, w, what in ((self.num_sink, self.num_recent, ""), (self.early_num_sink, self.early_num_recent, "early_")):
            if s + w >= self.top_k:
                raise bad(f"{what}num_sink + {what}num_recent must be < top_k ({self.top_k})")
        if not 1 <= self.min_candidates <= self.max_candidates <= 1024:
            raise bad("need 1 <= min_candidates <= max_candidates <= 1024")
        for name in ("min_candidates", "max_candidates"):
            v = getattr(self, name)
            if v & (v - 1):
                raise bad(f"{name} must be a power of two, got {v}")
        if self.drift_steps < 1 or self.drift_steps & (self.drift_steps - 1):
            raise bad(f"drift_steps must be a power of two, got {self.drift_steps}")
        if self.band_groups < 1:
            raise bad("band_groups must be >= 1")
