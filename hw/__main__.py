"""`python -m hw bench|calibrate|validate`: the hw commands without the other packages' CLIs (device hosts)."""
from __future__ import annotations

import argparse
import sys

from hw.cli import register


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ulacache")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["hw", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError) as exc:
        print(f"ulacache: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
