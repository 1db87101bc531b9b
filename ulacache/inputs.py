"""Checks of the caller's arguments, shared by the facade and its modules: bad input raises ValueError naming the
argument, before anything changes."""
from __future__ import annotations

import numpy as np


def int_array(values, what: str) -> np.ndarray:
    """`values` as int64 (any integer dtype that fits); ValueError for floats, bools-as-objects or huge uint64."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be an integer array, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{what} has values beyond int64")
    return arr.astype(np.int64, copy=False)


def int_scalar(value, what: str) -> int:
    """A Python or numpy integer (not a bool) as int."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return int(value)


def check_rank(rank, num_ranks: int, what: str = "rank") -> int:
    """A rank in [0, num_ranks) as int."""
    r = int_scalar(rank, what)
    if not 0 <= r < num_ranks:
        raise ValueError(f"{what} {r} out of range: num_ranks is {num_ranks}")
    return r


def alloc_args(request_ids, counts, ranks, num_ranks: int) -> tuple[list, np.ndarray, np.ndarray]:
    """`alloc_many`'s arguments checked: (request ids as a list, int64 counts, int64 ranks; default rank 0)."""
    ids = int_array(request_ids, "request_ids").ravel()
    counts = int_array(counts, "counts").ravel()
    ranks = np.zeros(ids.size, np.int64) if ranks is None else int_array(ranks, "ranks").ravel()
    if not (ids.size == counts.size == ranks.size):
        raise ValueError(f"request_ids, counts and ranks differ in length ({ids.size}, {counts.size}, {ranks.size})")
    if counts.size:  # one request (a decode step's growth) read as scalars: no array reductions
        c_min, r_min, r_max = ((int(counts[0]), int(ranks[0]), int(ranks[0])) if counts.size == 1 else
                               (int(counts.min()), int(ranks.min()), int(ranks.max())))
        if c_min < 0:
            raise ValueError(f"counts holds {c_min}: token counts are >= 0")
        if r_min < 0 or r_max >= num_ranks:
            raise ValueError(f"ranks must be in [0, {num_ranks}), got {r_min}..{r_max}")
    if ids.size > 1 and np.unique(ids).size != ids.size:
        raise ValueError("request_ids holds a request twice; allocate its tokens in one entry")
    return ids.tolist(), counts, ranks


def check_home(space, request_id: int, rank: int) -> None:
    """DP: a request's tokens live on one rank; ValueError when an allocation names another."""
    req = space.requests.get(request_id)
    if req is not None and req.rank != rank:
        raise ValueError(f"request {request_id} lives on rank {req.rank}, not rank {rank}")


__all__ = ["alloc_args", "check_home", "check_rank", "int_array", "int_scalar"]
