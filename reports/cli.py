"""`ulacache report DIR`: figures + index.html from the result files under DIR (cheap to import)."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="draw the comparison figures and a static HTML page from result files",
        description="Reads sweep tables (results.parquet), replay metrics.json, plan.json and hw validate.json "
        "found under DIR and writes PNG figures and index.html (default: DIR/report/).")
    p.add_argument("dir", type=Path, help="directory holding result files (searched recursively)")
    p.add_argument("--out", type=Path, default=None, help="output dir (default: DIR/report)")
    p.add_argument("--force", action="store_true", help="replace an earlier report in the output dir")
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from reports import build_report

    out = args.out if args.out is not None else args.dir / "report"
    if not args.dir.is_dir():
        raise ValueError(f"{args.dir}: result dir not found" if not args.dir.exists() else f"{args.dir}: not a "
                         "directory")
    _check_out(out, args.force)
    with _staged(out, args.force) as stage:
        index = build_report(args.dir, stage)
    print(f"report: {out / index.name}")
    return 0


def _check_out(out: Path, force: bool) -> None:
    """Refuse before drawing: a file, an earlier report without --force, a non-report dir, an unwritable place."""
    import os

    if out.exists() and (not out.is_dir() or out.is_symlink()):
        raise OSError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ValueError(f"{out}: exists and is not empty (an earlier report?); pass --force to replace it")
        if not (out / "index.html").is_file():
            raise ValueError(f"{out}: not a report directory; refusing to replace it")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise OSError(f"{out}: {parent} is not a writable directory")


class _staged:
    """The report is drawn into a hidden sibling dir and renamed into place whole (an old one renamed aside, then
    deleted); a failure removes the sibling and leaves the old report byte-identical. (reports imports nothing
    of ours, so this is a small copy of traces.atomic.StagedDir.)"""

    def __init__(self, out: Path, force: bool):
        self.out, self.force = out, force

    def __enter__(self) -> Path:
        import tempfile

        self.made = []
        parent = self.out.parent
        while not parent.exists() and parent != parent.parent:
            self.made.append(parent)
            parent = parent.parent
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-", dir=self.out.parent))
        self.tmp.chmod(0o755)
        return self.tmp

    def __exit__(self, exc_type, *exc) -> bool:
        import os
        import shutil

        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            for parent in self.made:  # innermost first
                try:
                    parent.rmdir()
                except OSError:
                    break
            return False
        old = None
        if self.out.is_dir() and any(self.out.iterdir()):
            if not self.force:  # it appeared while we drew (another command): keep it
                shutil.rmtree(self.tmp, ignore_errors=True)
                raise OSError(f"{self.out}: appeared while this command ran; nothing was replaced")
            old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
            os.rename(self.out, old)
        elif self.out.is_dir():
            os.rmdir(self.out)
        try:
            os.rename(self.tmp, self.out)
        except BaseException:
            if old is not None:
                os.rename(old, self.out)
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return False
