"""The command line every docs/gen_*.py page generator shares: write the page, or `--check` that it is current."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable


def page_main(description: str, default_out: Path, render: Callable[[], str]) -> int:
    """Render the page into `--out` (default `default_out`); with `--check`, exit 1 if the file on disk differs."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, default=default_out)
    ap.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    args = ap.parse_args()
    text = render()
    if args.check:
        return 0 if args.out.exists() and args.out.read_text() == text else 1
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text.splitlines())} lines)")
    return 0
