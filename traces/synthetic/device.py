"""DeviceSelections: the synthetic generator with its stratified rows drawn on a CUDA device (cupy).

The same selections as SyntheticSelections, bit for bit (the kernel, draw.cu, is the host path's arithmetic
element by element; tests/test_device_selections.py checks it under `-m gpu`): the host keeps what is per group or
per row (plans, strata tables per domain, row and step keys: ~k' values a group, a few a row) and the
device expands them into the [groups, rows, query tokens, top_k] positions, the part that grows with the batch.
Rows the kernel does not cover (histories of top_k or less, dense short ones, a history past the generator's
limit) send the whole call to the host path, so every call answers as SyntheticSelections does.

cupy is imported and the kernel built on first use, in the process that selects: a replay's group workers fork
before any selection (sim/policy.py), and a CUDA context does not survive a fork, so each process builds its own.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from traces.hashing import row_keys32
from traces.synthetic.draws import QKEYS, qkeys, step_keys
from traces.synthetic.geometry import domains
from traces.synthetic.source import SyntheticSelections, check_select_args
from traces.synthetic.spec import MAX_HISTORY_TOKENS

KERNEL = Path(__file__).with_name("draw.cu")
I32 = ("start_cw", "lo", "fold_shift", "ln", "fold_d", "mirror_cw", "half_d", "start")  # kernel's NI rows, in order
U32 = ("phase", "ck_mult", "mult", "sh1", "sh2", "mask", "par", "fresh")  # then the column keys (KEY)
_THREADS = 256


class DeviceSelections(SyntheticSelections):
    """SyntheticSelections whose `select` / `select_groups` draw on the current CUDA device and return host arrays
    (the same int64[R, q, top_k] arrays); `device_calls` / `host_calls` count which path answered."""

    draws_on = "device"  # (SyntheticSelections: where its draws run, for a replay's metrics)

    def __init__(self, spec=None, seed: int = 0, num_threads: int | None = None):
        super().__init__(spec, seed, num_threads)
        self.device_calls = 0
        self.host_calls = 0
        self._dev: dict = {}  # per process: the kernel, device tables, query keys
        self._dev_pid = None
        self._host_only = False

    @classmethod
    def of(cls, source: SyntheticSelections) -> DeviceSelections:
        """The device twin of a host generator (same spec and seed)."""
        return cls(source.spec, source.seed)

    def select(self, request_ids, history_lens, steps, group: int, num_query_tokens: int) -> np.ndarray:
        if self._host_only:  # (the host path's own fallbacks call select)
            return super().select(request_ids, history_lens, steps, group, num_query_tokens)
        return self.select_groups(request_ids, history_lens, steps, [self._check_group(group)], num_query_tokens)[0]

    def select_groups(self, request_ids, history_lens, steps, groups, num_query_tokens: int) -> list[np.ndarray]:
        sel = self.select_groups_device(request_ids, history_lens, steps, groups, num_query_tokens)
        if sel is None:
            self.host_calls += 1
            self._host_only = True
            try:
                return super().select_groups(request_ids, history_lens, steps, groups, num_query_tokens)
            finally:
                self._host_only = False
        self.device_calls += 1
        out: list = [None] * len(groups)
        for idx, arr in sel:
            host = arr.get()
            for j, n in enumerate(idx):
                out[n] = host[j]
        return out

    def select_groups_device(self, request_ids, history_lens, steps, groups, num_query_tokens: int):
        """[(indices into `groups`, cupy int64[len(indices), R, q, top_k])] per class of groups sharing sink, recent
        and earliness; None where a row needs the host path (see the module docstring)."""
        rid, hist, step, q = check_select_args(request_ids, history_lens, steps, num_query_tokens)
        plans = [self.plan(g) for g in groups]
        if not rid.size or not plans or int(hist.min()) <= self.top_k or int(hist.max()) > MAX_HISTORY_TOKENS:
            return None
        alike: dict[tuple, list[int]] = {}
        for n, p in enumerate(plans):
            alike.setdefault((p.num_sink, p.num_recent, p.early), []).append(n)
        doms = {}
        for key, ns in alike.items():
            kp = plans[ns[0]].num_strata
            dom = domains(np.maximum(hist - key[0] - key[1], 1), kp)
            if int(dom.min()) < 2 * kp:  # dense rows: the host path
                return None
            doms[key] = dom
        dev = self._device()
        cp = dev["cp"]
        step32 = step.astype(np.uint32)
        rows = (cp.asarray(hist), cp.asarray(step32), cp.asarray(row_keys32(self._seed_key, rid) | np.uint32(1)),
                cp.asarray(step_keys(step32)))
        return [(ns, self._launch(tuple(plans[n] for n in ns), doms[key], rows, q)) for key, ns in alike.items()]

    def _launch(self, plans: tuple, dom: np.ndarray, rows: tuple, q: int):
        """One kernel launch: every element of the class's [G, R, q, top_k] positions."""
        dev = self._device()
        cp = dev["cp"]
        p0 = plans[0]
        uniq, dom_index = np.unique(dom, return_inverse=True)  # (a handful of rows' domains: small)
        itab, utab = self._device_tables(plans, tuple(int(d) for d in uniq))
        g, r, k = len(plans), dom.size, self.top_k
        out = cp.empty((g, r, q, k), dtype=cp.int64)
        qk = dev["qkeys"].get(q)
        if qk is None:
            qk = dev["qkeys"][q] = cp.asarray(QKEYS[:q] if q <= QKEYS.size else qkeys(q))
        thr1 = max(int(round(self.spec.spec_share * 65536)) - 1, 0)
        shift = int(self.spec.drift_steps).bit_length() - 1
        blocks = min(max(1, -(-(g * r * k) // _THREADS)), 65535)
        dev["kernel"]((blocks,), (_THREADS,), (
            itab, utab, *rows, cp.asarray(dom_index.astype(np.int32)), qk, out,
            np.int32(g), np.int32(r), np.int32(q), np.int32(k), np.int32(p0.num_sink), np.int32(p0.num_recent),
            np.int32(p0.early), np.uint32(shift), np.uint32(thr1)))
        return out

    def _device_tables(self, plans: tuple, doms: tuple[int, ...]):
        """int32[D, G, NI, k'] and uint32[D, G, NU, k'] on the device for these groups and domains (cached)."""
        dev = self._device()
        cache, cp = dev["tables"], dev["cp"]
        key = (tuple(p.group for p in plans), doms)
        hit = cache.get(key)
        if hit is None:
            keys = np.stack([np.concatenate([p.stable.key, p.recurring.key, p.fresh.key]) for p in plans])
            tabs = [self._tables(plans, d) for d in doms]  # each name: [G, 1, k']
            itab = np.stack([np.stack([tb[n][:, 0] for n in I32], axis=1) for tb in tabs]).astype(np.int32)
            utab = np.stack([np.stack([tb[n][:, 0].astype(np.uint32) for n in U32] + [keys], axis=1)
                             for tb in tabs]).astype(np.uint32)
            if len(cache) > 256:
                cache.clear()
            hit = cache[key] = (cp.asarray(np.ascontiguousarray(itab)), cp.asarray(np.ascontiguousarray(utab)))
        return hit

    def bind(self, xp, kernel) -> None:
        """Use array module `xp` (cupy's asarray / empty / int64, arrays with .get()) and `kernel` (called as a cupy
        RawKernel: grid, block, args) in this process: what `_device` does with cupy and draw.cu on first use;
        tests bind a numpy stand-in."""
        self._dev = {"cp": xp, "kernel": kernel, "tables": {}, "qkeys": {}}
        self._dev_pid = os.getpid()

    def _device(self) -> dict:
        """This process's cupy module, kernel and device caches (built on first use, again after a fork)."""
        if self._dev_pid != os.getpid():
            import cupy as cp

            module = cp.RawModule(code=KERNEL.read_text(), options=("-std=c++17",))
            self.bind(cp, module.get_function("draw_strata"))
        return self._dev


def selections_on_device(source):
    """`source` drawing on the CUDA device where it is the synthetic generator (the same positions); any other
    source (captured selections: read, not drawn) as it is."""
    return DeviceSelections.of(source) if type(source) is SyntheticSelections else source
