"""A local Ray that does not come up (under an address-space limit its node times out) is one `ulacache: error:` line
with exit 2 that says how to go on (--workers 1), not a traceback."""
from __future__ import annotations

import pytest

from ulacache_cli.main import main


def test_ray_that_does_not_start_is_one_line(tmp_path, capsys, monkeypatch):
    ray = pytest.importorskip("ray")

    def broken(*args, **kwargs):
        raise Exception("The current node timed out during startup.")

    monkeypatch.setattr(ray, "init", broken)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("system: sglang\nworkload: {num_requests: 2, max_concurrency: 2, max_steps: 2}\n")
    status = main(["sweep", str(cfg), "--grid", "workload.seed=1,2", "--workers", "2", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("ulacache: error: could not start a local Ray for --workers 2"), err
    assert err.count("\n") == 1 and "timed out during startup" in err and "--workers 1" in err
