"""CacheConfig: the frozen configuration of one UlaCache (one layer group), validated on construction."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODES = ("dp", "tp")
DEFAULT_ROW_BYTES = 656  # FP8 MLA KV of one token in one layer (docs/architecture.md)
MAX_SLOTS = 2**40  # any size or count: a trillion token slots; beyond it int64 address arithmetic can overflow
MAX_PAYLOAD_ROW_BYTES = 1 << 20  # stored bytes per token (all payload layers): 20x a whole GLM-5 token's KV


@dataclass(frozen=True)
class CacheConfig:
    """Sizes are token slots of one layer group, per rank. See docs/architecture.md (Interfaces) and docs/config.md.

    mode: "dp" (rank-local address spaces) or "tp" (homes spread over the ranks, per-rank local buffers).
    cpu_slots: 0 = no CPU tier. payload_bytes: 0 = no bytes stored (policy only); payload_layers: layers of the
    indexer group whose bytes are stored (commit moves layer 0, `replay(plan)` moves the others).
    num_recent_buckets: PB-LRU recent buckets between the current and the cold bucket (an epoch ends after a
        (K + 1)-th of the GPU slots was inserted: policies/pblru.py).
    device_buffer_slots: HiSparse per-request LRU buffer (the newest token has one more slot).
    local_buffer_slots: TP per-rank buffer of selected-KV copies; 0 = gpu_slots.
    row_bytes: bytes of one row on a link in the statistics; 0 = payload_bytes if set, else 656.
    dense_map_bytes: TP local buffers' address -> slot maps stay one dense table up to this many bytes (all ranks;
        pages are touched only where addresses are mapped); 0 = the library's rule (slot_map.dense_rule: at most
        1 GiB and 4x full hash maps). Speed for memory: the same plans either way.
    seed: kept for reproducible callers; every policy here is deterministic and uses no randomness.
    """

    mode: str = "dp"
    num_ranks: int = 1
    gpu_slots: int = 4096
    cpu_slots: int = 0
    policy: str = "pb-lru"
    backend: str = "numpy"
    payload_bytes: int = 0
    payload_layers: int = 1
    num_recent_buckets: int = 32
    device_buffer_slots: int = 4096
    local_buffer_slots: int = 0
    row_bytes: int = 0
    dense_map_bytes: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        from .backends import BACKENDS
        from .policies import POLICIES

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"CacheConfig.{f.name} must be an integer, got {value!r}")
            if f.type in ("str", str) and not isinstance(value, str):
                raise ValueError(f"CacheConfig.{f.name} must be a string, got {value!r}")
        if self.mode not in MODES:
            raise ValueError(f"CacheConfig.mode must be one of {list(MODES)}, got {self.mode!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"CacheConfig.policy must be one of {sorted(POLICIES)}, got {self.policy!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"CacheConfig.backend must be one of {sorted(BACKENDS)}, got {self.backend!r}")
        positive = ("num_ranks", "gpu_slots", "payload_layers", "num_recent_buckets", "device_buffer_slots")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"CacheConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("cpu_slots", "payload_bytes", "local_buffer_slots", "row_bytes", "dense_map_bytes", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"CacheConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.num_ranks > 1024:
            raise ValueError(f"CacheConfig.num_ranks must be <= 1024, got {self.num_ranks}")
        for f in dataclasses.fields(self):  # sizes past int64 arithmetic: a ValueError, not an OverflowError later
            if f.type in ("int", int) and f.name != "seed" and getattr(self, f.name) > MAX_SLOTS:
                raise ValueError(f"CacheConfig.{f.name} must be <= 2^40, got {getattr(self, f.name)}")
        if self.payload_bytes * self.payload_layers > MAX_PAYLOAD_ROW_BYTES:
            raise ValueError(f"CacheConfig.payload_bytes x payload_layers must be <= {MAX_PAYLOAD_ROW_BYTES:,} bytes "
                             f"per token (GLM-5's 78 layers x 656 B are 51 KB), got {self.payload_bytes:,} x "
                             f"{self.payload_layers:,}")
        POLICIES[self.policy].check_config(self)  # what the policy needs of the sizes (hisparse: a CPU copy)

    @property
    def effective_row_bytes(self) -> int:
        """Bytes per row used for link statistics."""
        return self.row_bytes or self.payload_bytes or DEFAULT_ROW_BYTES

    @property
    def effective_local_buffer_slots(self) -> int:
        return self.local_buffer_slots or self.gpu_slots

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> CacheConfig:
        """Build from a mapping; unknown keys are rejected with a one-line error naming the key."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a mapping of CacheConfig keys, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in names:
                raise ValueError(f"{source}: unknown CacheConfig key {key!r} (known: {', '.join(sorted(names))})")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> CacheConfig:
        import yaml

        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
        return cls.from_dict(data, source=str(path))


__all__ = ["CacheConfig", "DEFAULT_ROW_BYTES", "MODES"]
