"""Fit the node model (sim/hardware.py) on concurrent host<->GPU transfers (numpy + the simulator's fluid model; no
GPU, no simpy; tested on CPU).

Per-link figures (efficiency by row size, latency) come from each GPU transferring alone; what k GPUs at once lose
beyond that is explained by host-side caps shared by all GPUs (bytes/s of the 128-B lines the rows touch,
sim.hardware.line_bytes): one on host->GPU reads
(`pcie_host_h2d_cap_bytes_s`, seen by read-only exchanges) and one on both directions together
(`pcie_host_cap_bytes_s`, seen by swaps). Each cap is chosen, by coordinate search over candidates taken from the
measured aggregate rates, to minimise the squared log error of the model's prediction over every measured point;
a cap is kept only where it lowers that error (no cap = the links alone).

Topology (sim/hardware.py `Topology`): the fitted caps are per socket. The points are predicted on the measured
host's topology (`MEASURED_HOST`: its GPUs on one socket, each behind its own switch, no datasheet caps -- its
parts are not known), where they are the one resource every GPU's transfers share. `shared_level` says which level
the data allow: a cap shared by GPUs that together moved more than one PCIe Gen5 x16 uplink carries cannot be a
switch uplink, so it sits at the socket (root complex / memory) -- the level the simulator applies it at.
"""
from __future__ import annotations

import numpy as np

from sim.hardware import Topology, concurrent_exchange_s, line_bytes

FIT_OPS = ("read_only", "swap")  # the exchanges the simulator models (h2d flow; h2d + d2h flows)
CAP_KEYS = ("pcie_host_h2d_cap_bytes_s", "pcie_host_cap_bytes_s")


MEASURED_HOST = Topology(num_sockets=1, gpus_per_switch=1)  # the calibration host: one socket, one GPU per switch
GEN5_X16_RAW_BYTES_S = 63.0e9  # PCIe 5.0: 32 GT/s x 16 lanes x 128/130 / 8, each direction (sim/presets.py)


class LinkTable:
    """The link half of sim.costs.CostModel from plain values (bandwidths, latencies, efficiency tables), on a
    topology (default: the measured host's)."""

    def __init__(self, values: dict, topology: Topology = MEASURED_HOST):
        self.values = dict(values)
        self.topology = topology

    def _eff(self, kind: str, row_bytes: float) -> float:
        table = self.values.get(f"{kind}_row_efficiency_by_bytes") or {}
        if table:
            xs = sorted(float(k) for k in table)
            ys = [float(table[k]) for k in sorted(table, key=float)]
            return float(np.interp(row_bytes, xs, ys))
        return float(self.values[f"{kind}_row_efficiency"])

    def h2d_link_bytes(self, rows, row_bytes):
        return rows * row_bytes / self._eff("h2d", row_bytes)

    def d2h_link_bytes(self, rows, row_bytes):
        return rows * row_bytes / self._eff("d2h", row_bytes)

    def peer_s(self, rows, row_bytes):
        if rows <= 0:
            return 0.0
        v = self.values
        return v["nvlink_latency_s"] + rows * row_bytes / self._eff("peer", row_bytes) / v["nvlink_bw_bytes_s"]


def predict(values: dict, op: str, num_gpus: int, num_rows: int, row_bytes: int,
            topology: Topology = MEASURED_HOST) -> float:
    """The node model's time of `op` with `num_gpus` GPUs each moving `num_rows` rows at once."""
    swap = op == "swap"
    ex, _ = concurrent_exchange_s(LinkTable(values, topology), row_bytes, [num_rows] * num_gpus,
                                  [num_rows if swap else 0] * num_gpus)
    return ex


def shared_level(points: list[dict], uplink_raw_bytes_s: float = GEN5_X16_RAW_BYTES_S) -> dict:
    """Where a cap shared by all the measured GPUs can sit: the most payload bytes/s the GPUs moved together in one
    direction (read-only exchanges, k >= 2) against one switch uplink's raw rate. Above it, no single uplink carried
    them: the shared cap is at the socket."""
    rates = [p["num_gpus"] * p["num_rows"] * p["row_bytes"] / p["time_s"] for p in points
             if p["op"] == "read_only" and p["num_gpus"] >= 2]
    if not rates:
        return {"level": "unknown", "max_read_payload_bytes_s": None, "uplink_raw_bytes_s": uplink_raw_bytes_s}
    top = max(rates)
    return {"level": "socket" if top > uplink_raw_bytes_s else "switch or socket", "max_read_payload_bytes_s": top,
            "uplink_raw_bytes_s": uplink_raw_bytes_s}


def _error(values: dict, points: list[dict]) -> float:
    err = [np.log(predict(values, p["op"], p["num_gpus"], p["num_rows"], p["row_bytes"]) / p["time_s"]) ** 2
           for p in points]
    return float(np.mean(err))


def fit_host_caps(link_values: dict, points: list[dict], rounds: int = 3) -> dict:
    """Host-side caps for `link_values` (per-link keys) from measured points (op, num_gpus, num_rows, row_bytes,
    time_s). Returns {caps, error_no_caps, error, points: [... predicted_s]}."""
    pts = [p for p in points if p["op"] in FIT_OPS]
    cand = {k: set() for k in CAP_KEYS}
    for p in pts:
        if p["num_gpus"] < 2:
            continue
        agg = p["num_gpus"] * p["num_rows"] * line_bytes(p["row_bytes"]) / p["time_s"]  # line B/s, one direction
        key, base = ("pcie_host_h2d_cap_bytes_s", agg) if p["op"] == "read_only" else ("pcie_host_cap_bytes_s",
                                                                                        2 * agg)
        cand[key].update(base * f for f in np.linspace(0.7, 1.5, 41))
    caps = dict.fromkeys(CAP_KEYS)
    best = base_err = _error(link_values, pts)
    for _ in range(rounds):
        for key in CAP_KEYS:
            for c in sorted(cand[key]):
                trial = {**caps, key: c}
                e = _error({**link_values, **trial}, pts)
                if e < best * (1 - 1e-3):
                    best, caps = e, trial
    fitted = {**link_values, **caps}
    out = [{**p, "predicted_s": predict(fitted, p["op"], p["num_gpus"], p["num_rows"], p["row_bytes"])}
           for p in points if p["op"] in FIT_OPS]
    rel = [abs(p["predicted_s"] / p["time_s"] - 1) for p in out]
    return {"caps": {k: (float(v) if v else None) for k, v in caps.items()}, "error_no_caps": base_err,
            "error": best, "median_rel_err": float(np.median(rel)) if rel else None,
            "max_rel_err": float(np.max(rel)) if rel else None, "points": out, "shared_level": shared_level(pts)}


AFTER_EXCHANGE_KEY = "peer_after_exchange_latency_s"


def fit_peer_after_exchange(points: list[dict]) -> dict:
    """`peer_after_exchange_latency_s` from `hw calibrate`'s gather-after-exchange points (copybench
    `bench_gather_after_exchange`: per point after_s, warm_s, num_gpus, num_rows, exchange_rows): the gathers right
    after an exchange minus the same gathers warm, per home rank (k GPUs: k - 1 gathers each), median over points.
    Also what the model assumes, for the next look: the extra's spread, its share of the warm time, and its
    median per GPU count (per-home: flat in k; per-phase: falls as 1 / (k - 1)) and per gathered-row count."""
    if not points:
        raise ValueError("no gather-after-exchange points to fit")
    extra = np.array([(p["after_s"] - p["warm_s"]) / (p["num_gpus"] - 1) for p in points])
    lat = max(0.0, float(np.median(extra)))
    pred = [p["warm_s"] + lat * (p["num_gpus"] - 1) for p in points]
    rel = np.abs(np.array(pred) / np.array([p["after_s"] for p in points]) - 1)
    by = lambda key: {int(v): float(np.median([e for e, p in zip(extra, points) if p[key] == v]))
                      for v in sorted({p[key] for p in points})}
    return {AFTER_EXCHANGE_KEY: lat, "extra_per_home_s": [float(x) for x in extra],
            "extra_iqr_s": [float(x) for x in np.quantile(extra, [0.25, 0.75])],
            "by_num_gpus": by("num_gpus"), "by_num_rows": by("num_rows"), "by_exchange_rows": by("exchange_rows"),
            "median_rel_err": float(np.median(rel)), "max_rel_err": float(rel.max())}


def after_exchange_from_parts(run: dict, costs) -> dict:
    """The same extra from a `hw validate` TP run that timed its gathers apart (`parts_s` gather_r*: from the wait
    on the other ranks' exchanges to the end of the rank's gathers): per step and rank, the gather time minus the
    cost model's warm peer time of its rows, per home rank. A diagnostic of validation runs -- not a calibration."""
    R, rb = int(run["ranks"]), int(run["row_bytes"])
    extra, waits = [], []
    for s in run["per_step"]:
        if s.get("warmup") or "gather_r0" not in s.get("parts_s", {}):
            continue
        for r in range(R):
            rows = s["rows_per_rank"]["peer"][r]
            if rows <= 0:
                continue
            extra.append((s["parts_s"][f"gather_r{r}"] - costs.peer_s(rows, rb)) / (R - 1))
            waits.append(s["parts_s"][f"peer_r{r}"] - s["parts_s"][f"gather_r{r}"])
    if not extra:
        raise ValueError("the run has no per-rank gather timings (gather_r*): nothing to derive")
    return {AFTER_EXCHANGE_KEY: float(np.median(extra)),
            "extra_iqr_s": [float(x) for x in np.quantile(extra, [0.25, 0.75])],
            "wait_median_s": float(np.median(waits)), "samples": len(extra)}
