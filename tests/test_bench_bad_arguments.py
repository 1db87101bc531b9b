"""The bench scripts refuse a bad argument or input before measuring anything: a one-line error (after argparse's
usage line, where argparse reports it) and exit 2, never a traceback."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("policy_bench", ["--trials", "0"], "--trials must be at least 1, got 0"),
    ("pool_scale_bench", ["--trials", "-1"], "--trials must be at least 1, got -1"),
    ("trace_bench", ["--threads", "0"], "--trials, --tokens-per-step and --threads must be at least 1"),
    ("sim_bench", ["--config", "configs/nope.yaml"], "sim_bench: config file not found: configs/nope.yaml"),
    ("sim_bench", ["--set", "workload.foo=1"], "unknown config key 'workload.foo'"),
    ("sweep_bench", ["--seeds", "0"], "--seeds must be at least 1, got 0"),
    ("sweep_bench", ["--config", "configs/nope.yaml"], "--config configs/nope.yaml: no such file"),
    ("scale_bench", ["--only", "nope"], "--only takes pinned,batch1,paper,paper-full"),
    ("device_selections", ["--reps", "0"], "--rows, --q, --groups and --reps must be at least 1"),
    ("paper_configs", ["--label", "x", "--jobs", "0"], "--jobs must be at least 1, got 0"),
    ("paper_configs", ["--label", "x", "--only-caps", "1,abc"], "--only-caps takes comma-separated caps of at least 1"),
    ("pblru_gap", ["--label", "x", "--policies", "nope"], "invalid choice: 'nope'"),
    ("dedup_crossover", [], "the following arguments are required: OUT.json"),
    ("drain_estimate", ["README.md", "--reference", "README.md", "--num-requests", "0"],
     "--num-requests must be at least 1, got 0"),
]
NO_OUT = {"paper_configs": "--out-dir", "pblru_gap": None, "dedup_crossover": None, "drain_estimate": None}  # (how they name their output)


@pytest.mark.parametrize("script, argv, message", CASES, ids=lambda v: str(v)[:30])
def test_a_bench_refuses_a_bad_argument_in_one_line(script, argv, message, tmp_path):
    flag = NO_OUT.get(script, "--out")
    out = [flag, str(tmp_path / "o.json")] if flag and flag not in argv else []
    r = subprocess.run([sys.executable, f"bench/{script}.py", *argv, *out], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and message in lines[-1] and "Traceback" not in r.stderr, r.stderr
    usage = lines[:-1]  # argparse's usage line, wrapped
    assert all(ln.startswith("usage:") if i == 0 else ln.startswith(" ") for i, ln in enumerate(usage))
    assert not (tmp_path / "o.json").exists()


def test_scale_bench_will_not_add_to_a_file_that_holds_another_result(tmp_path):
    other = tmp_path / "trace.json"
    other.write_text('{"bench": "trace"}')
    r = subprocess.run([sys.executable, "bench/scale_bench.py", "--out", str(other)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "holds no scale bench result to add to" in r.stderr.splitlines()[-1]
    assert other.read_text() == '{"bench": "trace"}'
