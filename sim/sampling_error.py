"""The measured sampling error of a sampled-fidelity run (issue 29 item 3), for its metrics.

A replay at default fidelity samples indexer groups and requests (sim/policy.py, docs/cost-model.md "What is
sampled"). How far that moves its figures was measured by `bench/fidelity_error.py`: each paper config replayed at
its own sampled fidelity and unsampled, at one reduced scale and seed, the difference written to
`sim/data/sampling_error.json` (`--write-table`). `sampling_error(cfg)` returns the row of that table whose
measured configuration matches the run (hardware preset, attention, speculative decoding on/off, system), with the
table's provenance, so a default run states the error a run like it was measured to have. It is one measurement of
one seed at one reduced scale, not a bound: the returned dict says so (`scale`, `fidelity_matches`), with the same
measurement at other seeds where the table has them (`other_seeds`: the spread between seeds is of the same size).
Where the table has it, `paper_matched` is the error of the same reduced run with the request sample a default run
takes at paper scale (as many requests per admission space, the same pool slots per sampled request): the closer
estimate for a paper-scale default run, whose spaces sample several times more requests than the reduced default.
Where the same comparison was made at paper scale (`bench/fidelity_error.py --paper --write-table`: whole runs of
the configs as committed, the full ones on a machine with the cores for them), that row comes under `paper_scale`
in `sim/data/sampling_error_paper.json`'s provenance; and a run with the very workload measured there (the paper
config as committed, or the same requests under other settings of the same hardware, attention and drafts) gets
that measurement as its error (`measured_run`), the reduced-scale row under `reduced_scale`: at paper scale the
two disagree (docs/cost-model.md "At paper scale"), and the paper-scale one measured this run.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

TABLE_PATH = Path(__file__).resolve().parent / "data" / "sampling_error.json"
PAPER_TABLE_PATH = Path(__file__).resolve().parent / "data" / "sampling_error_paper.json"  # (`--paper`)
ERROR_KEYS = ("hit_rate_error_points", "tok_s_error_pct", "tpot_p50_error_pct")
MATCHED_KEYS = tuple(f"{k}_matched" for k in ERROR_KEYS)


@lru_cache(maxsize=4)
def load_table(path: Path = TABLE_PATH) -> dict:
    """The committed table (rows + provenance); cached per path."""
    table = json.loads(Path(path).read_text())
    for key in ("source", "date", "scale", "rows"):
        if key not in table:
            raise ValueError(f"{path}: sampling-error table lacks {key!r}")
    return table


def is_sampled(cfg) -> bool:
    """Whether the run samples the policy's work (fewer groups, a share of the requests, or skipped steps)."""
    fid = cfg.fidelity
    fraction = 1.0 if fid.request_fraction is None else fid.request_fraction
    return fid.policy_groups != 0 or fraction < 1.0 or fid.step_stride > 1 or fid.only_group >= 0


def _key(hardware: str, attention: str, spec: bool, system: str) -> tuple:
    return (str(hardware), str(attention), bool(spec), str(system))


def _match(cfg, path: Path) -> tuple[dict, dict] | None:
    """(table, the row of the run's configuration) of the table at `path`, if it exists and has one."""
    try:
        table = load_table(Path(path))
    except FileNotFoundError:
        return None
    want = _key(cfg.hardware.name, cfg.attention, cfg.spec.draft_tokens > 0, cfg.system)
    row = next((r for r in table["rows"]
                if _key(r["hardware"], r["attention"], r["spec"], r["system"]) == want), None)
    return None if row is None else (table, row)


def sampling_error(cfg, path: Path = TABLE_PATH, paper_path: Path = PAPER_TABLE_PATH) -> dict | None:
    """The measured error (default - full) of the matching configuration with its provenance (the reduced-scale
    table's, else the paper-scale one's), and under `paper_scale` the paper-scale measurement where one was made;
    None for an unsampled run or a configuration measured in neither table."""
    if not is_sampled(cfg):
        return None
    found, paper = _match(cfg, path), _match(cfg, paper_path)
    if found is None and paper is None:
        return None
    if paper is not None and _is_measured_run(cfg, paper[1]):  # this very run was measured: its error first
        out = _measured(cfg, *paper)
        if found is not None:
            out["reduced_scale"] = _measured(cfg, *found)
        return out | {"measured_run": True}
    out = _measured(cfg, *(found or paper))
    if paper is not None and found is not None:
        out["paper_scale"] = {k: v for k, v in _measured(cfg, *paper).items() if k != "other_seeds"}
    return out


def _is_measured_run(cfg, row: dict) -> bool:
    """Whether the run has the workload a paper-scale row was measured on (its `measured_workload`); its fidelity
    then says whether it also sampled as the measured default did (`fidelity_matches`)."""
    wl = row.get("measured_workload")
    return bool(wl) and all(getattr(cfg.workload, k, None) == v for k, v in wl.items())


def _measured(cfg, table: dict, row: dict) -> dict:
    """One table's row as the metrics state it, with the table's provenance."""
    fid = cfg.fidelity
    measured = row.get("default_fidelity") or {}
    same = bool(measured) and all(measured.get(k) == getattr(fid, k) for k in measured)
    out = {**{k: row.get(k) for k in ERROR_KEYS},
           "measured_config": row.get("config"), "measured_fidelity": measured, "fidelity_matches": same,
           "other_seeds": [{k: o.get(k) for k in ("seed", *ERROR_KEYS)} for o in row.get("other_seeds", [])]}
    if row.get("hit_rate_only"):  # a full run's hit rate from its groups alone: no throughput to compare
        out["hit_rate_only"] = True
    if all(k in row for k in MATCHED_KEYS):
        out["paper_matched"] = {
            **{k[:-len("_matched")]: row[k] for k in MATCHED_KEYS},
            "sampled_per_space": row.get("sampled_per_space_matched"),
            "request_sample_stride": row.get("request_sample_stride_matched"),
            "other_seeds": [{"seed": o.get("seed"), **{k[:-len("_matched")]: o[k] for k in MATCHED_KEYS}}
                            for o in row.get("other_seeds", []) if all(k in o for k in MATCHED_KEYS)]}
    return {**out,
            "source": table["source"], "date": table["date"], "commit": table.get("commit"),
            "scale": table["scale"], "definition": table.get("definition")}
