"""UlaCache: the facade (allocation, sparse access -> plan -> commit, locate, payloads, stats).

A thin face over one policy, which owns its pools and the address space. The facade checks input (bad input raises
ValueError and changes nothing), runs the access pipeline (dedup -> translate: translate.AddressIndex; policy: hits,
recency, replacement, exchange plan; TP local buffers) and keeps the one-pending-plan rule: between `access` and
`commit` the mapping is unchanged, so `locate` and `read` return the old, valid places, and allocation, free, write
and another access are refused. Payload bytes live in payload_io.PayloadIO, read-only views and statistics in
inspection.
"""
from __future__ import annotations

import functools

import numpy as np

from . import inspection
from .backends import get_backend
from .config import CacheConfig
from .inputs import alloc_args, check_home, int_scalar
from .layout import DeviceState, PlaceLayout, plan_exchanges
from .local_buffer import LocalBuffers
from .payload_io import PayloadIO
from .plan import Plan
from .policies import POLICIES
from .translate import AddressIndex


class UlaCache:
    """One layer group's KV cache over GPU and CPU pools (see the module docstring and `ulacache.__init__`)."""

    def __init__(self, config: CacheConfig):
        if not isinstance(config, CacheConfig):
            raise ValueError(f"UlaCache needs a CacheConfig, got {type(config).__name__}")
        self.config = cfg = config
        self.be = get_backend(cfg.backend)
        self.policy = POLICIES[cfg.policy](cfg, self.be)
        self.space = self.policy.space
        self.tp = cfg.mode == "tp"
        self.buffers = None
        num_places = self.policy.num_places
        if self.tp and self.policy.exclusive:
            self.buffers = LocalBuffers(self.be, cfg.num_ranks, cfg.effective_local_buffer_slots, self.space,
                                        base_place=num_places, dense_map_bytes=cfg.dense_map_bytes)
            num_places += self.buffers.num_places
        self.index = AddressIndex(self.space, self.be, cfg.num_ranks)
        self.payload = PayloadIO(cfg, self.be, self.policy, self.buffers, self.index, num_places)
        self.counters = inspection.Counters(cfg.effective_row_bytes)
        self._pending: Plan | None = None
        self._last: Plan | None = None
        self._version = 0
        self._no_peer_rows = np.zeros(cfg.num_ranks, dtype=np.int64)  # every plan's peer rows without TP buffers
        self._no_peer_rows.setflags(write=False)
        self._exchanges = functools.partial(plan_exchanges, self.policy, self.buffers)  # Plan.exchanges builds

    def _idle(self, what: str) -> None:
        """ValueError while a plan is pending (`what`: the refused operation)."""
        if self._pending is not None:
            raise ValueError(f"cannot {what} while a plan is pending; commit it first")

    # -- allocation ----------------------------------------------------------------------------------------------------
    def alloc(self, request_id: int, num_tokens: int, rank: int = 0) -> np.ndarray:
        """int64 logical addresses of `num_tokens` new tokens of the request (prefill or decode). Valid integer
        scalars go straight to the policy's one-request path (a decode step: no per-argument arrays); anything else
        through `alloc_many`, which checks and refuses it by name."""
        if not (type(request_id) is int and type(num_tokens) is int and type(rank) is int  # noqa: E721
                and 0 <= num_tokens < 2**62 and 0 <= rank < self.config.num_ranks):
            return self.alloc_many([request_id], [num_tokens], [rank])
        self._idle("allocate")
        if not self.tp:
            check_home(self.space, request_id, rank)
        addrs = self.policy.alloc_one(request_id, num_tokens, rank, self.tp)
        self.payload.copy_alloc_moves()
        return addrs

    def alloc_many(self, request_ids, counts, ranks=None) -> np.ndarray:
        """Allocate counts[i] tokens for request_ids[i] (on ranks[i] in DP; default 0; in TP the homes are spread over
        the ranks by free space and `ranks` is ignored); addresses concatenated in request order. New tokens go to
        the GPU pool while it has free slots (pb-lru, lru). All or nothing: CapacityError (nothing changed)."""
        self._idle("allocate")
        id_list, counts, ranks = alloc_args(request_ids, counts, ranks, self.config.num_ranks)
        if not self.tp:
            for rid, r in zip(id_list, ranks.tolist()):  # loop over requests (dict look-ups)
                check_home(self.space, rid, r)
        addrs = self.policy.alloc_many(id_list, counts, ranks, self.tp)
        self.payload.copy_alloc_moves()
        return addrs

    def free(self, request_id: int) -> None:
        """Release every token of the request (its addresses may be reused later)."""
        self._idle("free")
        rid = int_scalar(request_id, "request_id")
        if rid not in self.space.requests:
            raise ValueError(f"unknown request {rid}: not allocated or already freed")
        if self.buffers is not None:
            self.buffers.invalidate(self.space.requests[rid].addresses())
        self.policy.free(rid)

    # -- access pipeline -----------------------------------------------------------------------------------------------
    def access(self, selected, rank: int | None = None) -> Plan:
        """Plan one access batch: int64 logical addresses of any shape, -1 = padding. In DP, `rank` (optional)
        asserts the batch belongs to that rank; in TP every rank executes the batch and `rank` must be None."""
        self._idle("start another access")
        if self.payload.store is not None:
            self.payload.check_replayed(self._last)
        uniq, ix, places, num_refs, bounds, rank = self.index.translate(selected, rank, self.tp)
        self.space.remember(uniq, ix, bounds)  # (the policy and the TP local buffers locate and cut the batch
        # again; forgotten at commit)
        if rank is not None:
            self.index.check_batch_rank(uniq, rank)
        plan = Plan(version=self._version, now=self.policy.step + 1, addrs=uniq, num_refs=num_refs,
                    num_unique=int(uniq.size))
        if self.buffers is not None:
            self.buffers.check_fits(uniq)  # before the policy takes any slot: a refused batch changes nothing
        self.policy.access(plan, places, ix)
        if self.buffers is not None:
            self.buffers.plan(plan, places)
        else:
            plan.peer_rows_per_rank = self._no_peer_rows
        plan._exchanges = self._exchanges  # called with the plan (no plan -> plan reference cycle)
        self._pending = plan
        return plan

    def commit(self, plan: Plan) -> None:
        """Complete the plan's transfers (payload bytes of layer 0), then update the mappings."""
        if not isinstance(plan, Plan):
            raise ValueError(f"commit needs a Plan, got {type(plan).__name__}")
        if plan is not self._pending:
            raise ValueError("this plan is not the pending one (already committed, or planned on an older state)")
        self.payload.move(plan, 0)
        self.policy.commit(plan)
        if self.buffers is not None:
            self.buffers.commit(plan)
        self.space.forget()
        plan.committed = True
        plan.layers_done = {0}
        self._pending, self._last = None, plan
        self._version += 1
        self.counters.commit(plan)

    def replay(self, plan: Plan, layer: int | None = None) -> None:
        """Re-apply the transfers of the last committed plan for another layer of its indexer group (IndexShare).
        In payload mode this moves `layer`'s bytes (default: the next layer not yet moved)."""
        if not isinstance(plan, Plan):
            raise ValueError(f"replay needs a Plan, got {type(plan).__name__}")
        if plan is not self._last or not plan.committed:
            raise ValueError("replay needs the most recently committed plan")
        self.payload.replay(plan, layer)
        self.counters.replay(plan)

    # -- payloads (payload_io) -----------------------------------------------------------------------------------------
    def read(self, addrs, layer: int = 0) -> np.ndarray:
        """uint8 (len(addrs), payload_bytes): the bytes at each address's current (valid) place."""
        return self.payload.read(addrs, layer)

    def write(self, addrs, payload, layer: int = 0) -> None:
        """Store bytes for addresses (and refresh every cached copy of them)."""
        self._idle("write")
        self.payload.write(addrs, payload, layer)

    def read_local(self, addrs, rank: int, layer: int = 0) -> np.ndarray:
        """TP: the bytes rank `rank` computes with (its own pool's entry, else its local-buffer copy)."""
        return self.payload.read_local(addrs, rank, layer)

    # -- queries (inspection) ------------------------------------------------------------------------------------------
    def locate(self, addrs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tier int8: 0 GPU / 1 CPU, rank, slot) of each address's current place (hisparse: its CPU entry)."""
        return inspection.locate(self, addrs)

    def places(self, addrs) -> np.ndarray:
        """Current unified place (int64, see `layout()`) of each allocated address, same shape."""
        return inspection.places(self, addrs)

    def layout(self) -> PlaceLayout:
        """How unified places map to (tier, rank, slot): GPU pools, CPU pools, TP local buffers."""
        return inspection.layout(self)

    def device_state(self) -> DeviceState:
        """Dense read-only snapshot of the pb-lru/lru state a device twin mirrors (layout.DeviceState)."""
        self._idle("snapshot the device state")
        return inspection.device_state(self)

    def num_free_slots(self, tier: int | None = None, rank: int | None = None) -> int:
        """Free token slots: tier 0 GPU, 1 CPU, None = logical slots a new token can take. rank None = all ranks."""
        return inspection.slots(self, self.policy.free_slots(), tier, rank)

    def capacity_slots(self, tier: int | None = None, rank: int | None = None) -> int:
        """Total token slots, same conventions as num_free_slots."""
        return inspection.slots(self, self.policy.capacity(), tier, rank)

    @property
    def num_requests(self) -> int:
        return len(self.space.requests)

    def request_addresses(self, request_id: int) -> np.ndarray:
        return inspection.request_addresses(self, request_id)

    def stats(self) -> dict:
        """Cumulative counters over committed plans plus what is held now (inspection.stats)."""
        return inspection.stats(self)

    def check_invariants(self) -> None:
        """AssertionError naming the first broken invariant (inspection.check_invariants)."""
        inspection.check_invariants(self, self._last)


__all__ = ["UlaCache"]
