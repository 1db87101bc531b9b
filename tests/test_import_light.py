"""`pip install ulacache` is the policy library on numpy alone: importing it must load none of the extras' modules,
and a command whose extra is missing must say which extra to install in one line (exit 2), not a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

HEAVY = ("simpy", "ray", "matplotlib", "pandas", "pyarrow", "yaml", "rich", "torch", "cupy", "libcachesim")


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=120)


def test_import_ulacache_loads_no_extra():
    out = _run(f"""
        import json, sys
        import ulacache
        from ulacache import CacheConfig, UlaCache
        cache = UlaCache(CacheConfig(mode="dp", num_ranks=1, gpu_slots=128, cpu_slots=256))
        cache.commit(cache.access(cache.alloc(request_id=1, num_tokens=100, rank=0)))
        print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))))
    """)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


_BLOCKED_CLI = """
    import importlib.abc, sys
    BLOCK = set(sys.argv[1].split(","))

    class Missing(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in BLOCK:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Missing())
    from ulacache_cli.main import main
    sys.exit(main(sys.argv[2:]))
"""


def test_cli_names_the_missing_extra(tmp_path):
    cases = [("simpy,pandas,pyarrow,yaml,rich", ["replay", "configs/demo.yaml", "--out", str(tmp_path / "r")], "sim"),
             ("matplotlib", ["report", str(tmp_path)], "report")]
    for block, argv, extra in cases:
        out = _run(_BLOCKED_CLI, block, *argv)
        assert out.returncode == 2, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("ulacache: error:"), out.stderr
        assert f"ulacache[{extra}]" in lines[0]
    assert not (tmp_path / "r").exists()


def test_cli_help_without_extras():
    out = _run(_BLOCKED_CLI, ",".join(HEAVY), "--help")
    assert out.returncode == 0, out.stderr
    assert "replay" in out.stdout and "report" in out.stdout
