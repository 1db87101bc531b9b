"""The array-backend protocol: the data-parallel primitives of the sparse-access pipeline.

The cache facade (numpy) orchestrates an access batch and calls these primitives for every step that is data-parallel
over references or slots. A backend receives arrays converted with `asarray` and returns arrays the facade converts back
with `to_numpy` (for the numpy backend both are the identity, so nothing is copied). Primitives that update state may
do so in place and ALWAYS return the updated array; callers use the return value, so a device backend may work on a
device copy and hand it back.

Every primitive is deterministic and its output order is fully specified (see README.md in this folder), so the cupy
and torch backends can match the numpy reference bit for bit. Conventions shared by all primitives:

- addresses, places and slots are int64 (the facade's place table is int32 when every place fits, so `places` given
  to `hit_mask` and gathered from that table may be int32); -1 means "none" (padding, no owner, not resident);
- a bitmap over N slots is a uint8 array of N/8 bytes, N a multiple of 64; slot s is bit (s & 7) of byte (s >> 3)
  (little-endian bit order), so viewed as little-endian uint64 words, word w holds slots 64w .. 64w+63 with bit i =
  slot 64w + i;
- a summary bitmap has one bit per 64-bit word of its bitmap (bit w set <=> word w != 0), stored the same way and
  padded with zero bits to a multiple of 64;
- a "segment" is one rank's range of GPU places: segment r covers places [r * seg_slots, (r + 1) * seg_slots),
  seg_slots a multiple of 64.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

Array = Any  # numpy.ndarray, cupy.ndarray or torch.Tensor, depending on the backend


@runtime_checkable
class Backend(Protocol):
    """What a backend provides. See README.md for the exact semantics and tie-breaking of every primitive."""

    name: str

    # -- conversion -------------------------------------------------------------------------------------------------
    def asarray(self, a: Any) -> Array:
        """numpy array -> this backend's array (same dtype, same values)."""

    def to_numpy(self, a: Array) -> Any:
        """this backend's array -> numpy array (same dtype, same values)."""

    # -- pipeline primitives -------------------------------------------------------------------------------------------
    def dedup(self, addrs: Array, marker: Array) -> tuple[Array, Array]:
        """Distinct non-negative values of the 1-D int64 `addrs`, ascending. Negative values (-1 padding) are dropped.

        `marker` is a bool scratch array longer than max(addrs), all False on entry; it is all False again on return
        (returned as the second item). Output dtype int64."""

    def gather(self, table: Array, idx: Array) -> Array:
        """table[idx] (translate logical -> physical, local-buffer lookup, owner lookup). idx int64, all valid."""

    def scatter(self, table: Array, idx: Array, values: Array) -> Array:
        """table[idx] = values, idx distinct; returns table."""

    def hit_mask(self, places: Array, num_gpu_places: int) -> Array:
        """Bool mask: 0 <= places < num_gpu_places (the entry is GPU-resident)."""

    def bucket_of(self, stamps: Array, slots: Array, now: int, num_recent: int) -> Array:
        """Recency bucket of each slot, int32: age = now - stamps[slots]; 0 if age <= 0 (current), age if
        1 <= age <= num_recent (recent_age), num_recent + 1 if older (cold)."""

    def bitmap_set(self, bitmap: Array, slots: Array) -> Array:
        """Set the bits of `slots` (distinct; the bits are clear on entry). Returns the bitmap."""

    def bitmap_clear(self, bitmap: Array, slots: Array) -> Array:
        """Clear the bits of `slots` (distinct; the bits are set on entry). Returns the bitmap."""

    def summary(self, bitmap: Array) -> Array:
        """The summary bitmap of `bitmap`: bit w set <=> 64-bit word w is non-zero."""

    def select_first(self, bitmap: Array, summary: Array, seg_slots: int, counts: Array) -> tuple[Array, Array]:
        """For each segment r (in order r = 0, 1, ...), the min(counts[r], set bits in segment r) lowest set slots of
        the segment, ascending. Returns (slots int64 concatenated segment by segment, found int64[num_segments]).
        Candidate words are found through `summary` (only words whose summary bit is set are examined)."""

    def lru_select(self, stamps: Array, eligible: Array, seg_slots: int, counts: Array) -> tuple[Array, Array]:
        """For each segment r, the min(counts[r], eligible slots in r) eligible slots with the smallest
        (stamps[slot], slot) pairs, ordered by (stamp, slot) ascending. Returns (slots, found) as select_first."""

    def gather_rows(self, pool: Array, idx: Array) -> Array:
        """pool[idx] for a 2-D uint8 pool (rows of payload bytes): a copy of shape (len(idx), row_bytes)."""

    def scatter_rows(self, pool: Array, idx: Array, rows: Array) -> Array:
        """pool[idx] = rows, idx distinct; returns the pool."""


__all__ = ["Array", "Backend"]
