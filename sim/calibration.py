"""Default calibrations: the committed measurement of a preset is that preset's cost model (issue 11 item 3).

`hw/calibration/h200.yaml` (`ulacache hw calibrate`, 2 x H200, both GPUs transferring) is the reference. A config
whose hardware is the `h200` preset gets it as measured; `b300` (no B300 measured) and any hardware override get it
*derived*: every measured link ceiling is scaled by the datasheet ratio of that link (target / reference preset
field), the management pipeline's per-reference costs by the HBM bandwidth ratio (the pipeline is bound by random
HBM lookups: hw/NOTES.md), and everything else (row efficiencies, latencies, launch, constant terms) is carried over
unchanged. `DERIVATIONS` lists each rule; docs/cost-model.md states them. A data file is read, nothing of `hw` imported.
"""
from __future__ import annotations

import math
from pathlib import Path

from sim.presets import HARDWARE_PRESETS, HardwareSpec
from traces.strict_yaml import read_yaml_file

CALIBRATION_DIR = Path(__file__).resolve().parent.parent / "hw" / "calibration"
# preset name -> (reference preset whose measurement is used, calibration file name)
REFERENCE = {"h200": ("h200", "h200.yaml"), "b300": ("h200", "h200.yaml")}
# cost key -> (hardware field whose target/reference ratio scales it, exponent): value x (target/ref) ** exponent
DERIVATIONS: dict[str, tuple[str, float]] = {
    "pcie_h2d_bw_bytes_s": ("pcie_bw_bytes_s", 1.0),
    "pcie_d2h_bw_bytes_s": ("pcie_bw_bytes_s", 1.0),
    "pcie_host_h2d_cap_bytes_s": ("pcie_bw_bytes_s", 1.0),  # node model caps scale like the PCIe links
    "pcie_host_d2h_cap_bytes_s": ("pcie_bw_bytes_s", 1.0),
    "pcie_host_cap_bytes_s": ("pcie_bw_bytes_s", 1.0),
    "nvlink_bw_bytes_s": ("nvlink_bw_bytes_s", 1.0),
    "mgmt_per_ref_s": ("hbm_bw_bytes_s", -1.0),
    "mgmt_per_unique_s": ("hbm_bw_bytes_s", -1.0),
    "mgmt_per_miss_s": ("hbm_bw_bytes_s", -1.0),
    "hisparse_per_ref_s": ("hbm_bw_bytes_s", -1.0),
    "hisparse_mtp_per_ref_s": ("hbm_bw_bytes_s", -1.0),  # (hash lookups in HBM, as the non-MTP kernel's)
}
# table key -> rule for every value: HiSparse's swap-in rate is set by its blocks' bytes in flight over the PCIe read
# latency (one block per request), which a faster link does not raise: its absolute rate is carried, so its share of a
# link r times faster is divided by r.
# The MTP gather (128 blocks per request) gets the same rule, an assumption (no B300 measured): conservative where it
# is link-bound on the faster link.
TABLE_DERIVATIONS: dict[str, tuple[str, float]] = {"hisparse_swapin_efficiency_by_batch": ("pcie_bw_bytes_s", -1.0),
                                                   "hisparse_mtp_swapin_efficiency_by_batch": ("pcie_bw_bytes_s", -1.0),
                                                   # the replay's 4 fixed blocks: bytes in flight, likewise
                                                   "hisparse_planned_copy_efficiency_by_batch": ("pcie_bw_bytes_s", -1.0)}


# Validation bounds of cost values read from a calibration, a config's `costs:` or `--set costs.*` (not model
# constants: a value past them is a unit slip or a broken measurement, and would hang a replay or overflow its clock).
MAX_RATE_BYTES_S = 1e15  # 1 PB/s: 1,000x an H200's 4.8 TB/s HBM, the fastest link modelled
MAX_TIME_S = 1.0  # one launch, latency, overhead or per-reference cost over a second is a unit slip (us read as s)
MAX_COUNT = 1e6  # kernels per layer, bytes per score, draft layer equivalents: a million is far past any recipe


def _bad(where: str, key: str, what: str, value) -> ValueError:
    return ValueError(f"{where}: cost key {key} must be {what}, got {value!r}")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past float range
        return False


def check_cost_value(key: str, value, where: str) -> None:
    """One cost value: finite, and in its kind's range (rates > 0, efficiencies in (0, 1], times in [0, 1 s],
    tables {positive size: efficiency in (0, 1]}); None (the hardware figure) and unknown keys are the cost model's
    to judge. Raises a one-line ValueError naming `where` and the key."""
    if value is None or isinstance(value, str):
        return  # the cost model refuses strings by name; None means "use the hardware figure"
    if isinstance(value, dict):
        for k, v in value.items():
            if not _number(k) or not _finite(k) or k <= 0 or not _number(v) or not _finite(v) or not 0 < v <= 1:
                raise _bad(where, key, "a table of {positive size: efficiency in (0, 1]}", {k: v})
        return
    if not _number(value):
        return
    if not _finite(value):
        raise _bad(where, key, "a finite number", value)
    if key.endswith("_bytes_s"):
        if not 0 < value <= MAX_RATE_BYTES_S:
            raise _bad(where, key, f"a rate in (0, {MAX_RATE_BYTES_S:.0e}] bytes/s", value)
    elif key.endswith("_efficiency"):
        if not 0 < value <= 1:
            raise _bad(where, key, "in (0, 1] (an efficiency)", value)
    elif key.endswith("_s"):
        if not 0 <= value <= MAX_TIME_S:
            raise _bad(where, key, f"a time in [0, {MAX_TIME_S:g}] s", value)
    elif not 0 <= value <= MAX_COUNT:
        raise _bad(where, key, f"a number in [0, {MAX_COUNT:.0e}]", value)


def check_costs(costs: dict, where: str) -> None:
    """Every value of a `costs:` mapping (see check_cost_value)."""
    for key, value in costs.items():
        check_cost_value(str(key), value, where)


def read(path: Path, where: str | None = None) -> tuple[dict, dict]:
    """(costs, provenance) of a calibration file (top-level keys: provenance, costs; anything else is an error);
    every cost value finite and in range (check_costs)."""
    path = Path(path)
    if not path.is_file():
        raise OSError(f"calibration file not found: {path}")
    data = read_yaml_file(path)  # strict: duplicate keys, alias bombs and bad UTF-8 refused in one line
    if not isinstance(data, dict) or "costs" not in data:
        raise ValueError(f"{path}: a calibration file needs a top-level 'costs:' mapping")
    extra = set(data) - {"provenance", "costs"}
    if extra:
        raise ValueError(f"{path}: unknown calibration key {sorted(extra)[0]!r} (expected provenance, costs)")
    costs = data["costs"] or {}
    if not isinstance(costs, dict):
        raise ValueError(f"{path}: costs must be a mapping")
    check_costs(costs, where or str(path))
    return costs, data.get("provenance") or {}


def derive(costs: dict, reference: HardwareSpec, target: HardwareSpec) -> tuple[dict, dict]:
    """The reference calibration carried to `target`: (costs, {key: 'x ratio (field target/ref)'} for changed keys)."""
    out, notes = dict(costs), {}
    for key, (field, exponent) in DERIVATIONS.items():
        if key not in out or out[key] is None:
            continue
        ratio = (getattr(target, field) / getattr(reference, field)) ** exponent
        if abs(ratio - 1.0) > 1e-12:
            out[key] = out[key] * ratio
            notes[key] = f"x {ratio:.4g} ({field} {target.name}/{reference.name} datasheet ratio)"
    for key, (field, exponent) in TABLE_DERIVATIONS.items():
        ratio = (getattr(target, field) / getattr(reference, field)) ** exponent
        if out.get(key) and abs(ratio - 1.0) > 1e-12:
            out[key] = {k: min(1.0, float(v) * ratio) for k, v in out[key].items()}
            notes[key] = f"each x {ratio:.4g} ({field} {target.name}/{reference.name}: the absolute rate carried)"
    return out, notes


def default_for(hardware: HardwareSpec) -> tuple[dict, dict] | None:
    """(costs, provenance) of the default calibration of this hardware, or None when its preset has none."""
    ref = REFERENCE.get(hardware.name)
    if ref is None:
        return None
    ref_name, filename = ref
    path = CALIBRATION_DIR / filename
    if not path.is_file():
        return None
    costs, prov = read(path)
    costs, notes = derive(costs, HARDWARE_PRESETS[ref_name], hardware)
    provenance = {"calibration": f"hw/calibration/{filename}", "measured_on": prov.get("device", ref_name),
                  "measured_date": prov.get("date")}
    if notes:
        provenance["derived_for"] = hardware.name
        provenance["derivation"] = notes
    return costs, provenance
