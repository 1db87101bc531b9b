"""Timing swap-in calls the way a decode step runs them: captured in a CUDA graph and replayed with the GPU busy, so the
host's launch latency is hidden (SGLang captures the decode / verify step, swap-in included, in a CUDA graph), next to
the eager timings that were the old calibration's flaw.

How "busy" is made: before each timed replay the stream runs a spin kernel (one thread, `busy_us` of %globaltimer),
enqueued first; the host then enqueues the start event, the graph (or the eager launches) and the stop event while the
spin still runs. The start event therefore fires when the spin ends, with the work already queued behind it: the
interval holds the GPU work of the calls and the gaps between graph nodes, not the host's launch path. Nothing else
runs during the interval (the spin has ended), so this is the uncontended cost; contention with concurrent compute is
not part of these figures.

Modes per set of calls (one call per layer, `calls` layers): `graph` (replayed graph, busy), `eager_queued` (plain
launches enqueued behind the spin), `eager_idle` (one launch on an idle GPU timed by events around it: what the old
`hisparse_swapin_fixed_s` measured).
"""
from __future__ import annotations

import functools

import numpy as np

_BUSY_SRC = r"""
extern "C" __global__ void hs_busy(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
"""


@functools.lru_cache(maxsize=None)
def _busy_on(device_id: int):
    import cupy as cp

    return cp.RawKernel(_BUSY_SRC, "hs_busy")


class GraphTimer:
    """Capture and time launch sequences on one non-blocking stream (see the module docstring)."""

    def __init__(self, busy_us: float = 1500.0):
        import cupy as cp

        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.busy_ns = np.uint64(int(busy_us * 1e3))
        self.busy = _busy_on(cp.cuda.Device().id)

    def capture(self, launch):
        """A CUDA graph of `launch(stream)` (kernel launches only: no allocation, no synchronisation inside)."""
        s = self.stream
        s.synchronize()
        s.begin_capture()
        try:
            launch(s)
        finally:
            graph = s.end_capture()
        return graph

    def _spin(self) -> None:
        with self.stream:
            self.busy((1,), (1,), (self.busy_ns,))

    def _span(self, enqueue, busy: bool) -> float:
        s = self.stream
        if busy:
            self._spin()
        else:
            s.synchronize()
        a = s.record()
        enqueue(s)
        e = s.record()
        e.synchronize()
        return self.cp.cuda.get_elapsed_time(a, e) * 1e-3

    def graph_s(self, graph) -> float:
        """Seconds of one replay of `graph` behind a busy stream."""
        return self._span(lambda s: graph.launch(s), busy=True)

    def eager_queued_s(self, launch) -> float:
        return self._span(launch, busy=True)

    def eager_idle_s(self, launch) -> float:
        return self._span(launch, busy=False)


def time_layers(timer: GraphTimer, layers, set_step, *, steps: int, record_plan: bool = False) -> dict:
    """Per-call seconds of swap-in calls over `layers` (objects with launch(skip_io, stream[, record_plan]),
    snapshot(), restore()): each timed step sets new selections (`set_step()`, outside the timing), then times from
    the same state the skip-IO graph, the full graph, the eager launches queued behind the spin, and each call alone on
    an idle GPU; the state ends as after one full call per layer. Medians over `steps`."""
    kw = {"record_plan": True} if record_plan else {}

    def launch_all(skip_io: bool):
        return lambda s: [lay.launch(skip_io=skip_io, stream=s, **kw) for lay in layers]

    g_skip, g_full = timer.capture(launch_all(True)), timer.capture(launch_all(False))
    n = len(layers)
    acc = {"graph_skip_io": [], "graph": [], "eager_queued": [], "eager_idle": [], "eager_idle_skip_io": []}
    for _ in range(steps):
        set_step()
        snaps = [lay.snapshot() for lay in layers]

        def restore():
            for lay, sn in zip(layers, snaps):
                lay.restore(sn)

        acc["eager_idle_skip_io"].append(np.mean([timer.eager_idle_s(
            lambda s, lay=lay: lay.launch(skip_io=True, stream=s, **kw)) for lay in layers]))
        restore()
        acc["graph_skip_io"].append(timer.graph_s(g_skip) / n)
        restore()
        acc["graph"].append(timer.graph_s(g_full) / n)
        restore()
        acc["eager_queued"].append(timer.eager_queued_s(launch_all(False)) / n)
        restore()
        acc["eager_idle"].append(np.mean([timer.eager_idle_s(lambda s, lay=lay: lay.launch(stream=s, **kw))
                                          for lay in layers]))
    return {k: float(np.median(v)) for k, v in acc.items()}
