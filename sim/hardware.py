"""The node on simpy: GPUs (a compute stream and a copy stream each), one PCIe link per GPU per direction and one
NVLink port per GPU per direction, and (with a calibrated node model) shared host-side PCIe caps.

A `Link` is a processor-sharing server: the n transfers on a link each progress at bandwidth / n; its per-transfer
latency is added by the caller after the transfers it waits for (latency is not occupancy). Instead of a polling process the link keeps one pending
wake-up (a simpy timeout for the earliest completion) and re-plans it whenever a transfer joins or leaves, so the
event count is O(transfers), not O(time).

Node model (`hw calibrate` fits it on concurrent transfers): each GPU's PCIe links keep their own caps, and every
host<->GPU transfer of every GPU also crosses the host side, whose rate may be capped per direction
(`pcie_host_h2d_cap_bytes_s`, `pcie_host_d2h_cap_bytes_s`) and in both directions together
(`pcie_host_cap_bytes_s`); null = no cap. The host side counts the 128-B lines the rows touch (a 656-B row touches
6 lines = 768 B; a 1152-B row 9), since PCIe requests and host memory work in lines. With any cap set the node's links are routes through one `Fabric` that
shares the resources max-min fairly (progressive filling); `fluid_finish_s` is the same model without simpy (used
by the fit and by `hw validate`). simpy is imported lazily so the pure functions load on hosts without it.

Node topology (`Topology`, docs/cost-model.md "Node topology"): the host side is not one node-wide resource. GPU r sits
behind a PCIe switch (`gpus_per_switch` GPUs share its uplink) on one CPU socket; the calibrated host caps above are
per socket (the 2-GPU calibration host had both GPUs on one), and the preset's datasheet caps add each switch's
uplink and each socket's root complex (per direction, in link occupancy) and DRAM (both directions, in line bytes);
a rank's pinned host KV is on its own socket, or a share of it (`host_kv_remote_fraction`) on the others, whose
rows cross the inter-socket link (sockets loaded alike: see `pcie_route`). A cost object without a hardware
topology (the fit's link table, the tests' stand-ins) is one socket: the node-wide model as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush
from itertools import count
from types import MappingProxyType

from sim.events import TraceRecorder

HOST_CAP_KEYS = ("pcie_host_h2d_cap_bytes_s", "pcie_host_d2h_cap_bytes_s", "pcie_host_cap_bytes_s")


def _next_id(ids) -> int:
    """The next value of an `itertools.count()` (its repr is `count(N)`): how many ids it has given from 0."""
    return int(repr(ids)[6:-1])


def make_env():
    import simpy

    return simpy.Environment()


def events_scheduled(env) -> int:
    """Events scheduled so far: simpy takes one id per event from its `itertools.count()` (from 0), in C."""
    return _next_id(env._eid)


def skip_events(env, n: int) -> None:
    """Count `n` events a caller computed instead of scheduling (a rank whose process provably changes nothing):
    `simpy_events` stays the count of the per-rank simulation it stands for, and later events keep their ids."""
    env._eid = count(_next_id(env._eid) + n)


def _pop_spent_stops(env) -> None:
    """Process the stop events earlier runs left at the head of the queue, as simpy's next step would: a run that
    stops on its `until` event reschedules that event, callbacks spent, at priority -1 and the moment it stopped
    (now); processing one only sets the clock to that moment, and nothing holds it."""
    queue, now = env._queue, env._now
    while queue and queue[0][1] == -1 and queue[0][0] == now and queue[0][3].callbacks == []:
        heappop(queue)[3].callbacks = None


def run_until(env, at: float) -> None:
    """`env.run(until=at)`, in closed form when nothing else is scheduled at or before the moment simpy would stop:
    simpy would schedule its stop event, pop it first, reschedule it spent (two event ids) and set the clock to
    now + (at - now); this takes the two ids and sets the clock (no event objects). Otherwise simpy's own run."""
    at = at if isinstance(at, int) else float(at)  # (as simpy takes it)
    now = env._now
    if not at > now:
        env.run(until=at)  # (simpy's error)
        return
    _pop_spent_stops(env)
    t = now + (at - now)
    queue = env._queue
    if queue and queue[0][0] <= t:
        env.run(until=at)
        return
    next(env._eid)
    next(env._eid)
    env._now = t


def run_for(env, delay: float) -> None:
    """`env.run(until=env.timeout(delay))` (delay > 0), in closed form when nothing else is scheduled at or before
    its end: the timeout's and its spent reschedule's event ids are taken and the clock set to now + delay."""
    if not delay > 0:
        env.run(until=env.timeout(delay))
        return
    _pop_spent_stops(env)
    t = env._now + delay
    queue = env._queue
    if queue and queue[0][0] <= t:
        env.run(until=env.timeout(delay))
        return
    next(env._eid)
    next(env._eid)
    env._now = t


class Link:
    """A processor-sharing link of `bw_bytes_s` with a fixed per-transfer latency."""

    def __init__(self, env, name: str, bw_bytes_s: float, latency_s: float,
                 recorder: TraceRecorder | None = None):
        self.env, self.name, self.bw, self.latency = env, name, float(bw_bytes_s), float(latency_s)
        self.recorder = recorder
        self._active: dict[int, list] = {}  # id -> [remaining bytes, done event, start time, label, bytes]
        self._last = 0.0
        self._version = 0
        self._wake_at: float | None = None
        self._next_id = 0
        self.bytes_total = 0.0
        self.busy_s = 0.0

    def transfer(self, num_bytes: float, label: str = ""):
        """Start a transfer of `num_bytes` (occupancy bytes); the event fires when its bytes are through. The
        per-transfer `latency` is not link occupancy: the caller adds it once per batch of concurrent transfers."""
        done = self.env.event()
        if num_bytes <= 0:
            done.succeed()
            return done
        self.bytes_total += num_bytes
        entry = [float(num_bytes), done, self.env.now, label, float(num_bytes)]
        self._join(entry)
        return done

    def busy(self) -> bool:
        return bool(self._active)

    def _advance(self):
        now = self.env.now
        n = len(self._active)
        if n and now > self._last:
            share = (now - self._last) * self.bw / n
            for entry in self._active.values():
                entry[0] -= share
            self.busy_s += now - self._last
        self._last = now

    def _join(self, entry):
        self._advance()
        self._active[self._next_id] = entry
        self._next_id += 1
        self._plan_wake()

    def _plan_wake(self):
        """Make sure a wake-up is pending no later than the earliest completion. A join only delays the others'
        completions, so an already pending earlier wake-up stays valid (it re-plans when it fires)."""
        if not self._active:
            return
        n = len(self._active)
        remaining = min(e[0] for e in self._active.values())
        at = self.env.now + max(0.0, remaining * n / self.bw)
        if self._wake_at is not None and self._wake_at <= at + 1e-15:
            return
        self._wake_at = at
        self._version += 1
        version = self._version
        self.env.timeout(at - self.env.now).callbacks.append(lambda _e: self._wake(version))

    def _wake(self, version: int):
        if version != self._version:
            return  # superseded by an earlier wake-up
        self._wake_at = None
        self._advance()
        # done when what is left is float noise of the transfer's own size, or would take less than the clock's
        # resolution (float time grows with the run); an absolute byte floor would end small transfers early
        n = len(self._active)
        clock_eps = self.bw * max(1e-12, abs(self.env.now) * 1e-12) / max(n, 1)
        finished = [k for k, e in self._active.items() if e[0] <= max(e[4] * 1e-9, clock_eps)]
        for key in finished:
            entry = self._active.pop(key)
            if self.recorder is not None:
                self.recorder.span(self.name, entry[3] or "transfer", entry[2], self.env.now,
                                   {"bytes": round(entry[4])})
            entry[1].succeed()
        self._plan_wake()


class Barrier:
    """All `n` parties arrive, then everyone continues (a per-layer collective synchronises the ranks)."""

    def __init__(self, env, n: int):
        self.env, self.n = env, n
        self._count = 0
        self.event = env.event()
        self.arrivals: list[tuple[float, int]] = []

    def arrive(self, rank: int):
        self._count += 1
        self.arrivals.append((self.env.now, rank))
        if self._count == self.n:
            self.event.succeed()
        return self.event


def maxmin_rates(routes: list[dict], caps: dict) -> list[float]:
    """Max-min fair rates (progressive filling) of flows sharing capacitated resources.

    routes[f] maps resource name -> weight (resource load per unit of the flow's rate); caps maps resource name ->
    capacity (resources missing from caps are uncapped). Every flow must cross at least one capped resource.
    Each round, every resource's load sums its active flows' weights in flow order and each resource's use grows
    by step * weight flow by flow in flow order (the float operations do not depend on the bookkeeping)."""
    n = len(routes)
    rates = [0.0] * n
    crossed = set().union(*routes) if routes else set()
    names = [res for res in caps if res in crossed]  # the others never load nor fill
    cap = [caps[res] for res in names]
    slot = {res: k for k, res in enumerate(names)}
    by_res: list[list] = [[] for _ in names]  # per capped resource: [(flow, weight)] in flow order
    mine: list[list] = []  # per flow: [(resource slot, weight)] in its route's order
    for f, route in enumerate(routes):
        row = []
        for res, w in route.items():
            k = slot.get(res)
            if k is not None:
                row.append((k, w))
                by_res[k].append((f, w))
        mine.append(row)
    used = [0.0] * len(names)
    on = [True] * n
    active = list(range(n))
    while active:
        step, tight = None, None
        for k, c in enumerate(cap):
            w = sum([x for f, x in by_res[k] if on[f]])
            if w > 0:
                d = max(0.0, c - used[k]) / w
                if step is None or d < step:
                    step, tight = d, k
        if step is None:
            raise ValueError("a flow crosses no capped resource")
        for f in active:
            rates[f] += step
            for k, w in mine[f]:
                used[k] += step * w
        full = [used[k] >= c * (1 - 1e-12) for k, c in enumerate(cap)]
        full[tight] = True
        for f in active:
            if any(full[k] for k, _ in mine[f]):
                on[f] = False
        active = [f for f in active if on[f]]
    return rates


def fluid_finish_s(sizes: list[float], routes: list[dict], caps: dict) -> list[float]:
    """Finish time of each flow (all starting at 0) when they share the resources max-min fairly; a flow's size is
    in the units its rate is measured in (here: occupancy bytes of its own link)."""
    left = [float(x) for x in sizes]
    done = [0.0 if x <= 0 else None for x in left]
    now = 0.0
    while any(d is None for d in done):
        live = [f for f, d in enumerate(done) if d is None]
        rates = maxmin_rates([routes[f] for f in live], caps)
        dt = min(left[f] / r for f, r in zip(live, rates))
        now += dt
        for f, r in zip(live, rates):
            left[f] -= r * dt
            if left[f] <= sizes[f] * 1e-9:
                done[f] = now
    return done


@dataclass(frozen=True)
class Topology:
    """Where a GPU's host<->GPU traffic goes. GPU r is on socket r // gpus_per_socket (the last socket takes any
    rest) behind switch (socket, local index // gpus_per_switch); its host KV is on its own socket, `remote_fraction`
    of it spread evenly over the other sockets. Caps (None = not modelled) are datasheet figures: PCIe ones raw per
    direction (turned into link occupancy by the measured ceiling over `pcie_raw_bytes_s`), DRAM both directions
    together and the inter-socket link each way (line bytes)."""

    num_sockets: int = 1
    gpus_per_socket: int = 0  # 0: every GPU on the one socket
    gpus_per_switch: int = 1
    pcie_raw_bytes_s: float | None = None
    switch_uplink_raw_bytes_s: float | None = None
    socket_pcie_raw_bytes_s: float | None = None
    socket_mem_bw_bytes_s: float | None = None
    inter_socket_bw_bytes_s: float | None = None
    remote_fraction: float = 0.0

    def socket_of(self, rank: int) -> int:
        if self.num_sockets <= 1 or self.gpus_per_socket <= 0:
            return 0
        return min(rank // self.gpus_per_socket, self.num_sockets - 1)

    def switch_of(self, rank: int) -> tuple[int, int]:
        s = self.socket_of(rank)
        return s, (rank - s * self.gpus_per_socket) // self.gpus_per_switch

    def host_key(self, key: str, socket: int) -> str:
        """The resource of calibrated host cap `key` on `socket` (the bare key on a one-socket node)."""
        return key if self.num_sockets <= 1 else f"{key}@socket{socket}"

    def others(self, socket: int) -> list[int]:
        return [t for t in range(self.num_sockets) if t != socket]

    def switch_binds(self) -> bool:
        """A switch uplink can cap its GPUs only when their links together are faster (else never: same packets)."""
        return bool(self.switch_uplink_raw_bytes_s and self.pcie_raw_bytes_s
                    and self.gpus_per_switch * self.pcie_raw_bytes_s > self.switch_uplink_raw_bytes_s)

    def root_binds(self) -> bool:
        """Likewise a socket's root complex, over the GPUs on the socket."""
        return bool(self.socket_pcie_raw_bytes_s and self.pcie_raw_bytes_s
                    and max(1, self.gpus_per_socket) * self.pcie_raw_bytes_s > self.socket_pcie_raw_bytes_s)


def topology_of(costs) -> Topology:
    """The topology of a cost object: its own `topology` if it carries one (the fit's link table), else its
    hardware's (a `sim.presets.HardwareSpec`: GPUs spread evenly over its sockets), else one socket."""
    topo = getattr(costs, "topology", None)
    if topo is not None:
        return topo
    hw = getattr(costs, "hardware", None)
    if hw is None or not hasattr(hw, "num_sockets"):
        return Topology()
    return Topology(hw.num_sockets, -(-hw.num_gpus // hw.num_sockets), hw.gpus_per_switch, hw.pcie_raw_bytes_s,
                    hw.switch_uplink_raw_bytes_s, hw.socket_pcie_raw_bytes_s, hw.socket_mem_bw_bytes_s,
                    hw.inter_socket_bw_bytes_s, hw.host_kv_remote_fraction)


def _occupancy(costs, kind: str, topo: Topology, raw: float | None) -> float | None:
    """A raw PCIe rate in occupancy bytes/s of a `kind` link: the same share of raw as the GPU's measured ceiling."""
    if raw is None or not topo.pcie_raw_bytes_s:
        return None
    return raw * costs.values[f"pcie_{kind}_bw_bytes_s"] / topo.pcie_raw_bytes_s


def _sockets(topo: Topology, num_gpus: int) -> list[int]:
    """Sockets whose resources ranks 0..num_gpus-1 load."""
    return sorted({topo.socket_of(r) for r in range(num_gpus)})


def node_caps(costs, num_gpus: int, topo: Topology | None = None) -> dict:
    """Resource capacities of the node model: per GPU h2d/d2h/nvlink links (occupancy bytes/s); per socket in use
    the calibrated host caps (line bytes/s) where calibrated and the topology's datasheet caps where given."""
    topo = topology_of(costs) if topo is None else topo
    v = costs.values
    caps = {}
    for r in range(num_gpus):
        caps[f"h2d{r}"], caps[f"d2h{r}"] = v["pcie_h2d_bw_bytes_s"], v["pcie_d2h_bw_bytes_s"]
        caps[f"nvl{r}"] = v["nvlink_bw_bytes_s"]
    sockets = _sockets(topo, num_gpus)
    for s in sockets:
        for key in HOST_CAP_KEYS:
            if v.get(key):
                caps[topo.host_key(key, s)] = float(v[key])
    for r in range(num_gpus):
        s, k = topo.switch_of(r)
        for kind in ("h2d", "d2h"):
            if topo.switch_binds():
                caps[f"sw{s}.{k}_{kind}"] = _occupancy(costs, kind, topo, topo.switch_uplink_raw_bytes_s)
            if topo.root_binds():
                caps[f"rc{s}_{kind}"] = _occupancy(costs, kind, topo, topo.socket_pcie_raw_bytes_s)
    for s in sockets:
        if topo.socket_mem_bw_bytes_s:
            caps[f"mem{s}"] = float(topo.socket_mem_bw_bytes_s)
        if topo.remote_fraction > 0 and topo.inter_socket_bw_bytes_s:
            for t in topo.others(s):
                caps[f"upi{t}>{s}"] = float(topo.inter_socket_bw_bytes_s)
    return caps


LINE_BYTES = 128


def line_bytes(row_bytes: float) -> float:
    """Mean bytes of the 128-B lines a row touches, rows packed back to back from a line-aligned base."""
    rb = int(round(row_bytes))
    if rb <= 0:
        return 0.0
    starts = [k * rb for k in range(LINE_BYTES)]
    return LINE_BYTES * sum((s + rb - 1) // LINE_BYTES - s // LINE_BYTES + 1 for s in starts) / len(starts)


def pcie_route(costs, kind: str, rank: int, row_bytes: float, topo: Topology | None = None) -> dict:
    """Resources a host<->GPU transfer of `kind` (h2d | d2h) on GPU `rank` crosses, with its load per unit of
    occupancy rate: 1 on its own link, its switch's uplink and its socket's root complex (the same packets); on the
    calibrated host caps of its socket the line bytes per occupancy byte (payload fraction = row efficiency, times
    line bytes per payload byte); on DRAM the same; `remote_fraction` of it sits on the other socket(s),
    whose share also crosses the inter-socket link. Sockets loaded alike (the simulator's symmetric ranks: a
    simulated rank stands for its copies): the other socket's GPUs put on this socket's DRAM what this socket's put on
    theirs, and their writes cross the link into this socket as this socket's reads do, so a GPU's remote share is
    counted on its own socket's DRAM and on the link direction into its socket, for reads and writes alike -- exact
    whenever the sockets' GPUs move the same rows, and each resource then has only its own socket's GPUs as users."""
    topo = topology_of(costs) if topo is None else topo
    link_bytes = costs.h2d_link_bytes if kind == "h2d" else costs.d2h_link_bytes
    w = line_bytes(row_bytes) / link_bytes(1, row_bytes)
    s, k = topo.switch_of(rank)
    route = {f"{kind}{rank}": 1.0, topo.host_key(f"pcie_host_{kind}_cap_bytes_s", s): w,
             topo.host_key("pcie_host_cap_bytes_s", s): w}
    if topo.switch_binds():
        route[f"sw{s}.{k}_{kind}"] = 1.0
    if topo.root_binds():
        route[f"rc{s}_{kind}"] = 1.0
    if topo.socket_mem_bw_bytes_s:
        route[f"mem{s}"] = w
    f, others = topo.remote_fraction, topo.others(s)
    if f > 0 and topo.inter_socket_bw_bytes_s:
        for t in others:
            route[f"upi{t}>{s}"] = f * w / len(others)
    return route


def shared_users(costs, num_gpus: int, topo: Topology | None = None) -> dict:
    """Shared resource -> the ranks whose host<->GPU transfers cross it (to scale its cap to the simulated ranks)."""
    topo = topology_of(costs) if topo is None else topo
    users: dict[str, set] = {}
    for r in range(num_gpus):
        for kind in ("h2d", "d2h"):
            for res in pcie_route(costs, kind, r, LINE_BYTES, topo):
                if res != f"{kind}{r}":
                    users.setdefault(res, set()).add(r)
    return users


def concurrent_exchange_s(costs, row_bytes: float, h2d_rows, d2h_rows, peer_rows=None) -> tuple[float, float]:
    """(exchange, peer) time of one batch where every rank r exchanges h2d_rows[r] / d2h_rows[r] rows with the host
    at once (then gathers peer_rows[r] rows from its peers, all ranks at once, each gather after an exchange paying
    `peer_after_exchange_s`), on the node model."""
    R = len(h2d_rows)
    topo = topology_of(costs)
    caps = node_caps(costs, R, topo)
    v = costs.values
    sizes, routes = [], []
    for r in range(R):
        for kind, rows in (("h2d", h2d_rows[r]), ("d2h", d2h_rows[r])):
            if rows > 0:
                link = costs.h2d_link_bytes if kind == "h2d" else costs.d2h_link_bytes
                sizes.append(link(rows, row_bytes))
                routes.append(pcie_route(costs, kind, r, row_bytes, topo))
    ex = max(fluid_finish_s(sizes, routes, caps), default=0.0)
    ex = ex + v["pcie_latency_s"] if sizes else 0.0
    peer = 0.0
    if peer_rows is not None and any(p > 0 for p in peer_rows):
        after = peer_after_exchange_s(costs, R - 1) if sizes else 0.0
        peer = max(costs.peer_s(p, row_bytes) + after for p in peer_rows if p > 0)
    return ex, peer


def peer_after_exchange_s(costs, num_homes: int) -> float:
    """Fixed extra time of a rank's peer gathers that start when a host exchange finishes, one gather per home rank
    (`peer_after_exchange_latency_s`, measured by `hw calibrate` as gathers right after an exchange minus the same
    gathers warm; 0 where unmeasured). On 2 H200s a gather after an exchange took ~100 us more than warm
    (hw/NOTES.md, TP validation)."""
    return float(costs.values.get("peer_after_exchange_latency_s") or 0.0) * max(0, num_homes)


def _set_rates(flows: list, rates: list, slot: int) -> float:
    """Give each flow its rate (at index `slot` of its entry; index 0 holds its remainder) and return the time until
    the first of them ends at those rates (a re-plan: `Fabric._replan` and `Fabric.solo` share it, float for float)."""
    at = None
    for e, r in zip(flows, rates):
        e[slot] = r
        left = e[0]
        t = (left if left > 0.0 else 0.0) / r
        if at is None or t < at:
            at = t
    return at

class Fabric:
    """Flows over shared resources on simpy, max-min fair; one pending wake-up for the earliest completion.

    Each start and each completion re-plans the rates of every active flow (the max-min rates of the routes in start
    order, memoised per caps: a run cycles through few such sequences) and schedules a wake-up at the earliest
    completion; a wake-up that a later re-plan superseded does nothing when it fires. Caps change only through
    `set_cap` (`caps` is a read-only view), so the memo knows when they did."""

    shortcuts = True  # False: every done event and re-plan on simpy (the tests' reference)

    def __init__(self, env, caps: dict, recorder: TraceRecorder | None = None, groups=()):
        from simpy.core import StopSimulation
        from simpy.events import Event, Timeout

        self.env, self.recorder = env, recorder
        self._stop = StopSimulation.callback  # a run's `until` event: processed by simpy itself, never inline
        self._caps = dict(caps)
        self.caps = MappingProxyType(self._caps)
        self._event, self._timeout = Event, Timeout
        # active flows in start order: [remaining, done, start, label, size, rate, owner, size * 1e-9, followed]
        # (followed: processing its done event starts another flow, see `followed`)
        self._flows: list[list] = []
        self._sig: list[int] = []  # the route index of each active flow, in the same order
        self._route_idx: dict[int, int] = {}  # id(route dict) -> index
        self._route_of: list[dict] = []  # index -> route dict (kept alive, so its id is not reused)
        self._last = 0.0
        self._pending = None  # the wake-up that is current; older ones are stale
        self._held, self._dirty = 0, False  # inside hold(): starts re-plan once, at release()
        # rank symmetry: groups[r] lists rank r's own resources, position j alike on every rank
        self._groups = [tuple(g) for g in groups]
        self._place = {res: (r, j) for r, g in enumerate(self._groups) for j, res in enumerate(g)}
        self._rank_of: list[int | None] = []  # route index -> the rank whose resources it crosses (None: none)
        self._tid_of: list[int] = []  # route index -> its template (the route with its rank's resources as positions)
        self._asym: set[int] = set()  # routes crossing several ranks' resources
        self._templates: dict[tuple, int] = {}
        self._made: dict[tuple, dict] = {}  # (rank, template) -> that route on that rank
        self._memos: dict[tuple, tuple] = {}  # caps values -> ({route sequence: rates}, {canonical sequence: rates})
        self._set_memo()

    def set_cap(self, res: str, cap: float) -> None:
        if self._caps.get(res, self) != cap:
            self._caps[res] = cap
            self._set_memo()

    def _set_memo(self):
        caps = self._caps
        key = tuple(caps.values())
        memo = self._memos.get(key)
        if memo is None:
            g = self._groups
            symmetric = bool(g) and all(len(x) == len(g[0]) for x in g) and all(
                caps.get(x[j]) == caps.get(g[0][j]) for x in g for j in range(len(g[0])))
            memo = self._memos[key] = ({}, {} if symmetric else None)
        self._memo, self._canon_memo = memo

    def busy(self) -> bool:
        return bool(self._flows)

    def hold(self) -> None:
        """Starts until the matching `release` re-plan once, at the release. The caller starts them at one instant
        in one simpy callback, so nothing reads the rates in between: the last start's plan is the only one that
        mattered, and the earlier starts' wake-ups would all have been superseded (fewer simpy events, same plan)."""
        self._held += 1

    def release(self) -> None:
        self._held -= 1
        if not self._held and self._dirty:
            self._dirty = False
            self._replan()

    def start(self, owner, num_bytes: float, route: dict, label: str):
        env = self.env
        done = self._event(env)
        now = env._now
        dt = now - self._last  # advance the flows to now
        if dt > 0:
            for e in self._flows:
                e[0] -= e[5] * dt
        self._last = now
        idx = self._route_idx.get(id(route))
        if idx is None:
            idx = self._register(route)
        size = float(num_bytes)
        self._flows.append([size, done, now, label, size, 0.0, owner, size * 1e-9, False])
        self._sig.append(idx)
        if self._held:
            self._dirty = True
        else:
            self._replan()
        return done

    def solo(self, batches: list) -> tuple[list[list[float]], int] | None:
        """Flows started in `batches` [(time, sizes, routes)], in time order, each batch's flows together (one
        `hold`/`release`, as a rank starts its transfers), on an idle fabric that nothing else touches until they
        are all done: each flow's finish time (per batch) and the simpy events the run would schedule (one wake-up
        per re-plan that leaves flows, one done event per flow), by the very float operations of `start`,
        `_replan` and `_wake`, without simpy. A batch starting at the moment of a wake-up is ordered by event ids
        the caller would have to know: None then, and when the fabric is busy. Changes nothing (an idle fabric's
        state is not read by its next start)."""
        if self._flows:
            return None
        flows = []  # [remaining, rate, size * 1e-9, batch, position]
        sig = []
        finish = [[0.0] * len(sizes) for _, sizes, _ in batches]
        events = 0
        last = wake = None
        nxt = 0
        while nxt < len(batches) or flows:
            if nxt < len(batches) and (wake is None or batches[nxt][0] < wake):
                now, sizes, routes = batches[nxt]  # `start` x len(sizes): advance (once: the clock stands), join
                if last is not None and now - last > 0:
                    dt = now - last
                    for e in flows:
                        e[0] -= e[1] * dt
                last = now
                for k, (size, route) in enumerate(zip(sizes, routes)):
                    idx = self._route_idx.get(id(route))
                    if idx is None:
                        idx = self._register(route)
                    size = float(size)
                    flows.append([size, 0.0, size * 1e-9, nxt, k])
                    sig.append(idx)
                nxt += 1
            elif nxt < len(batches) and batches[nxt][0] == wake:
                return None
            else:  # `_wake`
                now = wake
                dt = now - last
                last = now
                clock = max(1e-12, abs(now) * 1e-12)
                done = []
                for k, e in enumerate(flows):
                    if dt > 0:
                        e[0] = e[0] - e[1] * dt
                    left = e[0]
                    if left <= e[2] or left <= e[1] * clock:
                        done.append(k)
                for k in reversed(done):
                    e = flows[k]
                    finish[e[3]][e[4]] = now
                    del flows[k], sig[k]
                events += len(done)
            wake = None
            if flows:  # `_replan`
                at = _set_rates(flows, self._memo_rates(tuple(sig)), 1)
                events += 1
                wake = now + at
        return finish, events

    def _memo_rates(self, sig: tuple) -> list:
        """The rates of the flows `sig` (route indices, in start order), memoised per sequence."""
        rates = self._memo.get(sig)
        if rates is None:
            rates = self._memo[sig] = self._rates_of(sig)
        return rates

    def _register(self, route: dict) -> int:
        idx = self._route_idx[id(route)] = len(self._route_of)
        self._route_of.append(route)
        ranks = {self._place[res][0] for res in route if res in self._place}
        if len(ranks) > 1:  # spans ranks: no renaming of sequences with it
            self._asym.add(idx)
            ranks = set()
        key = tuple(((self._place[res][1],) if res in self._place else res, w) for res, w in route.items())
        tid = self._templates.setdefault(key if ranks else (idx,), len(self._templates))
        rank = ranks.pop() if ranks else None
        self._made.setdefault((rank, tid), route)
        self._rank_of.append(rank)
        self._tid_of.append(tid)
        return idx

    def _rates_of(self, sig: tuple) -> list:
        """Max-min rates of the routes `sig` (route indices, in start order). With rank symmetry (every rank's own
        resources have the caps of every other's; shared resources map to themselves) the rates do not change when
        the ranks are renamed: `maxmin_rates` only ever compares its per-resource figures by value, and where several
        resources tie for the tightest step every one of them is full anyway (its load is within a few ulps of its
        cap, far inside the 1e-12 margin). So the sequence is memoised with its ranks renamed in order of first
        appearance, and runs that differ only in which ranks transfer share one computation, bit for bit."""
        canon = self._canon_memo
        if canon is None or (self._asym and not self._asym.isdisjoint(sig)):
            return maxmin_rates([self._route_of[i] for i in sig], self._caps)
        ranks = list(map(self._rank_of.__getitem__, sig))
        rename = dict.fromkeys(ranks)  # distinct ranks in order of first appearance (None: a shared route)
        k = 0
        for r in rename:
            if r is not None:
                rename[r] = k
                k += 1
        shapes = tuple(zip(map(rename.__getitem__, ranks), map(self._tid_of.__getitem__, sig)))
        rates = canon.get(shapes)
        if rates is None:
            rates = canon[shapes] = maxmin_rates([self._make(x) for x in shapes], self._caps)
        return rates

    def _make(self, shape: tuple) -> dict:
        """The route of template `shape[1]` on rank `shape[0]`."""
        route = self._made.get(shape)
        if route is None:
            r, tid = shape
            key = next(k for k, v in self._templates.items() if v == tid)
            route = self._made[shape] = {(self._groups[r][res[0]] if isinstance(res, tuple) else res): w
                                         for res, w in key}
        return route

    def _replan(self):
        """Rates of the active flows, and a wake-up at the first end."""
        flows = self._flows
        if not flows:
            return
        at = _set_rates(flows, self._memo_rates(tuple(self._sig)), 5)
        ev = self._pending = self._timeout(self.env, at)
        ev.callbacks.append(self._wake)

    def _wake(self, ev):
        """The pending wake-up: advance every flow (as `start` does), finish those whose remainder is float noise of
        their own size or would take less than the clock's resolution (float time grows with the run), re-plan."""
        if ev is not self._pending:
            return  # superseded by a later re-plan
        now = self.env.now
        finished = self._advance_flows(now)
        if finished is None:
            self._replan()
            return
        self._end_flows(self._drop(finished), now)

    def _advance_flows(self, now: float):
        """Move every flow's remainder on to `now`; the indices of those that end, or None when none does."""
        dt = now - self._last
        self._last = now
        clock = max(1e-12, abs(now) * 1e-12)
        finished = None
        if dt > 0:
            for k, e in enumerate(self._flows):
                left = e[0] = e[0] - e[5] * dt
                if left <= e[7] or left <= e[5] * clock:
                    finished = [k] if finished is None else finished + [k]
        else:
            for k, e in enumerate(self._flows):
                left = e[0]
                if left <= e[7] or left <= e[5] * clock:
                    finished = [k] if finished is None else finished + [k]
        return finished

    def _drop(self, finished: list) -> list:
        """Take the flows at indices `finished` out of the active ones (and their signature); they, in order."""
        flows = self._flows
        if len(finished) == 1:  # the usual case: one flow ends
            del self._sig[finished[0]]
            return [flows.pop(finished[0])]
        done = [flows[k] for k in finished]
        gone = set(finished)
        self._flows = [e for k, e in enumerate(flows) if k not in gone]
        self._sig = [x for k, x in enumerate(self._sig) if k not in gone]
        return done

    def _end_flows(self, done: list, now: float) -> None:
        """Succeed the done flows' events and re-plan the rest.

        Done events in place: each takes its id now, as `succeed` would, and after the re-plan (as simpy's `step`
        would next) its callbacks run here -- while nothing else is due before it (an event queued at this instant
        earlier, or an urgent one a callback scheduled); from the first that is not, the rest are queued with their
        ids. A run's `until` event is left to simpy (its stop)."""
        env = self.env
        inline = self.shortcuts
        if inline:
            for e in done:
                if self._stop in e[1].callbacks:
                    inline = False
        followed = False
        ids = []
        for e in done:
            if self.recorder is not None:
                self.recorder.span(e[6].name, e[3] or "transfer", e[2], now, {"bytes": round(e[4])})
            if inline:
                ids.append(next(env._eid))
            else:
                e[1].succeed()
            followed = followed or e[8]
        if followed and self._flows and self.shortcuts:
            # a done event just scheduled starts a flow when processed, at this instant (before the clock moves or
            # this wake-up could fire: it is queued before it), and that start re-plans: this plan would be
            # superseded unread, so only its event (a wake-up that would do nothing) is counted
            next(env._eid)
            self._pending = None
        else:
            self._replan()
        if inline:
            self._run_done(done, ids, now)

    def _run_done(self, done: list, ids: list, now: float) -> None:
        """Run the done events' callbacks in place, in order, until one would run after an event already due at
        this instant; that one and the rest go on simpy's queue with the ids they took."""
        queue = self.env._queue
        for k, e in enumerate(done):
            ev = e[1]
            ev._ok, ev._value = True, None
            if queue and queue[0] < (now, 1, ids[k]):
                for j in range(k, len(done)):
                    done[j][1]._ok, done[j][1]._value = True, None
                    heappush(queue, (now, 1, ids[j], done[j][1]))
                break
            callbacks, ev.callbacks = ev.callbacks, None
            for callback in callbacks:
                callback(ev)

    def followed(self, done) -> None:
        """Say that processing the done event of the active flow `done` starts another flow (a chained fetch): the
        re-plan of the wake-up that ends it is then skipped, as that start supersedes it at the same instant."""
        for e in reversed(self._flows):
            if e[1] is done:
                e[8] = True
                return


class Route:
    """A GPU's link seen through the node model: `transfer` as on a `Link`, sharing the fabric's resources."""

    def __init__(self, fabric: Fabric, name: str, route: dict, bw_bytes_s: float, latency_s: float,
                 on_use=None):
        self.fabric, self.name, self.route, self.on_use = fabric, name, route, on_use
        self.bw, self.latency = float(bw_bytes_s), float(latency_s)
        self.bytes_total = 0.0

    def transfer(self, num_bytes: float, label: str = ""):
        if num_bytes <= 0:
            done = self.fabric.env.event()
            done.succeed()
            return done
        self.bytes_total += num_bytes
        if self.on_use is not None:
            self.on_use()
        return self.fabric.start(self, num_bytes, self.route, label)


class Node:
    """N GPUs with their links; the engine drives per-rank processes on it. With host-side caps calibrated (the
    node model) the links are routes through one shared `Fabric`; otherwise independent processor-sharing links."""

    def __init__(self, env, num_gpus: int, costs, recorder: TraceRecorder | None = None):
        v = costs.values
        self.env, self.num_gpus = env, num_gpus
        self.fabric = None
        self.peer_after_exchange_s = peer_after_exchange_s(costs, num_gpus - 1)  # chained fetches: TP homes = peers
        self.topology = topology_of(costs)
        caps = node_caps(costs, num_gpus, self.topology)
        if len(caps) > 3 * num_gpus:  # shared host-side caps: the node model
            self._routes(costs, recorder, caps)
            return
        self.h2d = [Link(env, f"gpu{r} pcie h2d", v["pcie_h2d_bw_bytes_s"], v["pcie_latency_s"], recorder)
                    for r in range(num_gpus)]
        self.d2h = [Link(env, f"gpu{r} pcie d2h", v["pcie_d2h_bw_bytes_s"], v["pcie_latency_s"], recorder)
                    for r in range(num_gpus)]
        self.nvlink = [Link(env, f"gpu{r} nvlink in", v["nvlink_bw_bytes_s"], v["nvlink_latency_s"], recorder)
                       for r in range(num_gpus)]

    def hold(self) -> None:
        """Transfers started from now until `release` start at one instant in one simpy callback (see Fabric.hold)."""
        if self.fabric is not None:
            self.fabric.hold()

    def release(self) -> None:
        if self.fabric is not None:
            self.fabric.release()

    def followed(self, done) -> None:
        """Processing the transfer event `done` starts another transfer (see Fabric.followed)."""
        if self.fabric is not None:
            self.fabric.followed(done)

    def idle(self) -> bool:
        """No transfer in flight on any link (pending wake-ups, if any, are stale and change nothing)."""
        if self.fabric is not None:
            return not self.fabric.busy()
        return not any(link.busy() for links in (self.h2d, self.d2h, self.nvlink) for link in links)

    def _routes(self, costs, recorder, caps: dict):
        """The node model. The simulator may run only some ranks in detail (the others are copies of them), so each
        shared resource's cap is scaled to the share of its users (the ranks whose transfers cross it) that
        `simulate(ranks)` says are simulated; until a caller says so, of the ranks that have transferred so far (a
        symmetric DP run simulates rank 0 alone: it stands for its switch-mates, socket-mates and the rest)."""
        v, n, topo = costs.values, self.num_gpus, self.topology
        row = costs.model.kv_bytes_per_token_layer
        self._users = shared_users(costs, n, topo)
        self._shared = {k: float(c) for k, c in caps.items() if k in self._users}
        self.fabric = Fabric(self.env, caps, recorder,
                             groups=[(f"h2d{r}", f"d2h{r}", f"nvl{r}") for r in range(n)])
        self._explicit, self._seen = False, set()
        mk = lambda kind, r, bw, lat: Route(self.fabric, f"gpu{r} pcie {kind}", pcie_route(costs, kind, r, row, topo),
                                             bw, lat, on_use=lambda r=r: self._saw(r))
        self.h2d = [mk("h2d", r, v["pcie_h2d_bw_bytes_s"], v["pcie_latency_s"]) for r in range(n)]
        self.d2h = [mk("d2h", r, v["pcie_d2h_bw_bytes_s"], v["pcie_latency_s"]) for r in range(n)]
        self.nvlink = [Route(self.fabric, f"gpu{r} nvlink in", {f"nvl{r}": 1.0}, v["nvlink_bw_bytes_s"],
                             v["nvlink_latency_s"]) for r in range(n)]

    def solo(self, batches: list) -> tuple[list[list[float]], int] | None:
        """`Fabric.solo` of batches [(time, [(link, bytes)])] of transfers on this node's links (see there); None
        without a node model or before `simulate` said which ranks are simulated (until then a link's first use may
        rescale the host caps). Pure: `count` books the bytes once the caller uses the result."""
        if self.fabric is None or not self._explicit:
            return None
        return self.fabric.solo([(t, [b for _, b in tr], [link.route for link, _ in tr]) for t, tr in batches])

    @staticmethod
    def count(batches: list) -> None:
        """Book the transfers of `solo`'s batches as `transfer` would have."""
        for _, transfers in batches:
            for link, b in transfers:
                link.bytes_total += b

    def simulate(self, ranks) -> None:
        """Tell the node which ranks are simulated in detail; each stands for the GPUs it is a copy of, so a shared
        resource's cap shrinks to the share of its users that are simulated (all GPUs load the host alike). No-op
        without a node model."""
        if self.fabric is None:
            return
        if not self._explicit:
            self._explicit = True
            for link in self.h2d + self.d2h:
                link.on_use = None  # (`_saw` only counts ranks until now)
        self._scale(set(ranks))

    def _saw(self, rank: int) -> None:
        if not self._explicit and rank not in self._seen:
            self._seen.add(rank)
            self._scale(self._seen)

    def _scale(self, ranks: set) -> None:
        for key, cap in self._shared.items():
            users = self._users[key]
            k = len(users & ranks)
            self.fabric.set_cap(key, cap * k / len(users) if k else cap)
