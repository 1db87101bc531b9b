"""HiSparse's cost formulas, beside HiSparse rather than inside the shared `CostModel`.

SGLang's HiSparse swaps missed KV rows in with its own kernels, which the other systems never run: the plain fused
swap-in kernel (hash plan + LRU + copy from pinned host memory; `hisparse_swapin_fixed_s`, `hisparse_per_ref_s`,
`hisparse_swapin_efficiency_by_batch`, scalar fallback `hisparse_swapin_efficiency`), the MTP gather + commit launch
pair for all verify tokens (`hisparse_mtp_swapin_fixed_s`, `hisparse_mtp_per_ref_s`,
`hisparse_mtp_swapin_efficiency_by_batch`) and IndexShare's replay of the anchor's planned copies on the skip layers
(copy_cache_planned: `hisparse_planned_copy_fixed_s`, `hisparse_planned_copy_efficiency_by_batch`). Null or empty MTP
keys fall back to the plain kernel's; an unmeasured replay moves its rows at the exchange's efficiency with no fixed
time. `HiSparseCosts` wraps a `CostModel` and reads only its public API (`values`, `kernel_overhead_s`,
`row_efficiency`), so the shared model holds no system's mechanism.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sim.costs import CostModel


def _log_interp(x: float, table: dict) -> float:
    """Table lookup interpolated in log(x) (batch sizes 1, 4, 16, ...), clamped at the ends."""
    xs = np.log(np.array(sorted(float(k) for k in table)))
    ys = np.array([float(table[k]) for k in sorted(table, key=float)])
    return float(np.interp(np.log(max(float(x), 1e-9)), xs, ys))


class HiSparseCosts:
    """HiSparse's swap-in costs on one `CostModel` (`costs`); per-batch efficiencies memoised (asked every layer)."""

    def __init__(self, costs: CostModel):
        self.costs = costs
        self._swapin_eff: dict = {}  # (batch, mtp) -> efficiency

    def _key(self, role: str, mtp: bool):
        """A swap-in constant: with `mtp`, SGLang's MTP launch pair's (`hisparse_mtp_<role>`) where measured, else
        the non-MTP kernel's (`hisparse_<role>`)."""
        values = self.costs.values
        if mtp:
            value = values.get(f"hisparse_mtp_{role}")
            if value is not None and value != {}:
                return value
        return values[f"hisparse_{role}"]

    def swapin_efficiency(self, batch: float, mtp: bool = False) -> float:
        """Share of the PCIe H2D ceiling the swap-in's copies reach with `batch` requests: the calibration's
        per-batch table (non-MTP: one thread block per request copies its misses from pinned host memory; MTP: the
        multi-block gather of the unique misses, where measured), else the scalar fallback (the naive zero-copy
        gather, docs/architecture.md)."""
        key = (batch, mtp)
        eff = self._swapin_eff.get(key)
        if eff is None:
            table = self._key("swapin_efficiency_by_batch", mtp) or {}
            eff = (_log_interp(max(batch, 1.0), table) if table
                   else float(self.costs.values["hisparse_swapin_efficiency"]))
            self._swapin_eff[key] = eff
        return eff

    def swapin_link_bytes(self, num_rows: float, row_bytes: float, batch: float, mtp: bool = False) -> float:
        """PCIe occupancy of the swap-in's copies: what the link carries (the calibrated exchange efficiency, or the
        swap-in's own where higher). Its rate limit at small batch is not link occupancy (a few blocks cannot fill
        the link, others may use it): that excess is `swapin_excess_s`, on the compute stream."""
        eff = max(self.swapin_efficiency(batch, mtp), self.costs.row_efficiency("h2d", row_bytes))
        return num_rows * row_bytes / eff

    def swapin_excess_s(self, num_rows: float, row_bytes: float, batch: float, mtp: bool = False) -> float:
        """Time the swap-in kernel's copies take beyond the link's own time: rows / (bandwidth x efficiency(batch))
        minus the occupancy's time, when its blocks are too few to fill the link."""
        if num_rows <= 0:
            return 0.0
        bw = self.costs.values["pcie_h2d_bw_bytes_s"]
        alone = num_rows * row_bytes / (bw * self.swapin_efficiency(batch, mtp))
        return max(0.0, alone - self.swapin_link_bytes(num_rows, row_bytes, batch, mtp) / bw)

    def replay_link_bytes(self, num_rows: float, row_bytes: float, batch: float) -> float:
        """PCIe occupancy of one IndexShare skip layer's replay of the anchor's copies (SGLang's copy_cache_planned on
        its side stream): the call's fixed time (`hisparse_planned_copy_fixed_s`) + the rows at its efficiency at
        `batch` (`hisparse_planned_copy_efficiency_by_batch`), as the bytes the link would move in that time: the
        replays run back to back on the side stream, so the layer waiting for them waits that long. Unmeasured: the
        rows at the exchange kernel's efficiency, no fixed time."""
        if num_rows <= 0:
            return 0.0
        values = self.costs.values
        table = values.get("hisparse_planned_copy_efficiency_by_batch") or {}
        eff = _log_interp(max(batch, 1.0), table) if table else self.costs.row_efficiency("h2d", row_bytes)
        fixed = values.get("hisparse_planned_copy_fixed_s") or 0.0
        return num_rows * row_bytes / eff + fixed * values["pcie_h2d_bw_bytes_s"]

    def management_s(self, num_refs: float, num_calls: int = 1, mtp: bool = False) -> float:
        """The swap-in on one layer, without its copies: `num_calls` x the fixed time of one call + the per
        reference time x `num_refs` (top-k references; MTP: every occurrence of every verify token). Non-MTP, a call is
        one fused kernel (hash plan + LRU + copy; `hisparse_swapin_fixed_s`, at least one graph kernel); MTP
        (`mtp`), one gather + commit launch pair for all verify tokens (`hisparse_mtp_swapin_fixed_s`, at least two
        graph kernels). The fixed times were measured as whole kernel times (host memory read by the kernel itself):
        no copy-call latency is added to its copies (sim/timing.py `h2d_pays_latency`)."""
        if num_refs <= 0:
            return 0.0
        fixed = max(self.costs.kernel_overhead_s(2 if mtp else 1), self._key("swapin_fixed_s", mtp))
        return num_calls * fixed + self._key("per_ref_s", mtp) * num_refs
