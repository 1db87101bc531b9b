"""Consistency checks of HiSparsePolicy's state (what `UlaCache.check_invariants` runs on a HiSparse cache): CPU
places conserved and homed, keys agree with allocations and device-buffer owners, buffers conserved, LRU orders are
permutations, every request's newest token resident in its reserved slot. Kept apart from the policy so the policy
file holds the mechanism only."""
from __future__ import annotations

import numpy as np

from ..errors import require


def check_hisparse(policy) -> None:
    """AssertionError (via `errors.require`) naming the first broken invariant of the HiSparse policy `policy`."""
    space, cfg, D = policy.space, policy.cfg, policy.D
    alloc = space.allocated()
    places = space.places(alloc).astype(np.int64)
    require(alloc.size == space.num_allocated, "allocated count drifted")
    require(np.unique(places).size == places.size, "a CPU place is claimed by two logical addresses")
    require((places >= policy.num_gpu_places).all() and (places < policy.num_places).all(), "hisparse entry not on CPU")
    require((policy.cpu.rank_of(places) == space.home(alloc)).all(), "CPU entry outside its home rank")
    ccount = np.bincount(policy.cpu.rank_of(places), minlength=policy.R)
    require((policy.cpu.num_free() + ccount == cfg.cpu_slots).all(), "CPU free count not conserved")
    key = policy.key_of.astype(np.int64)
    require(int((key >= 0).sum()) == alloc.size and (key[space.index(alloc)] >= 0).all(),
            "an address's key disagrees with its allocation")
    for req in space.requests.values():  # loop over requests (a check)
        own = key[space.index(req.addresses())] >> policy.SH
        require((own == req.index).all(), "an address's key names another request")
    s1 = np.where(key >= 0, key & policy.MASK, 0)
    require((s1 <= D + 1).all(), "a copy sits outside its request's device buffer")
    rix = np.flatnonzero(s1 > 0)
    res = space.rows.ids(rix)
    require((space.places(res) >= 0).all(), "a freed address is still resident")
    row = policy.row_of[key[rix] >> policy.SH]
    require((row >= 0).all(), "a copy of a request without a device buffer")
    require((policy.gowner[row, s1[rix] - 1] == res).all(), "device buffer owner disagrees with residency")
    require(int((policy.gowner >= 0).sum()) == res.size, "device buffer slot owned by a non-resident address")
    used = np.flatnonzero(policy.region_of >= 0)
    require(np.unique(policy.region_of[used]).size == used.size, "two requests share a device buffer")
    require((policy.row_of[used] == policy.regrows.index(policy.region_of[used])).all(), "a buffer's storage row is stale")
    lrow = np.where(policy.hist_len[used] > D + 1, policy.row_of[used], -1)
    require((policy.lrow_of[used] == lrow).all(), "a request's LRU-update flag disagrees with its history")
    all_rows = np.arange(policy.lru.shape[0], dtype=np.int64)
    require((policy.row_base == policy.region_base(policy.regrows.ids(all_rows))).all(), "a buffer's base is stale")
    nregions = sum(len(s) for s in policy.regions) + used.size
    require(nregions == policy.R * policy.regions_per_rank, "device buffers not conserved")
    srt = np.sort(policy.lru, axis=1)
    require((srt == np.arange(D)).all(), "an LRU order is not a permutation of the buffer's slots")
    used = used[policy.hist_len[used] > 0]  # a request allocated with 0 tokens has no newest token yet
    newest = policy.newest[used]
    require((policy.resident_places(newest) == policy.region_base(policy.region_of[used]) + D).all(), "newest token not resident")
