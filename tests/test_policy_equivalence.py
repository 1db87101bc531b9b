"""Equivalence pin (issue 10 item 5): the library's counts, statistics and placements on small deterministic programs
must stay exactly what the library produced before the scale refactor (recorded on main at 85e086c, frozen below).

Each program admits requests, decodes a token per request per step, selects with locality (half of each request's
candidates carried over per step, several query tokens), frees and admits requests, and records per step the plan's
counts and per-rank row arrays (or the CapacityError), then the final stats(), free counts and every live address's
(tier, rank, slot). The per-step record is pinned through a digest; the totals and final placements verbatim/digest.
A refactor that changes any hit, exchange, transfer count or chosen slot fails here."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

import ulacache.slot_map as slot_map
from ulacache import CacheConfig, CapacityError, UlaCache


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def run_program(mode: str, ranks: int, policy: str, seed: int, steps: int = 14, gpu: int = 1024,
                cpu: int = 8192, local: int = 0, by_rank: bool = False) -> dict:
    kw = dict(mode=mode, num_ranks=ranks, gpu_slots=gpu, cpu_slots=cpu, policy=policy, num_recent_buckets=3,
              local_buffer_slots=local, device_buffer_slots=200, seed=seed)
    c = UlaCache(CacheConfig(**kw))
    rng = np.random.default_rng(seed)
    q, k, cand = 3, 48, 96
    live: dict[int, list] = {}  # request id -> [rank, candidate positions]
    next_id = 0

    def admit(n_tokens: int) -> None:
        nonlocal next_id
        rank = next_id % ranks
        try:
            c.alloc(next_id, n_tokens, rank=rank)
        except CapacityError:
            record.append(["alloc-capacity", next_id])
            return
        live[next_id] = [rank, rng.choice(n_tokens, cand, replace=False)]
        next_id += 1

    record: list = []
    for _ in range(6):
        admit(int(rng.integers(300, 900)))
    for step in range(steps):
        ids = sorted(live)
        try:
            c.alloc_many(ids, [1] * len(ids), [live[i][0] for i in ids])
        except CapacityError:
            record.append(["decode-capacity", step])
        sels = {}
        for rid in ids:
            rank, cands = live[rid]
            hist = c.request_addresses(rid)
            keep = cands[: cand // 2]
            fresh = rng.integers(0, hist.size, cand - keep.size)
            cands = np.concatenate([keep, fresh])
            rng.shuffle(cands)
            live[rid][1] = cands
            pick = np.stack([rng.choice(cands, k, replace=False) for _ in range(q)])
            sels[rid] = hist[pick]
        batches = []
        if by_rank and mode == "dp":
            for r in range(ranks):
                mine = [sels[i] for i in ids if live[i][0] == r]
                if mine:
                    batches.append((np.stack(mine), r))
        else:
            sel = np.stack([sels[i] for i in ids])
            sel[0, 0, :3] = -1  # padding
            batches.append((sel, None))
        for sel, rank in batches:
            try:
                plan = c.access(sel, rank=rank)
            except CapacityError as exc:
                record.append(["access-capacity", step, str(exc)])
                continue
            rec = plan.counts()
            for name in ("h2d", "d2h", "peer"):
                rec[name + "_per_rank"] = getattr(plan, f"{name}_rows_per_rank").tolist()
            c.commit(plan)
            record.append(rec)
        if step % 4 == 3:
            gone = ids[int(rng.integers(len(ids)))]
            c.free(gone)
            live.pop(gone)
            admit(int(rng.integers(200, 700)))
        c.check_invariants()
    addrs = np.concatenate([c.request_addresses(r) for r in sorted(live)])
    tier, rank, slot = c.locate(addrs)
    return {
        "steps": _digest(record),
        "stats": c.stats(),
        "free": [c.num_free_slots(0), c.num_free_slots(1), c.num_free_slots()],
        "places": _digest([tier.tolist(), rank.tolist(), slot.tolist()]),
    }


PROGRAMS = {
    "dp1-pblru": dict(mode="dp", ranks=1, policy="pb-lru", seed=1, gpu=640),
    "dp1-lru": dict(mode="dp", ranks=1, policy="lru", seed=1, gpu=640),
    "dp1-hisparse": dict(mode="dp", ranks=1, policy="hisparse", seed=1, gpu=1608),
    "dp1-pblru-nocpu": dict(mode="dp", ranks=1, policy="pb-lru", seed=3, gpu=9000, cpu=0),
    "dp2-pblru": dict(mode="dp", ranks=2, policy="pb-lru", seed=2, gpu=512, cpu=4096),
    "dp2-lru-byrank": dict(mode="dp", ranks=2, policy="lru", seed=2, gpu=512, cpu=4096, by_rank=True),
    "dp2-hisparse": dict(mode="dp", ranks=2, policy="hisparse", seed=2, gpu=804, cpu=4096),
    "tp4-pblru": dict(mode="tp", ranks=4, policy="pb-lru", seed=4, gpu=300, cpu=1500, local=1200),
    "tp4-lru": dict(mode="tp", ranks=4, policy="lru", seed=4, gpu=300, cpu=1500, local=1200),
    "tp4-hisparse": dict(mode="tp", ranks=4, policy="hisparse", seed=4, gpu=1608),
}

# Recorded by run_program on unmodified main (85e086c), before the issue-10 refactor. dp2-pblru and tp4-pblru
# re-frozen for pb-lru's volume-aged buckets (issue 11 item 7, an intended change; the other pb-lru programs kept).
EXPECTED: dict = {'dp1-hisparse': {'free': [402, 5800, 5800],
                  'places': '7935c6326156447c',
                  'stats': {'accesses': 14,
                            'allocated_slots': 2392,
                            'cpu_rows_held': 2392,
                            'd2h_bytes': 2725680,
                            'd2h_rows': 4155,
                            'exchanges': 0,
                            'gpu_rows_held': 1206,
                            'h2d_bytes': 1364480,
                            'h2d_rows': 2080,
                            'hit_rate': 0.6762645914396888,
                            'hits': 4345,
                            'local_buffer_rows_held': 0,
                            'local_hits': 0,
                            'misses': 2080,
                            'peer_bytes': 0,
                            'peer_fetches': 0,
                            'peer_rows': 0,
                            'physical_rows_held': 3598,
                            'references': 12054,
                            'replays': 0,
                            'requests': 6,
                            'row_bytes': 656,
                            'unique_references': 6425},
                  'steps': '3e9e6c78d1d7c2c0'},
 'dp1-lru': {'free': [0, 6440, 6440],
             'places': '361e21350c70aad3',
             'stats': {'accesses': 14,
                       'allocated_slots': 2392,
                       'cpu_rows_held': 1752,
                       'd2h_bytes': 4066544,
                       'd2h_rows': 6199,
                       'exchanges': 2993,
                       'gpu_rows_held': 640,
                       'h2d_bytes': 1963408,
                       'h2d_rows': 2993,
                       'hit_rate': 0.5341634241245136,
                       'hits': 3432,
                       'local_buffer_rows_held': 0,
                       'local_hits': 0,
                       'misses': 2993,
                       'peer_bytes': 0,
                       'peer_fetches': 0,
                       'peer_rows': 0,
                       'physical_rows_held': 2392,
                       'references': 12054,
                       'replays': 0,
                       'requests': 6,
                       'row_bytes': 656,
                       'unique_references': 6425},
             'steps': '08ebb1d4afaac0dc'},
 'dp1-pblru': {'free': [0, 6440, 6440],
               'places': '361e21350c70aad3',
               'stats': {'accesses': 14,
                         'allocated_slots': 2392,
                         'cpu_rows_held': 1752,
                         'd2h_bytes': 4066544,
                         'd2h_rows': 6199,
                         'exchanges': 2993,
                         'gpu_rows_held': 640,
                         'h2d_bytes': 1963408,
                         'h2d_rows': 2993,
                         'hit_rate': 0.5341634241245136,
                         'hits': 3432,
                         'local_buffer_rows_held': 0,
                         'local_hits': 0,
                         'misses': 2993,
                         'peer_bytes': 0,
                         'peer_fetches': 0,
                         'peer_rows': 0,
                         'physical_rows_held': 2392,
                         'references': 12054,
                         'replays': 0,
                         'requests': 6,
                         'row_bytes': 656,
                         'unique_references': 6425},
               'steps': '08ebb1d4afaac0dc'},
 'dp1-pblru-nocpu': {'free': [5781, 0, 5781],
                     'places': 'b5feec2a1fe48b32',
                     'stats': {'accesses': 14,
                               'allocated_slots': 3219,
                               'cpu_rows_held': 0,
                               'd2h_bytes': 0,
                               'd2h_rows': 0,
                               'exchanges': 0,
                               'gpu_rows_held': 3219,
                               'h2d_bytes': 0,
                               'h2d_rows': 0,
                               'hit_rate': 1.0,
                               'hits': 6558,
                               'local_buffer_rows_held': 0,
                               'local_hits': 0,
                               'misses': 0,
                               'peer_bytes': 0,
                               'peer_fetches': 0,
                               'peer_rows': 0,
                               'physical_rows_held': 3219,
                               'references': 12054,
                               'replays': 0,
                               'requests': 6,
                               'row_bytes': 656,
                               'unique_references': 6558},
                     'steps': '5a8ac0e5b1ca9fcf'},
 'dp2-hisparse': {'free': [402, 5102, 5102],
                  'places': '8f465dd097dc4cbd',
                  'stats': {'accesses': 14,
                            'allocated_slots': 3090,
                            'cpu_rows_held': 3090,
                            'd2h_bytes': 3056304,
                            'd2h_rows': 4659,
                            'exchanges': 0,
                            'gpu_rows_held': 1206,
                            'h2d_bytes': 1533728,
                            'h2d_rows': 2338,
                            'hit_rate': 0.6422888616891065,
                            'hits': 4198,
                            'local_buffer_rows_held': 0,
                            'local_hits': 0,
                            'misses': 2338,
                            'peer_bytes': 0,
                            'peer_fetches': 0,
                            'peer_rows': 0,
                            'physical_rows_held': 4296,
                            'references': 12054,
                            'replays': 0,
                            'requests': 6,
                            'row_bytes': 656,
                            'unique_references': 6536},
                  'steps': 'f3b9d96a88579e1b'},
 'dp2-lru-byrank': {'free': [0, 6126, 6126],
                    'places': '698a384ea2604b2e',
                    'stats': {'accesses': 28,
                              'allocated_slots': 3090,
                              'cpu_rows_held': 2066,
                              'd2h_bytes': 3867120,
                              'd2h_rows': 5895,
                              'exchanges': 2446,
                              'gpu_rows_held': 1024,
                              'h2d_bytes': 1794816,
                              'h2d_rows': 2736,
                              'hit_rate': 0.5824813062719365,
                              'hits': 3817,
                              'local_buffer_rows_held': 0,
                              'local_hits': 0,
                              'misses': 2736,
                              'peer_bytes': 0,
                              'peer_fetches': 0,
                              'peer_rows': 0,
                              'physical_rows_held': 3090,
                              'references': 12096,
                              'replays': 0,
                              'requests': 6,
                              'row_bytes': 656,
                              'unique_references': 6553},
                    'steps': '8b1b95c0918fd040'},
 'dp2-pblru': {'free': [0, 6126, 6126],
               'places': '0d4363648354cf4c',
               'stats': {'accesses': 14,
                         'allocated_slots': 3090,
                         'cpu_rows_held': 2066,
                         'd2h_bytes': 3873680,
                         'd2h_rows': 5905,
                         'exchanges': 2454,
                         'gpu_rows_held': 1024,
                         'h2d_bytes': 1796784,
                         'h2d_rows': 2739,
                         'hit_rate': 0.58093635250918,
                         'hits': 3797,
                         'local_buffer_rows_held': 0,
                         'local_hits': 0,
                         'misses': 2739,
                         'peer_bytes': 0,
                         'peer_fetches': 0,
                         'peer_rows': 0,
                         'physical_rows_held': 3090,
                         'references': 12054,
                         'replays': 0,
                         'requests': 6,
                         'row_bytes': 656,
                         'unique_references': 6536},
               'steps': 'd0a5ce3ad52e99b9'},
 'tp4-hisparse': {'free': [402, 4668, 4668],
                  'places': '2d338d52e9dee465',
                  'stats': {'accesses': 14,
                            'allocated_slots': 3524,
                            'cpu_rows_held': 14096,
                            'd2h_bytes': 15591808,
                            'd2h_rows': 23768,
                            'exchanges': 0,
                            'gpu_rows_held': 4824,
                            'h2d_bytes': 7216000,
                            'h2d_rows': 11000,
                            'hit_rate': 0.5840266222961731,
                            'hits': 3861,
                            'local_buffer_rows_held': 0,
                            'local_hits': 0,
                            'misses': 2750,
                            'peer_bytes': 0,
                            'peer_fetches': 0,
                            'peer_rows': 0,
                            'physical_rows_held': 18920,
                            'references': 12054,
                            'replays': 0,
                            'requests': 6,
                            'row_bytes': 656,
                            'unique_references': 6611},
                  'steps': '35d8251359eeb37b'},
 'tp4-lru': {'free': [0, 3676, 3676],
             'places': 'afa1e29d8139eede',
             'stats': {'accesses': 14,
                       'allocated_slots': 3524,
                       'cpu_rows_held': 2324,
                       'd2h_bytes': 4503440,
                       'd2h_rows': 6865,
                       'exchanges': 2719,
                       'gpu_rows_held': 1200,
                       'h2d_bytes': 1783664,
                       'h2d_rows': 2719,
                       'hit_rate': 0.5887157767357435,
                       'hits': 3892,
                       'local_buffer_rows_held': 4800,
                       'local_hits': 10988,
                       'misses': 2719,
                       'peer_bytes': 5802320,
                       'peer_fetches': 8845,
                       'peer_rows': 8845,
                       'physical_rows_held': 8324,
                       'references': 12054,
                       'replays': 0,
                       'requests': 6,
                       'row_bytes': 656,
                       'unique_references': 6611},
             'steps': '86961a351f830205'},
 'tp4-pblru': {'free': [0, 3676, 3676],
               'places': 'fbf2a10cd09ef5d6',
               'stats': {'accesses': 14,
                         'allocated_slots': 3524,
                         'cpu_rows_held': 2324,
                         'd2h_bytes': 4504752,
                         'd2h_rows': 6867,
                         'exchanges': 2723,
                         'gpu_rows_held': 1200,
                         'h2d_bytes': 1786288,
                         'h2d_rows': 2723,
                         'hit_rate': 0.5881107245499925,
                         'hits': 3888,
                         'local_buffer_rows_held': 4800,
                         'local_hits': 10988,
                         'misses': 2723,
                         'peer_bytes': 5802320,
                         'peer_fetches': 8845,
                         'peer_rows': 8845,
                         'physical_rows_held': 8324,
                         'references': 12054,
                         'replays': 0,
                         'requests': 6,
                         'row_bytes': 656,
                         'unique_references': 6611},
               'steps': '7ceeff2c5fe051c8'}}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_matches_frozen_record(name):
    got = run_program(**PROGRAMS[name])
    assert got == EXPECTED[name]


@pytest.mark.parametrize("limit", [1 << 40, 0, 40_000])
def test_tp_hash_and_dense_buffer_maps_agree_with_record(monkeypatch, limit):
    """The TP local-buffer maps (dense table, hash tables, dense switched to hash as addresses grow) must not change
    any outcome."""
    monkeypatch.setattr(slot_map, "DENSE_LIMIT_BYTES", limit)
    assert run_program(**PROGRAMS["tp4-pblru"]) == EXPECTED["tp4-pblru"]


def test_dense_buffer_maps_switch_to_hash_as_addresses_grow(monkeypatch):
    monkeypatch.setattr(slot_map, "DENSE_LIMIT_BYTES", 40_000)
    c = UlaCache(CacheConfig(mode="tp", num_ranks=4, gpu_slots=300, cpu_slots=1500, local_buffer_slots=1200))
    assert isinstance(c.buffers.maps, slot_map.DenseSlotMaps)
    c.alloc(0, 6000)
    assert isinstance(c.buffers.maps, slot_map.HashSlotMaps)


@pytest.mark.parametrize("floor,mode", [(65536, "log"), (0, "log"), (65536, "auto")])
def test_lru_log_selects_what_a_scan_of_the_pool_selects(monkeypatch, floor, mode):
    """The stamp log (work follows the slots taken) gives exactly the backend's lru_select over the whole pool,
    through growth, frees, re-use within a step, protection and log rebuilds."""
    import ulacache.lru_log as lru_log
    from ulacache.backends.numpy_backend import NumpyBackend
    from ulacache.pools import Pool

    monkeypatch.setattr(lru_log, "REBUILD_FLOOR", floor)  # 0: rebuilt from the pool at nearly every touch
    be, rng = NumpyBackend(), np.random.default_rng(5)
    logged, scanned = Pool(3, 3000, exact_lru=True), Pool(3, 3000)
    logged.log = lru_log.LruLog(logged, mode)
    for step in range(60):
        want = rng.integers(0, 120, 3)
        for p in (logged, scanned):
            idx, _ = p.take_free(be, want)
            p.own[idx] = np.arange(idx.size) + 1
            p.touch(idx, step)
        occ = np.flatnonzero(scanned.own >= 0)
        prot = rng.choice(occ, min(occ.size, 40), replace=False) if occ.size else occ
        counts = rng.integers(0, 60 if step % 20 < 12 else 2000, 3)  # small and large selections (auto mode)
        a, fa = logged.lru_select(be, counts, prot)
        eligible = scanned.own >= 0
        eligible[prot] = False
        b, fb = be.lru_select(scanned.stamp, eligible, scanned.cap, counts)
        assert np.array_equal(a, b) and np.array_equal(fa, fb)
        gone = a[rng.random(a.size) < 0.3]
        for p in (logged, scanned):
            p.touch(a, step)  # the slots taken and the protected ones are re-stamped at commit
            p.touch(prot, step)
            p.give_back(be, gone)
