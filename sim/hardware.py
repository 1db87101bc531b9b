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
"""
from __future__ import annotations

from sim.events import TraceRecorder

HOST_CAP_KEYS = ("pcie_host_h2d_cap_bytes_s", "pcie_host_d2h_cap_bytes_s", "pcie_host_cap_bytes_s")


class _Count:
    """Drop-in for simpy's event-id counter that also tells how many events were scheduled."""

    def __init__(self):
        self.n = 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        self.n += 1
        return self.n


def make_env():
    import simpy

    env = simpy.Environment()
    env._eid = _Count()
    return env


def events_scheduled(env) -> int:
    return env._eid.n if isinstance(env._eid, _Count) else 0


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
    capacity (resources missing from caps are uncapped). Every flow must cross at least one capped resource."""
    n = len(routes)
    rates = [0.0] * n
    active = set(range(n))
    crossed = set().union(*routes) if routes else set()
    caps = {res: cap for res, cap in caps.items() if res in crossed}  # the others never load nor fill
    used = dict.fromkeys(caps, 0.0)
    while active:
        step, tight = None, None
        for res, cap in caps.items():
            w = sum(routes[f].get(res, 0.0) for f in active)
            if w > 0:
                d = max(0.0, cap - used[res]) / w
                if step is None or d < step:
                    step, tight = d, res
        if step is None:
            raise ValueError("a flow crosses no capped resource")
        for f in active:
            rates[f] += step
            for res, w in routes[f].items():
                if res in used:
                    used[res] += step * w
        full = {res for res, cap in caps.items() if used[res] >= cap * (1 - 1e-12)} | {tight}
        active = {f for f in active if not any(res in full for res in routes[f])}
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


def node_caps(costs, num_gpus: int) -> dict:
    """Resource capacities of the node model: per GPU h2d/d2h/nvlink links (occupancy bytes/s), host-side caps
    (payload bytes/s) where calibrated."""
    v = costs.values
    caps = {}
    for r in range(num_gpus):
        caps[f"h2d{r}"], caps[f"d2h{r}"] = v["pcie_h2d_bw_bytes_s"], v["pcie_d2h_bw_bytes_s"]
        caps[f"nvl{r}"] = v["nvlink_bw_bytes_s"]
    for key in HOST_CAP_KEYS:
        if v.get(key):
            caps[key] = float(v[key])
    return caps


LINE_BYTES = 128


def line_bytes(row_bytes: float) -> float:
    """Mean bytes of the 128-B lines a row touches, rows packed back to back from a line-aligned base."""
    rb = int(round(row_bytes))
    if rb <= 0:
        return 0.0
    starts = [k * rb for k in range(LINE_BYTES)]
    return LINE_BYTES * sum((s + rb - 1) // LINE_BYTES - s // LINE_BYTES + 1 for s in starts) / len(starts)


def pcie_route(costs, kind: str, rank: int, row_bytes: float) -> dict:
    """Resources a host<->GPU transfer of `kind` (h2d | d2h) on GPU `rank` crosses, with its load per unit of
    occupancy rate: 1 on its own link; on the host-side caps the line bytes per occupancy byte (payload fraction =
    row efficiency, times line bytes per payload byte)."""
    link_bytes = costs.h2d_link_bytes if kind == "h2d" else costs.d2h_link_bytes
    w = line_bytes(row_bytes) / link_bytes(1, row_bytes)
    return {f"{kind}{rank}": 1.0, f"pcie_host_{kind}_cap_bytes_s": w, "pcie_host_cap_bytes_s": w}


def concurrent_exchange_s(costs, row_bytes: float, h2d_rows, d2h_rows, peer_rows=None) -> tuple[float, float]:
    """(exchange, peer) time of one batch where every rank r exchanges h2d_rows[r] / d2h_rows[r] rows with the host
    at once (then gathers peer_rows[r] rows from its peers, all ranks at once, each gather after an exchange paying
    `peer_after_exchange_s`), on the node model."""
    R = len(h2d_rows)
    caps = node_caps(costs, R)
    v = costs.values
    sizes, routes = [], []
    for r in range(R):
        for kind, rows in (("h2d", h2d_rows[r]), ("d2h", d2h_rows[r])):
            if rows > 0:
                link = costs.h2d_link_bytes if kind == "h2d" else costs.d2h_link_bytes
                sizes.append(link(rows, row_bytes))
                routes.append(pcie_route(costs, kind, r, row_bytes))
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


class Fabric:
    """Flows over shared resources on simpy, max-min fair; one pending wake-up for the earliest completion."""

    def __init__(self, env, caps: dict, recorder: TraceRecorder | None = None):
        self.env, self.caps, self.recorder = env, dict(caps), recorder
        self._active: dict[int, list] = {}  # id -> [remaining, done, start, label, size, route, rate, owner]
        self._last = 0.0
        self._version = 0
        self._next_id = 0
        self._rates: dict[tuple, tuple] = {}  # (route ids, caps) -> (routes, max-min rates): a pure function of both

    def busy(self) -> bool:
        return bool(self._active)

    def start(self, owner, num_bytes: float, route: dict, label: str):
        done = self.env.event()
        self._advance()
        self._active[self._next_id] = [float(num_bytes), done, self.env.now, label, float(num_bytes), route, 0.0,
                                       owner]
        self._next_id += 1
        self._replan()
        return done

    def _advance(self):
        now = self.env.now
        dt = now - self._last
        if dt > 0:
            owners = set()
            for e in self._active.values():
                e[0] -= e[6] * dt
                owners.add(e[7])
            for o in owners:
                o.busy_s += dt
        self._last = now

    def _replan(self):
        if not self._active:
            return
        keys = list(self._active)
        routes = [self._active[k][5] for k in keys]
        memo = (tuple(map(id, routes)), tuple(self.caps.values()))
        hit = self._rates.get(memo)
        if hit is None:  # the entry keeps its route dicts alive, so their ids cannot be reused by others
            hit = self._rates[memo] = (routes, maxmin_rates(routes, self.caps))
        rates = hit[1]
        for k, r in zip(keys, rates):
            self._active[k][6] = r
        at = min(max(0.0, self._active[k][0]) / r for k, r in zip(keys, rates))
        self._version += 1
        version = self._version
        self.env.timeout(at).callbacks.append(lambda _e: self._wake(version))

    def _wake(self, version: int):
        if version != self._version:
            return
        self._advance()
        clock = max(1e-12, abs(self.env.now) * 1e-12)
        finished = [k for k, e in self._active.items() if e[0] <= max(e[4] * 1e-9, e[6] * clock)]
        for k in finished:
            e = self._active.pop(k)
            if self.recorder is not None:
                self.recorder.span(e[7].name, e[3] or "transfer", e[2], self.env.now, {"bytes": round(e[4])})
            e[1].succeed()
        self._replan()


class Route:
    """A GPU's link seen through the node model: `transfer` as on a `Link`, sharing the fabric's resources."""

    def __init__(self, fabric: Fabric, name: str, route: dict, bw_bytes_s: float, latency_s: float,
                 on_use=None):
        self.fabric, self.name, self.route, self.on_use = fabric, name, route, on_use
        self.bw, self.latency = float(bw_bytes_s), float(latency_s)
        self.bytes_total = 0.0
        self.busy_s = 0.0

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
        if any(v.get(k) for k in HOST_CAP_KEYS):
            self._routes(costs, recorder)
            return
        self.h2d = [Link(env, f"gpu{r} pcie h2d", v["pcie_h2d_bw_bytes_s"], v["pcie_latency_s"], recorder)
                    for r in range(num_gpus)]
        self.d2h = [Link(env, f"gpu{r} pcie d2h", v["pcie_d2h_bw_bytes_s"], v["pcie_latency_s"], recorder)
                    for r in range(num_gpus)]
        self.nvlink = [Link(env, f"gpu{r} nvlink in", v["nvlink_bw_bytes_s"], v["nvlink_latency_s"], recorder)
                       for r in range(num_gpus)]

    def idle(self) -> bool:
        """No transfer in flight on any link (pending wake-ups, if any, are stale and change nothing)."""
        if self.fabric is not None:
            return not self.fabric.busy()
        return not any(link.busy() for links in (self.h2d, self.d2h, self.nvlink) for link in links)

    def _routes(self, costs, recorder):
        """The node model. The simulator may run only some ranks in detail (the others are copies of them), so the
        host-side caps are scaled to the share of GPUs that `simulate(ranks)` says are simulated; until a caller
        says so, the share of ranks that have transferred so far (a symmetric DP run simulates rank 0 alone)."""
        v, n = costs.values, self.num_gpus
        row = costs.model.kv_bytes_per_token_layer
        self._host_caps = {k: float(v[k]) for k in HOST_CAP_KEYS if v.get(k)}
        self.fabric = Fabric(self.env, node_caps(costs, n), recorder)
        self._explicit, self._seen = False, set()
        mk = lambda kind, r, bw, lat: Route(self.fabric, f"gpu{r} pcie {kind}", pcie_route(costs, kind, r, row), bw,
                                             lat, on_use=lambda r=r: self._saw(r))
        self.h2d = [mk("h2d", r, v["pcie_h2d_bw_bytes_s"], v["pcie_latency_s"]) for r in range(n)]
        self.d2h = [mk("d2h", r, v["pcie_d2h_bw_bytes_s"], v["pcie_latency_s"]) for r in range(n)]
        self.nvlink = [Route(self.fabric, f"gpu{r} nvlink in", {f"nvl{r}": 1.0}, v["nvlink_bw_bytes_s"],
                             v["nvlink_latency_s"]) for r in range(n)]

    def simulate(self, ranks) -> None:
        """Tell the node which ranks are simulated in detail; each stands for num_gpus / len(ranks) GPUs, so the
        host-side caps shrink to that share (all GPUs load the host alike). No-op without a node model."""
        if self.fabric is None:
            return
        self._explicit = True
        self._scale(len(set(ranks)))

    def _saw(self, rank: int) -> None:
        if not self._explicit and rank not in self._seen:
            self._seen.add(rank)
            self._scale(len(self._seen))

    def _scale(self, num_ranks: int) -> None:
        share = max(1, num_ranks) / self.num_gpus
        for key, cap in self._host_caps.items():
            self.fabric.caps[key] = cap * share
