"""The bad-input contract (issue 12 Deliver 2), as a corpus: every hostile input below is refused by the real front
door with exit status 2 and exactly one `ulacache: error:` line on stderr (no traceback), and the workspace on disk
is byte-identical afterwards (nothing written, nothing half-written, no temporaries). Library calls raise
ValueError / CapacityError and leave the cache as it was. Each command is refused before any heavy work, so the
whole file runs in seconds (in-process `main(argv)` is the same code path as the `ulacache` script).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from ulacache_cli.main import main

TINY = {"system": "sglang", "attention": "dp", "hardware": {"num_gpus": 2}, "model": {"weight_bytes": 100e9},
        "workload": {"profile": "small", "num_requests": 2, "max_steps": 3}}
BOMB = "\n".join(["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
    f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]" for p, c in zip("abcdefgh", "bcdefghi")])


def _cfg(**changes) -> str:
    tree = json.loads(json.dumps(TINY))
    for dotted, value in changes.items():
        node, parts = tree, dotted.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return yaml.safe_dump(tree)


# name -> file content (str or bytes) created in the workspace
FILES = {
    "good.yaml": _cfg(),
    "empty.yaml": "",
    "notyaml.yaml": "system: [unclosed\n  - : :\n",
    "list.yaml": "- system\n- sglang\n",
    "dupkey.yaml": "system: sglang\nattention: dp\nsystem: ulacache\n",
    "dupnested.yaml": "workload:\n  num_requests: 2\n  seed: 1\n  seed: 2\n",
    "bomb.yaml": "costs:\n" + "".join(f"  {line}\n" for line in BOMB.splitlines()),
    "recursive.yaml": "costs: &r\n  self: *r\n",
    "deep.yaml": "costs: " + "[" * 20000 + "]" * 20000 + "\n",
    "badutf8.yaml": b"system: sgl\xffang\n",
    "unknown.yaml": _cfg(colour="blue"),
    "unknown_nested.yaml": _cfg(workload__bogus=1),
    "wrongtype.yaml": _cfg(workload__num_requests="many"),
    "nan_budget.yaml": _cfg().replace("system: sglang", "system: sglang\nmemory: {gpu_kv_bytes_per_gpu: .nan}"),
    "inf_budget.yaml": _cfg().replace("system: sglang", "system: sglang\nmemory: {cpu_kv_bytes_per_gpu: .inf}"),
    "neg_budget.yaml": _cfg(memory__gpu_kv_bytes_per_gpu=-1.0),
    "inf_hbm.yaml": _cfg().replace("num_gpus: 2", "num_gpus: 2\n  hbm_bytes: .inf"),
    "tp3.yaml": _cfg(attention="tp", hardware__num_gpus=3),
    "draft100.yaml": _cfg(spec__draft_tokens=100),
    "seed_huge.yaml": _cfg(workload__seed=2**70),
    "listcfg_profile.yaml": "input_tokens: {median_tokens: 100, sigma: 0.1}\ninput_tokens: {median_tokens: 5, "
                            "sigma: 0.1}\noutput_tokens: {median_tokens: 5, sigma: 0.1}\n",
    # request lists
    "huge_tokens.csv": "input_tokens,output_tokens\n1e20,10\n",
    "neg_tokens.csv": "input_tokens,output_tokens\n-5,10\n",
    "missing_col.csv": "input_tokens\n100\n",
    "empty.csv": "",
    "ragged.csv": "input_tokens,output_tokens\n100,10,7\n",
    "badutf8.csv": b"input_tokens,output_tokens\n1\xff0,10\n",
    "tokens_2e40.jsonl": json.dumps({"input_tokens": 2**40, "output_tokens": 3}) + "\n",
    "notjson.jsonl": "{\"input_tokens\": 5,\n",
    "dup_ids.csv": "request_id,input_tokens,output_tokens\n1,100,10\n1,100,10\n",
    # captures
    "cap_badjson.jsonl": json.dumps({"request": 1, "step": 0, "group": 0, "positions": [1, 2]}) + "\n{nope\n",
    "cap_empty.jsonl": "\n",
    "cap_negative.jsonl": json.dumps({"request": 1, "step": 0, "group": 0, "positions": [-5, 2],
                                      "history_len": 10}) + "\n",
    "cap_beyond.jsonl": json.dumps({"request": 1, "step": 0, "group": 0, "positions": [50],
                                    "history_len": 10}) + "\n",
    "cap_good.jsonl": "\n".join(json.dumps({"request": 1, "step": s, "group": 0, "positions": [1, 2, 3],
                                            "history_len": 10}) for s in range(2)) + "\n",
    "cap_corrupt.npz": b"PK\x03\x04 not really a zip",
    "afile": "I am a file, not a directory\n",
    # calibrations
    "cal_dupkey.yaml": "costs:\n  launch_s: 4.0e-6\n  launch_s: 9.0e-6\n",
    "cal_bomb.yaml": "provenance:\n" + "".join(f"  {line}\n" for line in BOMB.splitlines()) + "costs: {}\n",
    # ---- issue 27: non-finite / out-of-range floats in configs and calibrations, named by key
    "nan_costs.yaml": _cfg().replace("system: sglang", "system: sglang\ncosts: {launch_s: .nan, cuda_graphs: 0}"),
    "neg_cost.yaml": _cfg(costs__mgmt_per_ref_s=-1e-9),
    "zero_bw_cost.yaml": _cfg(costs__pcie_h2d_bw_bytes_s=0),
    "nan_gpus.yaml": _cfg().replace("num_gpus: 2", "num_gpus: .nan"),
    "big_gpus.yaml": _cfg().replace("num_gpus: 2", "num_gpus: 1e400"),
    "tiny_pcie.yaml": _cfg().replace("num_gpus: 2", "num_gpus: 2\n  pcie_bw_bytes_s: 1e-300"),
    "zero_gpu_kv.yaml": _cfg(memory__gpu_kv_bytes_per_gpu=0),
    "cal_nan.yaml": "costs:\n  hisparse_per_ref_s: .nan\n",
    "cal_inf.yaml": "costs:\n  step_overhead_s: .inf\n",
    "cal_neg.yaml": "costs:\n  launch_s: -4e-6\n",
    "cal_zero_bw.yaml": "costs:\n  nvlink_bw_bytes_s: 0\n",
    "cal_huge_latency.yaml": "costs:\n  pcie_latency_s: 1e300\n",
    "cal_nan_table.yaml": "costs:\n  h2d_row_efficiency_by_bytes: {656: .nan}\n",
    "cal_eff_2.yaml": "costs:\n  peer_row_efficiency: 2.0\n",
    # ---- issue 27: request lists
    "quote_128k.csv": "input_tokens,output_tokens\n\"" + "9" * 140_000 + "\n",
    "bom_badcol.csv": "\ufeffinput_tokens,outputs\n100,10\n",
    "rows_1m.csv": "input_tokens,output_tokens\n" + "1,1\n" * 1_000_001,
    # ---- issue 27: plans a report cannot draw
    "badplan_systems_int/plan.json": '{"systems": 5}',
    "badplan_entry_int/plan.json": '{"systems": {"sglang": 5}}',
    "badplan_best_int/plan.json": '{"systems": {"sglang": {"best": 3}}}',
    "badplan_evals/plan.json": '{"systems": {"sglang": {"evaluations": 7}}}',
    "badplan_zero_tput/plan.json": '{"systems": {"sglang": {"evaluations": [{"ok": true, "concurrency": 1, '
                                   '"throughput_tok_s": 0, "tpot_ms": 1}]}}}',
    "badplan_nan/plan.json": '{"systems": {"sglang": {"best": {"concurrency": 1, "throughput_tok_s": NaN, '
                             '"tpot_ms": 1, "admitted": 1}}}}',
    "badplan_truncated/plan.json": '{"systems": {"sglang": {"best": ',
    # ---- issue 27: outputs that are not ours (--force must refuse them)
    "foreign_run/notes.txt": "not a result\n",
    "foreign_run/config.yaml": "system: sglang\n",
    "foreign_run/data/keep.bin": b"\x00\x01",
    "foreign_trace/trace.yaml": "kind: ulacache-trace\n",
    "website/index.html": "<html>my website</html>\n",
    "foreign_plan/plan.json": '{"systems": {}}\n',
    "foreign_sens/sensitivity.json": "{}\n",
    ".foreign_sens.old/precious.txt": "a sibling the old sensitivity --force deleted\n",
    "pc/policy_compare.csv": "policy,hit_ratio\n",
    "theirs.json": "{}\n",
    "theirs.yaml": "costs: {}\n",
    "replay_with_sweep_yaml/sweep.yaml": "points: []\n",
    "replay_with_sweep_yaml/.ulacache-manifest.json": json.dumps({"tool": "ulacache", "format": 1,
                                                                  "command": "replay", "files": {}}),
}


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for name, content in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    _issue27_files(root)
    # a previous replay run, a plan, a report, a sweep and a non-result dir that a bad command must not touch
    (root / "run").mkdir()
    (root / "run" / "metrics.json").write_text('{"system": "sglang"}\n')
    (root / "run" / "config.yaml").write_text("system: sglang\n")
    (root / "mine").mkdir()
    (root / "mine" / "notes.txt").write_text("not a result\n")
    (root / "plan").mkdir()
    (root / "plan" / "plan.json").write_text('{"systems": {}}\n')
    (root / "sweep").mkdir()
    (root / "sweep" / "results.csv").write_text("point_id,status\n")
    (root / "events.json").write_text("{}\n")
    (root / "emptydir").mkdir()
    (root / "runlink").symlink_to(root / "run")
    one = {"request": np.array([1]), "step": np.array([0]), "group": np.array([0])}
    np.savez(root / "cap_float.npz", **one, positions=np.array([[1.5, 2.0]]))
    np.savez(root / "cap_strings.npz", **{**one, "request": np.array(["a"])}, positions=np.array([[1, 2]]))
    np.savez(root / "cap_ragged.npz", **one, positions=np.zeros((2, 3), np.int64))
    # a good trace and broken copies of it
    assert main(["trace", "gen", "--profile", "small", "--num-requests", "3", "--num-groups", "2",
                 "--out", str(root / "trace")]) == 0
    import shutil

    for name in ("trace_bigtok", "trace_dupmeta", "trace_schema"):
        shutil.copytree(root / "trace", root / name)
    table = pq.read_table(root / "trace" / "requests.parquet")
    cols = {n: table.column(n).to_numpy() for n in table.column_names}
    cols["input_tokens"] = np.full_like(cols["input_tokens"], 2**40)
    pq.write_table(pa.table(cols).replace_schema_metadata(table.schema.metadata),
                   root / "trace_bigtok" / "requests.parquet")
    meta = (root / "trace" / "trace.yaml").read_text()
    (root / "trace_dupmeta" / "trace.yaml").write_text(meta + "profile: twice\n")
    (root / "trace_schema" / "trace.yaml").write_text(meta.replace("schema_version: 1", "schema_version: 99"))
    return root


def _issue27_files(root: Path) -> None:
    """Links, stored measurement JSON with one broken value, and outputs of other commands (issue 27)."""
    (root / "link_to_file").symlink_to(root / "theirs.json")
    (root / "pc" / ".policy_compare.json.tmp").symlink_to(root / "theirs.json")  # the old fixed temp name
    raw = json.loads(RAW_CALIBRATION.read_text())
    for name, path, value in (("raw_nan", ("launch", "launch_device_gap_s"), float("nan")),
                              ("raw_inf", ("ceilings", "p2p_gb_s"), float("inf")),
                              ("raw_neg_latency", ("launch", "launch_device_gap_s"), -4.5e-6),
                              ("raw_neg_bw", ("ceilings", "h2d_gb_s"), -55.0)):
        bad = json.loads(json.dumps(raw))
        bad[path[0]][path[1]] = value
        (root / f"{name}.json").write_text(json.dumps(bad))
    (root / "raw_1e400.json").write_text(RAW_CALIBRATION.read_text().replace('"h2d_gb_s": ', '"h2d_gb_s": 1e400, '
                                                                            '"was": ', 1))
    (root / "raw_list.json").write_text("[1, 2]")
    run = json.loads(VALIDATE_RUN.read_text())
    timed = next(i for i, st in enumerate(run["per_step"]) if "measured_s" in st and not st.get("warmup"))
    for name, key, value in (("run_measured_0", "measured_s", 0), ("run_measured_neg", "measured_s", -1e-4),
                             ("run_measured_str", "measured_s", "fast"), ("run_refs_neg", "num_refs", -1),
                             ("run_rows_bad", "rows_per_rank", {"h2d": [1], "d2h": "x", "peer": []})):
        bad = json.loads(json.dumps(run))
        bad["per_step"][timed][key] = value
        (root / f"{name}.json").write_text(json.dumps(bad))
    bad = json.loads(json.dumps(run))
    del bad["per_step"][timed]["num_refs"]
    (root / "run_no_refs.json").write_text(json.dumps(bad))
    (root / "run_nan.json").write_text(VALIDATE_RUN.read_text().replace('"measured_s": ', '"measured_s": NaN, "x": ',
                                                                      1))


ROOT = Path(__file__).resolve().parent.parent
RAW_CALIBRATION = ROOT / "hw" / "results" / "calibration.json"
VALIDATE_RUN = ROOT / "hw" / "results" / "validate_tp2.json"


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """Files past the read limits (sparse: their size is checked before anything is read); kept out of `ws` so
    the per-case snapshot does not hash them."""
    root = tmp_path_factory.mktemp("big")
    for name, size in (("config_50mb.yaml", 50 << 20), ("requests_200mb.csv", 200 << 20),
                       ("requests_200mb.jsonl", 200 << 20), ("raw_300mb.json", 300 << 20)):
        with open(root / name, "wb") as fh:
            fh.truncate(size)
    (root / "rows_10m.csv").write_bytes(b"input_tokens,output_tokens\n" + b"1,1\n" * 10_000_000)  # 40 MB
    return root


R = ["replay", "{ws}/good.yaml", "--out", "{ws}/o", "--quiet"]  # a replay that would run


def replay(*extra, cfg="good.yaml"):
    return ["replay", f"{{ws}}/{cfg}", "--out", "{ws}/o", "--quiet", *extra]


def gen(*extra):
    return ["trace", "gen", "--profile", "small", "--out", "{ws}/t", *extra]


def sweep(*extra, cfg="good.yaml"):
    return ["sweep", f"{{ws}}/{cfg}", "--out", "{ws}/s", "--workers", "1", "--no-progress", *extra]


PLAN = ["plan", "--model", "glm-5.2", "--hardware", "h200", "--slo-tpot-ms", "50", "--config", "{ws}/good.yaml"]

CASES = [
    # ---- replay configs
    ("config-missing", replay(cfg="nope.yaml"), "config file not found"),
    ("config-not-yaml", replay(cfg="notyaml.yaml"), "not valid YAML"),
    ("config-a-list", replay(cfg="list.yaml"), "must be a YAML mapping"),
    ("config-duplicate-key", replay(cfg="dupkey.yaml"), "duplicate key 'system' at line 3"),
    ("config-duplicate-nested-key", replay(cfg="dupnested.yaml"), "duplicate key 'seed'"),
    ("config-alias-bomb", replay(cfg="bomb.yaml"), "alias bomb"),
    ("config-recursive-alias", replay(cfg="recursive.yaml"), "recursive YAML alias"),
    ("config-nested-too-deep", replay(cfg="deep.yaml"), "nested too deeply"),
    ("config-bad-utf8", replay(cfg="badutf8.yaml"), "badutf8.yaml: not UTF-8 text (byte 0xff at offset 11)"),
    ("config-unknown-key", replay(cfg="unknown.yaml"), "unknown config key 'colour'"),
    ("config-unknown-nested-key", replay(cfg="unknown_nested.yaml"), "unknown config key 'workload.bogus'"),
    ("config-wrong-type", replay(cfg="wrongtype.yaml"), "workload.num_requests must be an integer"),
    ("config-nan-budget", replay(cfg="nan_budget.yaml"), "memory.gpu_kv_bytes_per_gpu must be a finite number"),
    ("config-inf-budget", replay(cfg="inf_budget.yaml"), "memory.cpu_kv_bytes_per_gpu must be a finite number"),
    ("config-negative-budget", replay(cfg="neg_budget.yaml"), "memory.gpu_kv_bytes_per_gpu must be >= 0"),
    ("config-inf-hbm", replay(cfg="inf_hbm.yaml"), "hardware.hbm_bytes must be a finite number"),
    ("config-tp-3-gpus", replay(cfg="tp3.yaml"), "must divide glm-5.2's 64 attention heads"),
    ("config-draft-100", replay(cfg="draft100.yaml"), "spec.draft_tokens must be in [0, 16]"),
    ("config-seed-2^70", replay(cfg="seed_huge.yaml"), "workload.seed"),
    # ---- --set overrides
    ("set-no-equals", replay("--set", "system"), "expected dotted.key=value"),
    ("set-empty-part", replay("--set", "workload..seed=1"), "expected dotted.key=value"),
    ("set-nan-budget", replay("--set", "memory.gpu_kv_bytes_per_gpu=.nan"), "must be a finite number, got nan"),
    ("set-inf-hbm", replay("--set", "hardware.hbm_bytes=.inf"), "hardware.hbm_bytes must be a finite number"),
    ("set-num-requests-1e9", replay("--set", "workload.num_requests=1000000000"), "must be <= 1,000,000"),
    ("set-num-requests-0", replay("--set", "workload.num_requests=0"), "workload.num_requests must be >= 1"),
    ("set-num-requests-nan", replay("--set", "workload.num_requests=.nan"), "must be an integer, got nan"),
    ("set-max-concurrency-0", replay("--set", "workload.max_concurrency=0"), "max_concurrency must be >= 1"),
    ("set-seed-negative", replay("--set", "workload.seed=-1"), "workload.seed must be in [0, 2^32 - 1]"),
    ("set-seed-2^40", replay("--set", "workload.seed=1099511627776"), "workload.seed must be in [0, 2^32 - 1]"),
    ("set-draft-negative", replay("--set", "spec.draft_tokens=-1"), "spec.draft_tokens must be >= 0"),
    ("set-draft-17", replay("--set", "spec.draft_tokens=17"), "spec.draft_tokens must be in [0, 16]"),
    ("set-tp-6-gpus-deepseek", replay("--set", "attention=tp", "--set", "hardware.num_gpus=6", "--set",
                                      "model.preset=deepseek-v3.2"), "128 attention heads"),
    ("set-num-gpus-0", replay("--set", "hardware.num_gpus=0"), "hardware.num_gpus must be positive"),
    ("set-num-gpus-1000", replay("--set", "hardware.num_gpus=1000"), "hardware.num_gpus must be in [1, 72]"),
    ("set-unknown-system", replay("--set", "system=vllm"), "system must be one of"),
    ("set-unknown-model", replay("--set", "model.preset=gpt-9"), "unknown model.preset"),
    ("set-request-fraction-0", replay("--set", "fidelity.request_fraction=0"), "request_fraction must be in (0, 1]"),
    ("set-policy-groups-99", replay("--set", "fidelity.policy_groups=99"), "fidelity.policy_groups must be in"),
    ("set-accept-probs-length", replay("--set", "spec.draft_tokens=4", "--set", "spec.accept_probs=[0.5,0.5]"),
     "spec.accept_probs must be 4 probabilities"),
    ("set-buffer-below-topk", replay("--set", "hisparse.device_buffer_slots=100"), "device_buffer_slots must be >="),
    ("set-host-fraction-1.5", replay("--set", "memory.host_kv_fraction=1.5"), "host_kv_fraction must be in (0, 1]"),
    ("set-overflowing-int", replay("--set", "workload.max_steps=" + "9" * 30), "within +-(2^63 - 1)"),
    ("set-alias-bomb", replay("--set", "costs={" + BOMB.replace("\n", ", ") + "}"), "alias bomb"),
    ("set-duplicate-key", replay("--set", "costs={a: 1, a: 2}"), "duplicate key 'a'"),
    ("set-pool-10^12-slots", replay("--set", "system=ulacache", "--set", "ulacache.gpu_pool_slots=1000000000000"),
     "do not fit the GPU KV budget"),
    ("set-max-memory-negative", replay("--max-memory-gb", "-1"), "--max-memory-gb must be a finite number > 0"),
    ("set-max-memory-nan", replay("--max-memory-gb", "nan"), "--max-memory-gb must be a finite number > 0"),
    ("set-dense-map-gb-0", replay("--dense-map-gb", "0"), "--dense-map-gb must be a number > 0 and <= 1000"),
    ("set-dense-map-gb-inf", replay("--dense-map-gb", "inf"), "--dense-map-gb must be a number > 0 and <= 1000"),
    ("usage-bad-int", gen("--num-requests", "many"), "invalid int value: 'many'"),
    ("usage-missing-out", ["replay", "{ws}/good.yaml"], "the following arguments are required: --out"),
    ("usage-unknown-command", ["frobnicate"], "invalid choice: 'frobnicate'"),
    # ---- output paths
    ("out-is-a-file", ["replay", "{ws}/good.yaml", "--out", "{ws}/afile", "--quiet"], "exists and is not a directory"),
    ("out-under-a-file", ["replay", "{ws}/good.yaml", "--out", "{ws}/afile/o", "--quiet"], "is not a directory"),
    ("out-existing-run", ["replay", "{ws}/good.yaml", "--out", "{ws}/run", "--quiet"], "pass --force to replace it"),
    ("out-force-on-foreign-dir", ["replay", "{ws}/good.yaml", "--out", "{ws}/mine", "--quiet", "--force"],
     "not written by ulacache"),
    ("out-is-a-symlink", ["replay", "{ws}/good.yaml", "--out", "{ws}/runlink", "--quiet", "--force"],
     "is a symbolic link"),
    ("out-trace-events-exists", replay("--trace-events", "{ws}/events.json"), "events.json: exists; pass --force"),
    ("out-trace-events-is-dir", replay("--trace-events", "{ws}/mine", "--force"), "is a directory"),
    # ---- traces given to replay / inspect
    ("trace-missing", replay("--trace", "{ws}/nowhere"), "no such trace directory"),
    ("trace-2^40-tokens", replay("--trace", "{ws}/trace_bigtok"), "input_tokens = 1,099,511,627,776 > 1,048,576"),
    ("trace-duplicate-meta-key", replay("--trace", "{ws}/trace_dupmeta"), "duplicate key 'profile'"),
    ("trace-unknown-schema", ["trace", "inspect", "{ws}/trace_schema"], "unknown schema_version 99"),
    ("trace-inspect-not-a-trace", ["trace", "inspect", "{ws}/mine"], "missing (not a trace directory)"),
    ("trace-inspect-bigtok", ["trace", "inspect", "{ws}/trace_bigtok"], "> 1,048,576"),
    ("trace-inspect-zero-samples", ["trace", "inspect", "{ws}/trace", "--sample-steps", "0"],
     "--sample-steps must be >= 1"),
    ("trace-inspect-1e9-steps", ["trace", "inspect", "{ws}/trace", "--sample-steps", "1000000000"],
     "--sample-steps must be in [1, 4,096]"),
    ("trace-inspect-1e5-query-tokens", ["trace", "inspect", "{ws}/trace", "--query-tokens", "100000"],
     "--query-tokens must be in [1, 16]"),
    ("trace-inspect-negative-seed", ["trace", "inspect", "{ws}/trace", "--seed", "-1"], "--seed must be in [0,"),
    # ---- trace gen
    ("gen-capture-steps-1e5", ["trace", "gen", "--num-requests", "100", "--capture-steps", "100000", "--out",
                               "{ws}/t"], "lower --capture-steps"),
    ("gen-1e5-query-tokens", gen("--num-requests", "2", "--capture-steps", "2", "--query-tokens", "100000"),
     "--query-tokens must be in [1, 16]"),
    ("gen-zero-requests", gen("--num-requests", "0"), "--num-requests must be in [1, 1,000,000]"),
    ("gen-1e9-requests", gen("--num-requests", "1000000000"), "--num-requests must be in [1, 1,000,000]"),
    ("gen-no-requests", gen(), "--num-requests is required"),
    ("gen-seed-2^70", gen("--num-requests", "2", "--seed", str(2**70)), "seed must be an integer in [0, 2^32 - 1]"),
    ("gen-seed-negative", gen("--num-requests", "2", "--seed", "-3"), "seed must be an integer in [0, 2^32 - 1]"),
    ("gen-unknown-profile", gen("--num-requests", "2", "--profile", "nope"), "unknown profile 'nope'"),
    ("gen-profile-duplicate-key", gen("--num-requests", "2", "--profile", "{ws}/listcfg_profile.yaml"),
     "duplicate key 'input_tokens'"),
    ("gen-zero-groups", gen("--num-requests", "2", "--num-groups", "0"), "num_groups must be an integer in [1, 255]"),
    ("gen-bad-rate", gen("--num-requests", "2", "--arrival", "poisson", "--rate", "-1"), "rate_per_s"),
    ("gen-out-existing-trace", ["trace", "gen", "--num-requests", "2", "--out", "{ws}/trace"],
     "pass --force to replace it"),
    ("gen-force-on-foreign-dir", ["trace", "gen", "--num-requests", "2", "--out", "{ws}/mine", "--force"],
     "not written by ulacache"),
    ("gen-out-is-a-file", ["trace", "gen", "--num-requests", "2", "--out", "{ws}/afile"], "not a directory"),
    # ---- request lists (CSV / JSONL)
    ("csv-1e20-tokens", gen("--from-csv", "{ws}/huge_tokens.csv"), "huge_tokens.csv: line 2: input_tokens"),
    ("csv-negative-tokens", gen("--from-csv", "{ws}/neg_tokens.csv"), "neg_tokens.csv: line 2: input_tokens"),
    ("csv-missing-column", gen("--from-csv", "{ws}/missing_col.csv"), "missing 'output_tokens'"),
    ("csv-empty", gen("--from-csv", "{ws}/empty.csv"), "empty file"),
    ("csv-ragged", gen("--from-csv", "{ws}/ragged.csv"), "line 2: 3 fields, header has 2"),
    ("csv-bad-utf8", gen("--from-csv", "{ws}/badutf8.csv"), "badutf8.csv: line 2: input_tokens"),
    ("csv-duplicate-ids", gen("--from-csv", "{ws}/dup_ids.csv"), "duplicate request_id"),
    ("csv-missing-file", gen("--from-csv", "{ws}/nope.csv"), "nope.csv: no such file"),
    ("jsonl-2^40-tokens", gen("--from-csv", "{ws}/tokens_2e40.jsonl"), "<= 1,048,576"),
    ("jsonl-not-json", gen("--from-csv", "{ws}/notjson.jsonl"), "line 1: not valid JSON"),
    # ---- captures (trace convert)
    ("capture-bad-json", ["trace", "convert", "{ws}/cap_badjson.jsonl", "--out", "{ws}/c"], "line 2: not valid JSON"),
    ("capture-bad-json-force-over-trace", ["trace", "convert", "{ws}/cap_badjson.jsonl", "--out", "{ws}/trace",
                                           "--force"], "not valid JSON"),
    ("capture-missing", ["trace", "convert", "{ws}/nope.jsonl", "--out", "{ws}/c"], "no such file"),
    ("capture-empty", ["trace", "convert", "{ws}/cap_empty.jsonl", "--out", "{ws}/c"], "no records"),
    ("capture-negative-position", ["trace", "convert", "{ws}/cap_negative.jsonl", "--out", "{ws}/c"], "cap_negative"),
    ("capture-position-beyond-history", ["trace", "convert", "{ws}/cap_beyond.jsonl", "--out", "{ws}/c"],
     "cap_beyond"),
    ("capture-corrupt-npz", ["trace", "convert", "{ws}/cap_corrupt.npz", "--out", "{ws}/c"], "cap_corrupt.npz"),
    ("capture-npz-float-positions", ["trace", "convert", "{ws}/cap_float.npz", "--out", "{ws}/c"],
     "array 'positions' must hold integers, found 1.5"),
    ("capture-npz-string-ids", ["trace", "convert", "{ws}/cap_strings.npz", "--out", "{ws}/c"],
     "array 'request' must hold integers"),
    ("capture-npz-lengths-disagree", ["trace", "convert", "{ws}/cap_ragged.npz", "--out", "{ws}/c"],
     "arrays disagree in length"),
    ("capture-top-k-too-small", ["trace", "convert", "{ws}/cap_good.jsonl", "--out", "{ws}/c", "--top-k", "2"],
     "exceed --top-k 2"),
    ("capture-out-existing", ["trace", "convert", "{ws}/cap_good.jsonl", "--out", "{ws}/trace"], "pass --force"),
    # ---- sweeps
    ("sweep-no-grid", sweep(), "no --grid given"),
    ("sweep-grid-no-equals", sweep("--grid", "system"), "bad --grid 'system'"),
    ("sweep-grid-repeated-key", sweep("--grid", "system=sglang", "--grid", "system=hisparse"), "given twice"),
    ("sweep-grid-empty-value", sweep("--grid", "system=sglang,,hisparse"), "empty value in the list"),
    ("sweep-grid-repeated-value", sweep("--grid", "system=sglang,sglang"), "repeated value"),
    ("sweep-grid-bad-value", sweep("--grid", "system=sglang,vllm"), "grid point system=vllm"),
    ("sweep-grid-unknown-key", sweep("--grid", "colour=red,blue"), "unknown config key 'colour'"),
    ("sweep-grid-draft-100", sweep("--grid", "spec.draft_tokens=4,100"), "spec.draft_tokens must be in [0, 16]"),
    ("sweep-alias-bomb", sweep("--grid", "system=sglang,hisparse", cfg="bomb.yaml"), "alias bomb"),
    ("sweep-duplicate-key", sweep("--grid", "system=sglang", cfg="dupkey.yaml"), "duplicate key 'system'"),
    ("sweep-out-not-empty", ["sweep", "{ws}/good.yaml", "--grid", "system=sglang", "--out", "{ws}/mine",
                             "--workers", "1"], "pass --resume"),
    ("sweep-resume-nothing", ["sweep", "{ws}/good.yaml", "--grid", "system=sglang", "--out", "{ws}/emptydir",
                              "--resume", "--workers", "1"], "no sweep to resume"),
    ("sweep-workers-0", sweep("--grid", "system=sglang", "--workers", "0"), "--workers must be >= 1"),
    ("sweep-config-missing", sweep("--grid", "system=sglang", cfg="nope.yaml"), "config file not found"),
    ("sweep-set-unknown-key", sweep("--grid", "system=sglang", "--set", "workload.bogus=1"),
     "good.yaml: unknown config key 'workload.bogus'"),
    ("sweep-set-empty-value", sweep("--grid", "system=sglang", "--set", "workload.seed="), "bad --set"),
    ("sweep-set-duplicate-key", sweep("--grid", "system=sglang", "--set", "costs={a: 1, a: 2}"), "duplicate key 'a'"),
    ("sweep-grid-list-value", sweep("--grid", "spec.accept_probs=[1]"), "grid values are scalars"),
    ("sweep-grid-bad-key-chars", sweep("--grid", "work-load.seed=1,2"), "bad --grid 'work-load.seed=1,2'"),
    ("plan-set-unknown-key", PLAN + ["--set", "workload.bogus=1", "--out", "{ws}/p"],
     "good.yaml: unknown config key 'workload.bogus'"),
    ("plan-set-empty-value", PLAN + ["--set", "workload.seed=", "--out", "{ws}/p"], "bad --set 'workload.seed='"),
    ("replay-set-empty-value", replay("--set", "workload.seed="), "bad --set 'workload.seed='"),
    ("replay-calibration-duplicate-key", replay("--calibration", "{ws}/cal_dupkey.yaml"), "duplicate key 'launch_s'"),
    ("replay-calibration-alias-bomb", replay("--calibration", "{ws}/cal_bomb.yaml"), "alias bomb"),
    # ---- plans
    ("plan-negative-slo", PLAN[:6] + ["-1", "--out", "{ws}/p"], "--slo-tpot-ms must be > 0"),
    ("plan-zero-gpu-kv", PLAN + ["--gpu-kv-gb", "0", "--out", "{ws}/p"], "--gpu-kv-gb must be > 0"),
    ("plan-empty-systems", PLAN + ["--systems", ",", "--out", "{ws}/p"], "--systems is empty"),
    ("plan-unknown-system", PLAN + ["--systems", "vllm", "--out", "{ws}/p"], "system must be one of"),
    ("plan-unknown-model", ["plan", "--model", "gpt-9", "--hardware", "h200", "--slo-tpot-ms", "50", "--config",
                            "{ws}/good.yaml", "--out", "{ws}/p"], "unknown model.preset"),
    ("plan-rel-tol-2", PLAN + ["--rel-tol", "2", "--out", "{ws}/p"], "--rel-tol must be in [0, 1)"),
    ("plan-zero-gpus", PLAN + ["--num-gpus", "0", "--out", "{ws}/p"], "--num-gpus must be > 0"),
    ("plan-tp-3-gpus", PLAN + ["--num-gpus", "3", "--attention", "tp", "--out", "{ws}/p"], "attention heads"),
    ("plan-1e9-concurrency", PLAN + ["--max-concurrency", "1000000000", "--out", "{ws}/p"],
     "--max-concurrency x --requests-per-cap must be <= 1,000,000"),
    ("plan-requests-per-cap-overflow", PLAN + ["--max-concurrency", "1024", "--requests-per-cap", "4096", "--out",
                                               "{ws}/p"], "got 1,024 x 4,096"),
    ("plan-out-existing", PLAN + ["--out", "{ws}/plan"], "pass --force to replace it"),
    ("plan-config-duplicate-key", PLAN[:-1] + ["{ws}/dupkey.yaml", "--out", "{ws}/p"], "duplicate key"),
    # ---- reports
    ("report-missing-dir", ["report", "{ws}/nowhere"], "result dir not found"),
    ("report-empty-dir", ["report", "{ws}/emptydir", "--out", "{ws}/r"], "no result files found"),
    ("report-out-is-a-file", ["report", "{ws}/sweep", "--out", "{ws}/afile"], "exists and is not a directory"),
    ("report-out-foreign-dir", ["report", "{ws}/sweep", "--out", "{ws}/mine", "--force"], "not written by ulacache"),
] + [
    # ======== issue 27 ========
    # ---- --force replaces only an output this tool wrote
    ("i27-replay-force-foreign-run", ["replay", "{ws}/good.yaml", "--out", "{ws}/foreign_run", "--quiet", "--force"],
     "foreign_run: no .ulacache-manifest.json (not written by ulacache)"),
    ("i27-replay-force-old-run-without-manifest", ["replay", "{ws}/good.yaml", "--out", "{ws}/run", "--quiet",
                                                   "--force"], "not written by ulacache"),
    ("i27-replay-force-plan-dir", ["replay", "{ws}/good.yaml", "--out", "{ws}/foreign_plan", "--quiet", "--force"],
     "not written by ulacache"),
    ("i27-replay-force-website", ["replay", "{ws}/good.yaml", "--out", "{ws}/website", "--quiet", "--force"],
     "refusing to replace it"),
    ("i27-gen-force-foreign-trace-yaml", ["trace", "gen", "--profile", "small", "--out", "{ws}/foreign_trace",
                                         "--num-requests", "2", "--force"],
     "not written by ulacache"),
    ("i27-convert-force-foreign-trace", ["trace", "convert", "{ws}/cap_good.jsonl", "--out", "{ws}/foreign_trace",
                                         "--force"], "not written by ulacache"),
    ("i27-report-force-website", ["report", "{ws}/sweep", "--out", "{ws}/website", "--force"],
     "website: no .ulacache-manifest.json"),
    ("i27-report-out-symlink", ["report", "{ws}/sweep", "--out", "{ws}/runlink", "--force"], "symbolic link"),
    ("i27-plan-force-foreign-plan", PLAN + ["--out", "{ws}/foreign_plan", "--force"], "not written by ulacache"),
    ("i27-plan-force-website", PLAN + ["--out", "{ws}/website", "--force"], "not written by ulacache"),
    ("i27-sensitivity-exists", ["sensitivity", "{ws}/good.yaml", "--out", "{ws}/foreign_sens", "--quiet"],
     "pass --force to replace it"),
    ("i27-sensitivity-force-foreign", ["sensitivity", "{ws}/good.yaml", "--out", "{ws}/foreign_sens", "--quiet",
                                       "--force"], "not written by ulacache"),
    ("i27-sensitivity-force-run-dir", ["sensitivity", "{ws}/good.yaml", "--out", "{ws}/foreign_run", "--quiet",
                                       "--force"], "not written by ulacache"),
    ("i27-policy-compare-exists", ["policy-compare", "{ws}/trace", "--out", "{ws}/pc", "--no-peers"],
     "policy_compare.csv: exists; pass --force"),
    ("i27-policy-compare-force-foreign", ["policy-compare", "{ws}/trace", "--out", "{ws}/pc", "--no-peers",
                                          "--force"], "policy_compare.csv: not written by ulacache"),
    ("i27-policy-compare-out-is-file", ["policy-compare", "{ws}/trace", "--out", "{ws}/afile", "--no-peers"],
     "exists and is not a directory"),
    ("i27-sweep-out-symlink", ["sweep", "{ws}/good.yaml", "--out", "{ws}/runlink", "--grid", "system=sglang",
                               "--workers", "1", "--no-progress"],
     "symbolic link"),
    ("i27-sweep-resume-foreign-dir", ["sweep", "{ws}/good.yaml", "--grid", "system=sglang", "--out",
                                      "{ws}/foreign_run", "--resume", "--workers", "1"], "no sweep to resume"),
    # ---- --trace-events: devices, links, foreign files, the run dir itself
    ("i27-trace-events-dev-null-force", replay("--trace-events", "/dev/null", "--force"),
     "/dev/null: is not a regular file"),
    ("i27-trace-events-dev-null", replay("--trace-events", "/dev/null"), "is not a regular file"),
    ("i27-trace-events-symlink", replay("--trace-events", "{ws}/link_to_file", "--force"), "is a symbolic link"),
    ("i27-trace-events-foreign-file-force", replay("--trace-events", "{ws}/theirs.json", "--force"),
     "theirs.json: not written by ulacache"),
    ("i27-trace-events-is-out", replay("--trace-events", "{ws}/o"), "is the --out directory itself"),
    ("i27-trace-events-over-metrics", replay("--trace-events", "{ws}/o/metrics.json"),
     "would overwrite the run's own metrics.json"),
    ("i27-trace-events-under-file", replay("--trace-events", "{ws}/afile/ev.json"), "not a directory"),
    # ---- hw outputs: refused without --force, and with it unless the same command wrote them
    ("i27-hw-validate-out-exists", ["hw", "validate", "--from-json", str(VALIDATE_RUN), "--out", "{ws}/theirs.json"],
     "theirs.json: exists; pass --force"),
    ("i27-hw-validate-out-foreign-force", ["hw", "validate", "--from-json", str(VALIDATE_RUN), "--out",
                                           "{ws}/theirs.json", "--force"], "not written by ulacache"),
    ("i27-hw-validate-out-dev-null", ["hw", "validate", "--from-json", str(VALIDATE_RUN), "--out", "/dev/null",
                                      "--force"], "is not a regular file"),
    ("i27-hw-validate-out-dir", ["hw", "validate", "--from-json", str(VALIDATE_RUN), "--out", "{ws}/mine"],
     "is a directory"),
    ("i27-hw-validate-out-symlink", ["hw", "validate", "--from-json", str(VALIDATE_RUN), "--out",
                                     "{ws}/link_to_file", "--force"], "is a symbolic link"),
    ("i27-hw-validate-live-out-exists", ["hw", "validate", "synthetic", "--backend", "numpy", "--out",
                                         "{ws}/theirs.json"], "exists; pass --force"),
    ("i27-hw-calibrate-out-foreign-force", ["hw", "calibrate", "--from-json", str(RAW_CALIBRATION), "--out",
                                            "{ws}/theirs.yaml", "--force"], "theirs.yaml: not written by ulacache"),
    ("i27-hw-calibrate-out-exists", ["hw", "calibrate", "--from-json", str(RAW_CALIBRATION), "--out",
                                     "{ws}/theirs.yaml"], "exists; pass --force"),
    ("i27-hw-calibrate-json-exists", ["hw", "calibrate", "--from-json", str(RAW_CALIBRATION), "--out",
                                      "{ws}/new.yaml", "--json", "{ws}/theirs.json"], "theirs.json: exists"),
    ("i27-hw-bench-out-exists", ["hw", "bench", "--out", "{ws}/theirs.json"], "exists; pass --force"),
    ("i27-hw-bench-out-foreign-force", ["hw", "bench", "--out", "{ws}/theirs.json", "--force"],
     "not written by ulacache"),
    ("i27-hw-hisparse-out-dev-null", ["hw", "hisparse", "--out", "/dev/null", "--force"], "is not a regular file"),
    # ---- hw raw measurements: finite, no negative magnitudes, the key named
    ("i27-calibrate-raw-nan", ["hw", "calibrate", "--from-json", "{ws}/raw_nan.json", "--out", "{ws}/c.yaml"],
     "launch.launch_device_gap_s = nan is not a finite number"),
    ("i27-calibrate-raw-inf", ["hw", "calibrate", "--from-json", "{ws}/raw_inf.json", "--out", "{ws}/c.yaml"],
     "ceilings.p2p_gb_s = inf"),
    ("i27-calibrate-raw-1e400", ["hw", "calibrate", "--from-json", "{ws}/raw_1e400.json", "--out", "{ws}/c.yaml"],
     "ceilings.h2d_gb_s = inf"),
    ("i27-calibrate-raw-negative-latency", ["hw", "calibrate", "--from-json", "{ws}/raw_neg_latency.json",
                                            "--out", "{ws}/c.yaml"], "launch.launch_device_gap_s = -4.5e-06 is a "
                                                                     "negative time"),
    ("i27-calibrate-raw-negative-bandwidth", ["hw", "calibrate", "--from-json", "{ws}/raw_neg_bw.json", "--out",
                                              "{ws}/c.yaml"], "ceilings.h2d_gb_s = -55.0"),
    ("i27-calibrate-raw-a-list", ["hw", "calibrate", "--from-json", "{ws}/raw_list.json", "--out", "{ws}/c.yaml"],
     "expected an object"),
    ("i27-calibrate-raw-not-json", ["hw", "calibrate", "--from-json", "{ws}/good.yaml", "--out", "{ws}/c.yaml"],
     "not a readable JSON file"),
    ("i27-calibrate-hisparse-json-nan", ["hw", "calibrate", "--from-json", str(RAW_CALIBRATION), "--hisparse-json",
                                         "{ws}/raw_nan.json", "--out", "{ws}/c.yaml"], "--hisparse-json"),
    ("i27-calibrate-raw-over-limit", ["hw", "calibrate", "--from-json", "{big}/raw_300mb.json", "--out",
                                      "{ws}/c.yaml"], "over the 256 MiB limit"),
    ("i27-validate-measured-0", ["hw", "validate", "--from-json", "{ws}/run_measured_0.json", "--out", ""],
     "measured_s must be > 0 seconds"),
    ("i27-validate-measured-negative", ["hw", "validate", "--from-json", "{ws}/run_measured_neg.json", "--out", ""],
     "measured_s must be > 0 seconds"),
    ("i27-validate-measured-string", ["hw", "validate", "--from-json", "{ws}/run_measured_str.json", "--out", ""],
     "measured_s must be a finite number, got 'fast'"),
    ("i27-validate-measured-nan", ["hw", "validate", "--from-json", "{ws}/run_nan.json", "--out", ""],
     "measured_s = nan is not a finite number"),
    ("i27-validate-refs-negative", ["hw", "validate", "--from-json", "{ws}/run_refs_neg.json", "--out", ""],
     "num_refs must be an integer >= 0"),
    ("i27-validate-refs-missing", ["hw", "validate", "--from-json", "{ws}/run_no_refs.json", "--out", ""],
     "num_refs must be an integer >= 0, got None"),
    ("i27-validate-rows-bad", ["hw", "validate", "--from-json", "{ws}/run_rows_bad.json", "--out", ""],
     "rows_per_rank.h2d must list 2 rank(s)"),
    ("i27-validate-cost-nan", ["hw", "validate", "--from-json", str(VALIDATE_RUN), "--cost", "launch_s=nan",
                               "--out", ""], "--cost: cost key launch_s must be a finite number"),
    ("i27-validate-cost-negative-bw", ["hw", "validate", "--from-json", str(VALIDATE_RUN), "--cost",
                                       "pcie_h2d_bw_bytes_s=-1", "--out", ""], "pcie_h2d_bw_bytes_s must be a rate"),
    ("i27-validate-calibration-nan", ["hw", "validate", "--from-json", str(VALIDATE_RUN), "--calibration",
                                      "{ws}/cal_nan.yaml", "--out", ""], "hisparse_per_ref_s must be a finite"),
    # ---- floats in configs and --set: finite, in range, the key named
    ("i27-set-launch-nan-eager", replay("--set", "costs.launch_s=.nan", "--set", "costs.cuda_graphs=0"),
     "cost key launch_s must be a finite number, got nan"),
    ("i27-set-hisparse-per-ref-nan", replay("--set", "system=hisparse", "--set", "costs.hisparse_per_ref_s=.nan"),
     "cost key hisparse_per_ref_s must be a finite number"),
    ("i27-set-step-overhead-inf", replay("--set", "costs.step_overhead_s=.inf"),
     "cost key step_overhead_s must be a finite number, got inf"),
    ("i27-set-step-overhead-1e400", replay("--set", "costs.step_overhead_s=1e400"), "step_overhead_s"),
    ("i27-set-step-overhead-1e6", replay("--set", "costs.step_overhead_s=1e6"),
     "step_overhead_s must be a time in [0, 1] s"),
    ("i27-set-mgmt-negative", replay("--set", "costs.mgmt_per_ref_s=-1e-9"), "mgmt_per_ref_s must be a time"),
    ("i27-set-pcie-bw-zero", replay("--set", "costs.pcie_h2d_bw_bytes_s=0"),
     "pcie_h2d_bw_bytes_s must be a rate in (0, 1e+15] bytes/s"),
    ("i27-set-host-cap-nan", replay("--set", "costs.pcie_host_cap_bytes_s=.nan"), "pcie_host_cap_bytes_s"),
    ("i27-set-table-nan", replay("--set", "costs.h2d_row_efficiency_by_bytes={656: .nan}"),
     "h2d_row_efficiency_by_bytes must be a table"),
    ("i27-set-kernels-1e9", replay("--set", "costs.moe_kernels_per_layer=1e9"),
     "moe_kernels_per_layer must be a number in [0, 1e+06]"),
    ("i27-set-num-gpus-nan", replay("--set", "hardware.num_gpus=.nan"),
     "config key hardware.num_gpus must be a finite number, got nan"),
    ("i27-set-num-gpus-1e400", replay("--set", "hardware.num_gpus=1e400"),
     "config key hardware.num_gpus must be a finite number, got inf"),
    ("i27-set-pcie-1e-300", replay("--set", "hardware.pcie_bw_bytes_s=1e-300"),
     "config key hardware.pcie_bw_bytes_s must be in [1e+06, 1e+15] bytes/s"),
    ("i27-set-nvlink-latency-1e9", replay("--set", "hardware.nvlink_latency_s=1e9"),
     "hardware.nvlink_latency_s must be in [0, 1] s"),
    ("i27-set-hbm-1e30", replay("--set", "hardware.hbm_bytes=1e30"), "hardware.hbm_bytes must be in"),
    ("i27-set-flops-tiny", replay("--set", "hardware.fp8_flops=1"), "hardware.fp8_flops must be in"),
    ("i27-set-model-layers-nan", replay("--set", "model.num_layers=.nan"),
     "config key model.num_layers must be a finite number"),
    ("i27-set-gpu-kv-0", replay("--set", "memory.gpu_kv_bytes_per_gpu=0"),
     "config key memory.gpu_kv_bytes_per_gpu must be > 0 bytes"),
    ("i27-set-reserve-1e300", replay("--set", "memory.gpu_reserve_bytes=1e300"),
     "config key memory.gpu_reserve_bytes must be <= 1e+15 bytes per GPU"),
    ("i27-set-cpu-kv-1e300", replay("--set", "memory.cpu_kv_bytes_per_gpu=1e300"), "memory.cpu_kv_bytes_per_gpu"),
    ("i27-gen-capture-steps-2^70", gen("--num-requests", "2", "--capture-steps", str(2**70)),
     "--capture-steps must be in [0, 16,777,215]"),
    ("i27-sweep-resume-a-replay-dir", ["sweep", "{ws}/good.yaml", "--grid", "system=sglang", "--out",
                                       "{ws}/replay_with_sweep_yaml", "--resume", "--workers", "1"],
     "its manifest is `ulacache replay` output, not a sweep"),
    ("i27-config-nan-costs", replay(cfg="nan_costs.yaml"), "nan_costs.yaml: config costs: cost key launch_s"),
    ("i27-config-negative-cost", replay(cfg="neg_cost.yaml"), "mgmt_per_ref_s must be a time in [0, 1] s"),
    ("i27-config-zero-bandwidth", replay(cfg="zero_bw_cost.yaml"), "pcie_h2d_bw_bytes_s must be a rate"),
    ("i27-config-num-gpus-nan", replay(cfg="nan_gpus.yaml"), "hardware.num_gpus must be a finite number, got nan"),
    ("i27-config-num-gpus-1e400", replay(cfg="big_gpus.yaml"), "hardware.num_gpus must be a finite number, got inf"),
    ("i27-config-pcie-1e-300", replay(cfg="tiny_pcie.yaml"), "hardware.pcie_bw_bytes_s must be in"),
    ("i27-config-gpu-kv-0", replay(cfg="zero_gpu_kv.yaml"), "memory.gpu_kv_bytes_per_gpu must be > 0 bytes"),
    ("i27-calibration-nan", replay("--calibration", "{ws}/cal_nan.yaml"),
     "cal_nan.yaml: cost key hisparse_per_ref_s must be a finite number, got nan"),
    ("i27-calibration-inf", replay("--calibration", "{ws}/cal_inf.yaml"), "step_overhead_s must be a finite"),
    ("i27-calibration-negative", replay("--calibration", "{ws}/cal_neg.yaml"), "launch_s must be a time in [0, 1]"),
    ("i27-calibration-zero-bandwidth", replay("--calibration", "{ws}/cal_zero_bw.yaml"), "nvlink_bw_bytes_s"),
    ("i27-calibration-huge-latency", replay("--calibration", "{ws}/cal_huge_latency.yaml"), "pcie_latency_s"),
    ("i27-calibration-nan-table", replay("--calibration", "{ws}/cal_nan_table.yaml"),
     "h2d_row_efficiency_by_bytes must be a table"),
    ("i27-calibration-efficiency-2", replay("--calibration", "{ws}/cal_eff_2.yaml"),
     "peer_row_efficiency must be in (0, 1] (an efficiency)"),
    ("i27-sweep-set-cost-nan", sweep("--grid", "system=sglang,hisparse", "--set", "costs.launch_s=.nan"),
     "cost key launch_s must be a finite number"),
    ("i27-sweep-grid-num-gpus-nan", sweep("--grid", "hardware.num_gpus=2,.nan"), "must be a finite number"),
    ("i27-plan-slo-nan", PLAN[:6] + ["nan", "--out", "{ws}/p"], "--slo-tpot-ms must be > 0 (a finite number), got nan"),
    ("i27-plan-gpu-kv-inf", PLAN + ["--gpu-kv-gb", "inf", "--out", "{ws}/p"], "--gpu-kv-gb must be > 0 (a finite"),
    ("i27-plan-cpu-kv-nan", PLAN + ["--cpu-kv-gb", "nan", "--out", "{ws}/p"], "--cpu-kv-gb must be > 0"),
    ("i27-plan-set-cost-inf", PLAN + ["--set", "costs.step_overhead_s=.inf", "--out", "{ws}/p"],
     "step_overhead_s must be a finite number"),
    ("i27-sensitivity-set-nan", ["sensitivity", "{ws}/good.yaml", "--out", "{ws}/sn", "--quiet", "--set",
                                 "costs.launch_s=.nan"], "launch_s must be a finite number"),
    # ---- request lists and read limits (checked on the file size before parsing)
    ("i27-csv-128k-unterminated-quote", gen("--from-csv", "{ws}/quote_128k.csv"),
     "quote_128k.csv: line 2: not valid CSV (field larger than field limit"),
    ("i27-csv-bom-names-the-column-visibly", gen("--from-csv", "{ws}/bom_badcol.csv"), "unknown column 'outputs'"),
    ("i27-csv-over-1m-rows", gen("--from-csv", "{ws}/rows_1m.csv"), "more than 1,000,000 requests"),
    ("i27-csv-200mb", gen("--from-csv", "{big}/requests_200mb.csv"), "over the 64 MiB limit for a request list"),
    ("i27-jsonl-200mb", gen("--from-csv", "{big}/requests_200mb.jsonl"), "over the 64 MiB limit"),
    ("i27-csv-10m-rows", gen("--from-csv", "{big}/rows_10m.csv"), "10,000,001 lines is over the 2,000,000-line"),
    ("i27-csv-is-a-dir", gen("--from-csv", "{ws}/mine"), "not a regular file"),
    ("i27-config-50mb", ["replay", "{big}/config_50mb.yaml", "--out", "{ws}/o", "--quiet"],
     "over the 16 MiB limit for a YAML file"),
    ("i27-calibration-50mb", replay("--calibration", "{big}/config_50mb.yaml"), "over the 16 MiB limit"),
    ("i27-profile-50mb", gen("--num-requests", "2", "--profile", "{big}/config_50mb.yaml"), "over the 16 MiB limit"),
    ("i27-sweep-config-50mb", ["sweep", "{big}/config_50mb.yaml", "--grid", "system=sglang", "--out", "{ws}/s",
                               "--workers", "1"], "over the 16 MiB limit"),
    ("i27-plan-config-50mb", PLAN[:-1] + ["{big}/config_50mb.yaml", "--out", "{ws}/p"], "over the 16 MiB limit"),
    # ---- reports over malformed plan.json: a visible reason, no traceback
    ("i27-report-plan-systems-int", ["report", "{ws}/badplan_systems_int", "--out", "{ws}/r"],
     "plan.json: not a plan file (no 'systems' mapping)"),
    ("i27-report-plan-entry-int", ["report", "{ws}/badplan_entry_int", "--out", "{ws}/r"],
     "systems.sglang is not a mapping"),
    ("i27-report-plan-best-int", ["report", "{ws}/badplan_best_int", "--out", "{ws}/r"],
     "systems.sglang.best is not a mapping"),
    ("i27-report-plan-evaluations-int", ["report", "{ws}/badplan_evals", "--out", "{ws}/r"],
     "evaluations is not a list"),
    ("i27-report-plan-zero-throughput", ["report", "{ws}/badplan_zero_tput", "--out", "{ws}/r"],
     "throughput_tok_s must be a finite number > 0"),
    ("i27-report-plan-nan", ["report", "{ws}/badplan_nan", "--out", "{ws}/r"], "throughput_tok_s"),
    ("i27-report-plan-truncated", ["report", "{ws}/badplan_truncated", "--out", "{ws}/r"], "not a plan file"),
]


@pytest.mark.parametrize("argv, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_cli_input_is_one_line_exit_2_and_changes_nothing(ws, big, capsys, argv, needle):
    before = snapshot(ws)
    try:
        code = main([a.replace("{ws}", str(ws)).replace("{big}", str(big)) for a in argv])
    except SystemExit as exc:  # argparse usage errors exit from inside parse_args
        code = exc.code
    out, err = capsys.readouterr()
    err = err.strip()
    assert code == 2, (code, err)
    assert err.startswith("ulacache: error:") and "\n" not in err and "Traceback" not in err, err
    assert needle in err, err
    assert snapshot(ws) == before  # nothing written, nothing half-written, no temporaries


def test_corpus_is_large_and_names_are_unique():
    assert len(CASES) + len(LIBRARY_CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


def test_empty_config_under_a_memory_cap_is_refused_in_one_line(ws, capsys):
    """Issue 12 item 3: a config of all defaults is refused up front when it would not fit (H2's estimator)."""
    before = snapshot(ws)
    code = main(["replay", str(ws / "empty.yaml"), "--out", str(ws / "o"), "--quiet", "--max-memory-gb", "0.05"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("ulacache: error:") and "\n" not in err and "GB" in err, err
    assert snapshot(ws) == before


def test_memory_error_anywhere_is_one_line_naming_the_knobs(ws, capsys, monkeypatch):
    """The last line of defence: a MemoryError inside a replay becomes one line naming the knobs, exit 2."""
    import sim

    def oom(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(sim, "replay", oom)
    before = snapshot(ws)
    code = main(["replay", str(ws / "good.yaml"), "--out", str(ws / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "out of memory" in err and "workload.num_requests" in err, err
    assert "fidelity.request_fraction" in err
    assert snapshot(ws) == before


# ---------------------------------------------------------------------------------------------- library calls
def _cache(**kw):
    from ulacache import CacheConfig, UlaCache

    cfg = dict(mode="dp", num_ranks=1, gpu_slots=64, cpu_slots=256, policy="pb-lru", payload_bytes=0)
    cfg.update(kw)
    cache = UlaCache(CacheConfig(**cfg))
    cache.alloc(request_id=1, num_tokens=100, rank=0)
    return cache


def _state(cache):
    addrs = np.arange(0, 100, dtype=np.int64)
    return json.dumps(cache.stats(), sort_keys=True, default=str), [a.tobytes() for a in cache.locate(addrs)]


def _config(**kw):
    from ulacache import CacheConfig

    return lambda: CacheConfig(**{"mode": "dp", "num_ranks": 1, "gpu_slots": 64, **kw})


LIBRARY_CASES = [
    ("config-mode", None, _config(mode="xx")),
    ("config-negative-gpu-slots", None, _config(gpu_slots=-1)),
    ("config-float-slots", None, _config(gpu_slots=64.5)),
    ("config-unknown-policy", None, _config(policy="fifo")),
    ("config-unknown-backend", None, _config(backend="tpu")),
    ("config-zero-ranks", None, _config(num_ranks=0)),
    ("config-hisparse-no-cpu", None, _config(policy="hisparse", cpu_slots=0)),
    ("config-negative-dense-map-bytes", None, _config(dense_map_bytes=-1)),
    ("alloc-negative-tokens", "cache", lambda c: c.alloc(request_id=2, num_tokens=-1, rank=0)),
    ("alloc-bad-rank", "cache", lambda c: c.alloc(request_id=2, num_tokens=1, rank=5)),
    ("alloc-beyond-capacity", "cache", lambda c: c.alloc(request_id=2, num_tokens=10_000, rank=0)),
    ("access-unknown-address", "cache", lambda c: c.access(np.array([10**9], dtype=np.int64))),
    ("access-working-set-too-big", "cache", lambda c: c.access(np.arange(100, dtype=np.int64))),
    ("access-float-addresses", "cache", lambda c: c.access(np.array([1.5, 2.5]))),
    ("commit-not-a-plan", "cache", lambda c: c.commit("plan")),
    ("free-unknown-request", "cache", lambda c: c.free(42)),
    ("write-without-payload", "cache", lambda c: c.write(np.array([1], dtype=np.int64), np.zeros((1, 4), np.uint8))),
    ("locate-unknown-address", "cache", lambda c: c.locate(np.array([-7], dtype=np.int64))),
    # issue 27: documented ValueErrors, not OverflowError / MemoryError
    ("i27-config-gpu-slots-2^70", None, _config(gpu_slots=2**70)),
    ("i27-config-cpu-slots-2^70", None, _config(cpu_slots=2**70)),
    ("i27-config-buffer-slots-2^70", None, _config(local_buffer_slots=2**70)),
    ("i27-config-payload-1e9-bytes", None, _config(payload_bytes=10**9)),
    ("i27-config-payload-layers-2^30", None, _config(payload_bytes=656, payload_layers=2**30)),
    ("i27-alloc-2^70-tokens", "cache", lambda c: c.alloc(request_id=2, num_tokens=2**70, rank=0)),
    ("i27-alloc-many-2^70-tokens", "cache", lambda c: c.alloc_many([2], [2**70], [0])),
]


@pytest.mark.parametrize("kind, call", [c[1:] for c in LIBRARY_CASES], ids=[c[0] for c in LIBRARY_CASES])
def test_bad_library_call_raises_and_changes_nothing(kind, call):
    from ulacache import CapacityError

    if kind is None:
        with pytest.raises(ValueError):  # (OverflowError is not a ValueError: it would fail here)
            call()
        return
    cache = _cache()
    before = _state(cache)
    with pytest.raises((ValueError, CapacityError)):
        call(cache)
    assert _state(cache) == before
    cache.check_invariants()
