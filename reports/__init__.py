"""reports: figures and a static HTML report built only from result files (pandas, matplotlib, stdlib)."""
from __future__ import annotations

from pathlib import Path


def build_report(result_dir, out_dir=None) -> Path:
    """Write DIR/report/index.html (or OUT_DIR/index.html) with figures beside it; returns its path."""
    from reports.html import build_report as _build

    return _build(result_dir, out_dir)


__all__ = ["build_report"]
