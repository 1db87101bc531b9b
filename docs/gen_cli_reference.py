"""Write docs/cli.md from the `ulacache` parser itself: every command, its usage line, and each flag with its help
and default, so the page cannot drift from `ulacache --help` (run `make docs` after changing a command).

    python docs/gen_cli_reference.py [--out docs/cli.md] [--check]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from page_main import page_main  # docs/page_main.py: docs/ is sys.path[0] when this script runs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INTRO = """# Command line

`ulacache COMMAND ...` is the one front door to the toolkit (installed by `make install` or
`pip install -e '.[sim,sweep,report]'`). Every command follows the same rules:

- bad input (a corrupt trace, an unknown or duplicate config key, a wrong type, a non-finite budget...) gets one line
  `ulacache: error: ...` and exit status 2, never a traceback;
- no command replaces earlier results without `--force`, and `--force` replaces only an output the same command
  wrote (its `.ulacache-manifest.json`, written last and checked first); a folder or file it did not write, a
  symbolic link or a device is refused;
- outputs are staged under a temporary name, fsynced and renamed into place, so a failed or refused command leaves
  what was on disk byte-identical; one sweep at a time writes a folder (a lock);
- input files are size-checked before parsing (YAML 16 MiB, request lists 64 MiB and 2M lines, measurement JSON
  256 MiB);
- a command whose optional dependencies are missing names the extra to install (`pip install 'ulacache[sim]'`);
- config keys (`--set dotted.key=value`, `--grid key=v1,v2`) are listed in [config.md](config.md).

This page is generated from the parser (`python docs/gen_cli_reference.py`, or `make docs`).
"""


def _text(help_text: str | None) -> str:
    """argparse help as one markdown table cell."""
    return " ".join((help_text or "").split()).replace("%%", "%").replace("|", "\\|")


def _flag_row(action: argparse.Action) -> str | None:
    if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
        return None
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.option_strings and action.nargs != 0:
        metavar = action.metavar or action.dest.upper()
        metavar = " ".join(metavar) if isinstance(metavar, tuple) else metavar
        names += f" `{metavar}`"
    text = _text(action.help)
    if "%(default)" in text:
        text = text.replace("%(default)s", str(action.default))
    if action.choices and not isinstance(action.choices, dict):
        text += f" (one of: {', '.join(map(str, action.choices))})"
    default = action.default
    if isinstance(default, Path) and default.is_absolute() and default.is_relative_to(ROOT):
        default = default.relative_to(ROOT)  # a file of the checkout, not of the machine that ran this
    hidden = default is None or default is False or default == [] or default == argparse.SUPPRESS
    shown = "" if hidden or action.nargs == 0 else f"`{default}`"
    if action.required:
        shown = "required"
    return f"| {names} | {text} | {shown} |"


def _section(parser: argparse.ArgumentParser, path: list[str], out: list[str]) -> None:
    """One command's section, then its sub-commands' (depth first, in the parser's order)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if path:
        out.append(f"{'#' * min(len(path) + 1, 4)} `ulacache {' '.join(path)}`\n")
        if parser.description:
            out.append(" ".join(parser.description.split()) + "\n")
        usage = " ".join(parser.format_usage().split())
        out.append(f"```\n{usage}\n```\n")
        rows = [r for r in (_flag_row(a) for a in parser._actions) if r]
        if rows:
            out.append("| argument | meaning | default |\n|---|---|---|")
            out.extend(rows)
            out.append("")
    for action in subs:
        for name, child in action.choices.items():
            _section(child, path + [name], out)


def render() -> str:
    os.environ["COLUMNS"] = "200"  # usage lines on one line, whatever the terminal
    from ulacache_cli.main import build_parser

    parser = build_parser()
    out = [INTRO, "## Commands\n"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.append("| command | what it does |\n|---|---|")
            out.extend(f"| [`{c.dest}`](#ulacache-{c.dest}) | {_text(c.help)} |" for c in action._choices_actions)
            out.append("")
    _section(parser, [], out)
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    return page_main(__doc__.splitlines()[0], ROOT / "docs" / "cli.md", render)


if __name__ == "__main__":
    sys.exit(main())
