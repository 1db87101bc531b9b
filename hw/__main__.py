"""`python -m hw bench|calibrate|hisparse|validate`: the hw commands (front-end: ulacache_cli/hw.py) without the
other commands (device hosts, their scripts and the provenance the results record use this form)."""
from __future__ import annotations

import argparse
import sys

from ulacache_cli.hw import register


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
