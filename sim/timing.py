"""One decode step on the simpy node: per rank, per indexer group, the compute stream and the copy stream.

Per group on rank r: indexer scoring (+ all-gather of candidates under the distributed indexer) and cache
management on the compute stream; then the first layer's transfers (H2D on the PCIe in-link, D2H on the out-link,
peer fetches on the NVLink in-port) gate the first layer's attention. With `prefetch` (UlaCache: one plan per group)
the other layers' transfers run on the copy stream while layer 1 computes, and layer i waits for its data; without
it (HiSparse: swap-in per layer) every layer is management + transfer + compute in series (SGLang runs the swap-in
kernel on the compute stream inside the layer; only its decode backup D2H runs on a side stream). Under TP, a row
that was on the CPU reaches a local buffer only after its promotion: that share of the peer fetches is chained
after the PCIe transfer. The group ends at a
barrier over the ranks (the layer's EP all-to-all / TP all-reduce synchronise them).
"""
from __future__ import annotations

from dataclasses import dataclass

import simpy

from sim.hardware import Barrier, Node, run_for, run_until, skip_events

PARTS = ("indexer_s", "allgather_s", "mgmt_s", "transfer_stall_s", "attention_s", "ffn_s", "collective_s",
         "draft_s", "overhead_s", "prefill_s")


def all_of(env: simpy.Environment, events: list) -> simpy.Event:
    """An event triggered once every one of `events` has been processed: simpy's `AllOf` without its value (a
    `ConditionValue` nobody here reads) or failure forwarding (these events never fail). It counts in a callback
    attached where AllOf attaches its check, and succeeds at the same moment AllOf would (when the last event is
    processed, or at once if all already were), so the event order is the same; it is only cheaper."""
    done = simpy.Event(env)
    left = len(events)

    def check(_ev):
        nonlocal left
        left -= 1
        if not left:
            done.succeed()

    for ev in events:
        if ev.callbacks is None:
            check(ev)
        else:
            ev.callbacks.append(check)
    if not events:
        done.succeed()
    return done


def _mgmt(w) -> float:
    """A group's management time on the compute stream: per group with prefetch, per layer without."""
    return w.mgmt_s if w.prefetch else w.mgmt_s * w.layers


def _arrival_floor(w, t0: float) -> float:
    """A time rank work `w` started at t0 cannot reach the barrier before: its compute alone, less a margin far
    above the rounding of `_rank`'s own sums (transfers, their latency and waits only add)."""
    floor = t0 + (w.indexer_s + w.allgather_s + _mgmt(w)) + w.layers * (w.attention_s + w.ffn_s + w.collective_s)
    return floor - 1e-9 * abs(floor)


def _write_parts(row: list, w, mgmt: float, stall: float) -> None:
    """A rank's timing parts (in PARTS order) for work `w`: its compute as given, `stall` waiting on transfers."""
    n = w.layers
    row[0], row[1], row[2] = w.indexer_s, w.allgather_s, mgmt
    row[3] = stall
    row[4], row[5], row[6] = n * w.attention_s, n * w.ffn_s, n * w.collective_s


# events a rank without transfers schedules in `_rank`, besides a timeout for its management when it has any:
# its Initialize, its layers' timeout, its end (the barrier's release is scheduled once, by the last arrival)
_QUIET_EVENTS = 3


@dataclass(frozen=True)
class GroupWork:
    """What rank r does for one indexer group (times in s; link amounts in occupancy bytes, per layer)."""

    layers: int
    indexer_s: float
    allgather_s: float
    mgmt_s: float  # per group (prefetch) or per layer (no prefetch)
    h2d_bytes: float
    d2h_bytes: float
    peer_bytes: float  # peer fetches that can start at once (rows resident in their home's GPU pool)
    attention_s: float  # per layer
    ffn_s: float
    collective_s: float
    prefetch: bool
    d2h_blocking: bool
    peer_after_h2d_bytes: float = 0.0  # peer fetches of rows promoted this step: start once the promotions are done
    # the H2D rows are moved by a copy call that pays the link's per-call latency after them (UlaCache's exchange
    # kernel: `pcie_latency_s` is its fitted intercept); False where the rows are read by a kernel whose fixed time is
    # already counted in `mgmt_s` (HiSparse's swap-in reads pinned host memory itself: no copy call, no latency)
    h2d_pays_latency: bool = True
    # per layer, the H2D occupancy of layers 2..L when their copies differ from layer 1's (HiSparse's IndexShare
    # replay kernel on the side stream); None = the same as `h2d_bytes`
    h2d_replay_bytes: float | None = None

    @classmethod
    def of(cls, layers: int, compute: dict, links: dict) -> GroupWork:
        """GroupWork(layers=layers, **compute, **links) without the frozen dataclass's per-field `__setattr__`
        calls (the engine builds several per rank and step): the same attributes, so equal and hashed alike."""
        w = object.__new__(cls)
        d = w.__dict__
        d["layers"] = layers
        d.update(compute)
        d.update(links)
        if d.keys() != _FIELDS:  # a missing (defaulted) or unknown field: the dataclass's own way
            return cls(layers=layers, **compute, **links)
        return w

    def __hash__(self) -> int:
        """The fields' hash (as the dataclass would make it), computed once per object: the timer hashes a group's
        works on every rank, and ranks share objects."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.layers, self.indexer_s, self.allgather_s, self.mgmt_s, self.h2d_bytes, self.d2h_bytes,
                      self.peer_bytes, self.attention_s, self.ffn_s, self.collective_s, self.prefetch,
                      self.d2h_blocking, self.peer_after_h2d_bytes, self.h2d_pays_latency,
                      self.h2d_replay_bytes))  # (in field order: see the test)
            object.__setattr__(self, "_hash", h)
        return h


_FIELDS = frozenset(GroupWork.__dataclass_fields__)


@dataclass(frozen=True)
class GroupOrder:
    """Which work item each indexer group (pass) of a step runs, in group order: `seq[n]` is the item of the n-th;
    `firsts` lists every item once, in order of its first group, as (item, that group's position, groups running
    it). Built once per group layout, so a step does not walk every group to find the distinct ones."""

    seq: tuple[int, ...]
    firsts: tuple[tuple[int, int, int], ...]

    @classmethod
    def of(cls, seq) -> GroupOrder:
        first: dict[int, list[int]] = {}
        for pos, item in enumerate(seq):
            if item in first:
                first[item][1] += 1
            else:
                first[item] = [pos, 1]
        return cls(tuple(seq), tuple((item, pos, n) for item, (pos, n) in first.items()))


class StepTimer:
    def __init__(self, env: simpy.Environment, node: Node, recorder=None):
        self.env, self.node, self.recorder = env, node, recorder
        self.events = 0  # simpy events processed (counted by the engine)

    def run(self, work: list[list[GroupWork]], ranks: list[int], epilogue: dict[str, float],
            dedup: bool = True, order: GroupOrder | None = None) -> tuple[float, dict]:
        """Simulate one step: work[i][j] is simulated rank ranks[i]'s item j, and group (pass) n runs item
        order.seq[n] (without `order`: item g for group g). Returns (step seconds, parts).

        Groups are separated by barriers, so a group's time depends only on its own work: with `dedup`, groups whose
        work is identical on every rank are simulated once and counted as many times as they occur."""
        env = self.env
        start = env.now
        cols = list(zip(*work))  # cols[j]: item j on every simulated rank
        if order is None:
            order = GroupOrder.of(range(len(cols)))
        heads, mult, item_of = self._heads(cols, order, dedup)
        self.node.simulate(ranks)  # each simulated rank stands for num_gpus / len(ranks) GPUs on shared host caps
        totals = dict.fromkeys(PARTS, 0.0)
        elapsed = 0.0
        tracing = self.recorder is not None and self.recorder.enabled
        zero = [0.0] * len(PARTS)
        for g in heads:
            parts = [zero[:] for _ in ranks]  # per simulated rank, its parts (Python floats: cheap scalar arithmetic)
            t0 = env.now
            last = self._group(g, cols[item_of[g]], ranks, parts, tracing)
            crit = ranks.index(last[1])  # the group's time is its last-arriving rank's
            m = mult[g]
            for name, value in zip(PARTS, parts[crit]):
                totals[name] += value * m
            elapsed += (env.now - t0) * mult[g]
        return self._epilogue(start, elapsed, epilogue, ranks, totals)

    @staticmethod
    def _heads(cols: list, order: GroupOrder, dedup: bool) -> tuple[list[int], dict[int, int], dict[int, int]]:
        """The first group of each distinct work in group order, how many groups share its work, and its item. With
        `dedup` an item's groups share its objects and equal items of other groups are found by value."""
        heads: list[int] = []
        mult: dict[int, int] = {}
        item_of: dict[int, int] = {}
        if not dedup:
            heads = list(range(len(order.seq)))
            return heads, dict.fromkeys(heads, 1), dict(enumerate(order.seq))
        by_value: dict[tuple, int] = {}
        for item, pos, count in order.firsts:
            head = by_value.setdefault(cols[item], pos)
            if head == pos:
                heads.append(pos)
                mult[pos] = 0
                item_of[pos] = item
            mult[head] += count
        return heads, mult, item_of

    def _group(self, g: int, ws: list[GroupWork], ranks: list[int], parts: list[list[float]], tracing: bool):
        """Run group g (ranks' works `ws`) to its last barrier arrival; returns that (time, rank)."""
        env = self.env
        t0 = env.now
        last, sim_idx, computed = (None, range(len(ranks)), []) if tracing else self._quiet(ws, ranks, parts)
        if last is None:
            # the simulated ranks are computed where they can be (`_solo`), else they run on simpy
            arrivals = None if tracing else self._solo(sim_idx, ranks, ws, parts)
            if arrivals is not None:
                return max(arrivals + computed)
            barrier = Barrier(env, len(sim_idx))
            procs = [env.process(self._rank(i, ranks[i], g, ws[i], barrier, parts)) for i in sim_idx]
            env.run(until=all_of(env, procs))
            return max(barrier.arrivals + computed)
        if last[0] > t0:
            run_until(env, last[0])
        return last

    def _epilogue(self, start: float, elapsed: float, epilogue: dict[str, float], ranks: list[int],
                  totals: dict) -> tuple[float, dict]:
        """The step's epilogue (draft passes, overhead) after its groups; the clock moved to the step's modelled
        end (deduplicated groups are counted, not re-simulated). Returns (step seconds, parts)."""
        env = self.env
        tail = sum(epilogue.values())
        if tail > 0:
            t0 = env.now
            run_for(env, tail)
            if self.recorder is not None and self.recorder.enabled:
                for r in ranks:
                    self.recorder.span(f"gpu{r} compute", "draft+sample", t0, env.now)
        for name, value in epilogue.items():
            totals[name] += value
        skipped = elapsed - (env.now - start - tail)
        if skipped > 1e-15 and env.now + skipped > env.now:  # a sliver below the clock's resolution is no time
            run_until(env, env.now + skipped)
        return elapsed + tail, totals

    @staticmethod
    def _quiet_arrival(w: GroupWork, t0: float, row: list) -> float | None:
        """When rank work `w` moves no bytes, its barrier arrival as `_rank` steps the clock from t0 (the same float
        operations: it is only timeouts), with its parts written to `row`; None when it has transfers."""
        if (w.h2d_bytes > 0 or w.peer_bytes > 0 or w.peer_after_h2d_bytes > 0 or w.d2h_bytes > 0
                or (w.h2d_replay_bytes or 0.0) > 0):
            return None
        n = w.layers
        mgmt = _mgmt(w)
        pre = w.indexer_s + w.allgather_s + mgmt
        now = t0 + pre if pre > 0 else t0
        layer_c = w.attention_s + w.ffn_s + w.collective_s
        stall, t2 = now - now + 0.0, now + 0.0
        now = now + (0.0 + n * layer_c)
        extra = max(0.0, (now - t2) - n * layer_c)
        _write_parts(row, w, mgmt, stall + extra)
        return now

    def _quiet(self, ws: list[GroupWork], ranks: list[int], parts: list[list[float]]):
        """Which ranks of a group need simpy. Ranks without transfers are only timeouts and interact with nothing
        but the barrier: their arrivals are computed (`_quiet_arrival`), and only the last of them is simulated
        (it may be the group's last arrival, and simpy must reach that moment exactly) -- unless every busy rank
        surely arrives later (`_arrival_floor`): then none is. Returns (the group's last arrival, ranks to
        simulate, computed arrivals): last is None when simulation is needed; with no transfers anywhere on an idle
        node nothing is, if simpy's clock can land on the last arrival exactly."""
        t0 = self.env.now
        quiet, busy = [], []
        done: dict[int, tuple] = {}  # ranks sharing one work object arrive alike
        for i, (w, r) in enumerate(zip(ws, ranks)):
            prev = done.get(id(w))
            if prev is None:
                at = self._quiet_arrival(w, t0, parts[i])
                done[id(w)] = (at, i)
            else:
                at = prev[0]
                if at is not None:
                    parts[i][:] = parts[prev[1]]
            if at is None:
                busy.append(i)
            else:
                quiet.append((at, r, i))
        if not quiet:
            return None, busy, []
        slowest = max(quiet)
        if not busy and self.node.idle() and (slowest[0] == t0 or t0 + (slowest[0] - t0) == slowest[0]):
            return slowest[:2], [], []
        if busy and slowest[0] < min(_arrival_floor(ws[i], t0) for i in busy):
            # no quiet rank can be the last: its process would only add its own events, which it never shared
            # with the others (it touches nothing but the barrier, before the last arrival)
            w = ws[slowest[2]]
            skip_events(self.env, _QUIET_EVENTS + (w.indexer_s + w.allgather_s + _mgmt(w) > 0))
            return None, busy, [(at, r) for at, r, i in quiet]
        return None, sorted(busy + [slowest[2]]), [(at, r) for at, r, i in quiet if i != slowest[2]]

    def _solo(self, sim_idx, ranks: list[int], ws: list[GroupWork], parts: list[list[float]]) -> list | None:
        """The simulated ranks of a group without simpy, when each starts its transfers at one instant (no prefetch
        after the first layer, no chained fetch) on an idle node and every transfer ends before the group does:
        `_rank`'s float operations, the fabric's by `Node.solo` (ranks only meet on the fabric and at the barrier);
        the clock is moved to the last arrival and the events the processes would have scheduled are counted.
        Returns the barrier arrivals [(time, rank)], or None (nothing changed) where this does not apply."""
        node, t0 = self.node, self.env.now
        batches, rows = [], []
        events = 2  # the barrier's release and the group's all_of
        for i in sim_idx:
            w, r = ws[i], ranks[i]
            if (w.prefetch and w.layers > 1) or w.peer_after_h2d_bytes > 0:
                return None
            n = w.layers
            mgmt = _mgmt(w)
            pre = w.indexer_s + w.allgather_s + mgmt
            now = t0 + pre if pre > 0 else t0
            if pre > 0 and not now > t0:
                return None  # a timeout below the clock's resolution: ordered after every process's start
            layer_c = w.attention_s + w.ffn_s + w.collective_s
            transfers, gating, lat = self._solo_transfers(w, r, 1 if w.prefetch else n)
            # its Initialize, the management timeout, an all_of over several gating transfers, its layers' timeout,
            # its end
            events += 3 + (pre > 0) + (len(gating) > 1)
            rows.append((i, w, n, mgmt, layer_c, lat, gating, len(batches) if transfers else None, now))
            if transfers:
                batches.append((now, transfers))
        if not batches:
            return None
        order = sorted(range(len(batches)), key=lambda b: batches[b][0])  # stable: equal times in process order
        timed = node.solo([batches[b] for b in order])
        if timed is None:
            return None
        finish = [None] * len(batches)
        for pos, b in enumerate(order):
            finish[b] = timed[0][pos]
        events += timed[1]
        done = max(max(f) for f in finish)
        arrivals = [(self._solo_arrival(row, finish, t0, parts), ranks[row[0]]) for row in rows]
        end = max(arrivals)[0]
        # the fabric must be idle when the group ends, and simpy's clock must land on its end exactly
        if done >= end or not end > t0 or not t0 + (end - t0) == end:
            return None
        node.count(batches)
        skip_events(self.env, events - 1)  # less the one `run(until=end)` schedules itself
        run_until(self.env, end)
        return arrivals

    def _solo_transfers(self, w: GroupWork, r: int, first: int) -> tuple[list, list, float]:
        """`_solo`'s transfers of rank r's first `first` layers: [(link, bytes)], the indices of those the layers
        wait for, and the latency paid after them (the largest of theirs; none for a kernel reading host memory)."""
        node = self.node
        transfers, gating, lat = [], [], 0.0
        if w.h2d_bytes > 0:
            gating.append(len(transfers))
            transfers.append((node.h2d[r], w.h2d_bytes * first))
            if w.h2d_pays_latency:
                lat = max(lat, node.h2d[r].latency)
        if w.peer_bytes > 0:
            gating.append(len(transfers))
            transfers.append((node.nvlink[r], w.peer_bytes * first))
            lat = max(lat, node.nvlink[r].latency)
        if w.d2h_bytes > 0:
            if w.d2h_blocking:
                gating.append(len(transfers))
                lat = max(lat, node.d2h[r].latency)
            transfers.append((node.d2h[r], w.d2h_bytes * first))
        return transfers, gating, lat

    def _solo_arrival(self, row: tuple, finish: list, t0: float, parts: list[list[float]]) -> float:
        """A rank's barrier arrival in `_solo` from its row (rank index, work, layers, management, layer compute,
        latency, gating transfers, batch, transfers' start) and the batches' finish times; its parts written."""
        i, w, n, mgmt, layer_c, lat, gating, b, t1 = row
        if b is None:  # a rank without transfers: only timeouts
            return self._quiet_arrival(w, t0, parts[i])
        t_gate = max(finish[b][k] for k in gating) if gating else t1
        stall = t_gate - t1 + lat
        t2 = t_gate + lat
        end = t_gate + (lat + n * layer_c)
        extra = max(0.0, (end - t2) - n * layer_c)
        _write_parts(parts[i], w, mgmt, stall + extra)
        return end

    def _chain(self, r: int, after, nbytes: float, label: str):
        """A peer fetch that starts when `after` (the promotions into the home pools) completes: a CPU-resident
        row reaches a rank's local buffer over NVLink only once its home has copied it in over PCIe. The home's
        promotions are timed on this rank's own PCIe link (TP spreads homes evenly, so every rank promotes alike).

        With `after`, callbacks instead of a process: the fetch starts in `after`'s callback and the returned event
        is triggered in the fetch's, at the very moments a process would resume and end (no Initialize event)."""
        if after is None:
            def proc():
                yield self.node.nvlink[r].transfer(nbytes, label)
            return self.env.process(proc())
        done = self.env.event()
        link = self.node.nvlink[r]

        def go(_ev):
            fetched = link.transfer(nbytes, label)
            fetched.callbacks.append(lambda _e: done.succeed())

        after.callbacks.append(go)
        self.node.followed(after)
        return done

    def _rank(self, i: int, r: int, g: int, w: GroupWork, barrier: Barrier, parts: list[list[float]]):
        """Rank r's part of group g. Per-transfer latency is paid once after the gating transfers (it is not link
        occupancy); concurrent transfers on one link share its bandwidth (processor sharing)."""
        env = self.env
        t0 = env.now
        n = w.layers
        mgmt = _mgmt(w)  # HiSparse's swap-in kernel runs per layer (with drafts) or per group's anchor
        pre = w.indexer_s + w.allgather_s + mgmt
        if pre > 0:
            yield env.timeout(pre)
        layer_c = w.attention_s + w.ffn_s + w.collective_s
        flows, lat = self._start_first(r, g, w)
        t1 = env.now
        if flows:
            yield all_of(env, flows) if len(flows) > 1 else flows[0]
        stall = env.now - t1 + lat
        t2 = env.now + lat
        rest = self._start_rest(r, g, w) if w.prefetch and n > 1 else []
        if rest:  # layer 1, then layers 2..n-1 overlapping the prefetch, then layer n once its data is in
            yield env.timeout(lat + layer_c)
            wait = [env.timeout((n - 2) * layer_c)] if n > 2 else []
            yield all_of(env, wait + rest)
            yield env.timeout(layer_c)
        else:
            yield env.timeout(lat + n * layer_c)
        extra = max(0.0, (env.now - t2) - n * layer_c)
        rec = self.recorder
        if rec is not None and rec.enabled:
            track, a = f"gpu{r} compute", t0 + w.indexer_s
            rec.span(track, f"indexer g{g}", t0, a)
            rec.span(track, f"allgather g{g}", a, a + w.allgather_s)
            rec.span(track, f"{'mgmt' if w.prefetch else 'swap-in mgmt'} g{g}", a + w.allgather_s, t1)
            rec.span(track, f"layers g{g} (x{n})", t2, env.now, {"transfer_stall_s": stall + extra})
        _write_parts(parts[i], w, mgmt, stall + extra)
        yield barrier.arrive(r)

    def _start_first(self, r: int, g: int, w: GroupWork) -> tuple[list, float]:
        """Start rank r's transfers of the layers its first layer waits for (all with no prefetch): the events it
        waits on and the latency paid after them (the largest of theirs; a chained fetch pays the promotion's and
        its own in sequence)."""
        node = self.node
        first = 1 if w.prefetch else w.layers
        flows, lat = [], 0.0
        h2d_ev = None
        node.hold()
        if w.h2d_bytes > 0:
            h2d_ev = node.h2d[r].transfer(w.h2d_bytes * first, f"h2d g{g}")
            flows.append(h2d_ev)
            if w.h2d_pays_latency:
                lat = max(lat, node.h2d[r].latency)
        if w.peer_bytes > 0:
            flows.append(node.nvlink[r].transfer(w.peer_bytes * first, f"peer g{g}"))
            lat = max(lat, node.nvlink[r].latency)
        if w.peer_after_h2d_bytes > 0:
            flows.append(self._chain(r, h2d_ev, w.peer_after_h2d_bytes * first, f"peer after h2d g{g}"))
            lat = max(lat, node.h2d[r].latency + node.nvlink[r].latency + node.peer_after_exchange_s)
        if w.d2h_bytes > 0:
            ev = node.d2h[r].transfer(w.d2h_bytes * first, f"d2h g{g}")
            if w.d2h_blocking:
                flows.append(ev)
                lat = max(lat, node.d2h[r].latency)
        node.release()
        return flows, lat

    def _start_rest(self, r: int, g: int, w: GroupWork) -> list:
        """Start the prefetch of rank r's layers 2..n on the copy stream (HiSparse's replay on its side stream):
        the events the last layer waits for."""
        node, n = self.node, w.layers
        rest = []
        h2d_ev = None
        node.hold()
        rest_h2d = w.h2d_bytes if w.h2d_replay_bytes is None else w.h2d_replay_bytes
        if rest_h2d > 0:
            h2d_ev = node.h2d[r].transfer(rest_h2d * (n - 1), f"h2d prefetch g{g}")
            rest.append(h2d_ev)
        if w.peer_bytes > 0:
            rest.append(node.nvlink[r].transfer(w.peer_bytes * (n - 1), f"peer prefetch g{g}"))
        if w.peer_after_h2d_bytes > 0:
            rest.append(self._chain(r, h2d_ev, w.peer_after_h2d_bytes * (n - 1), f"peer after h2d prefetch g{g}"))
        if w.d2h_bytes > 0:
            ev = node.d2h[r].transfer(w.d2h_bytes * (n - 1), f"d2h prefetch g{g}")
            if w.d2h_blocking:
                rest.append(ev)
        node.release()
        return rest
