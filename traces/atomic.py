"""Atomic outputs: a file or a whole output directory appears complete, or not at all.

Files are written to a hidden temporary sibling (`.NAME.tmp-XXXX`) and `os.replace`d into place. A directory of
outputs (a replay run, a trace, a plan, a report) is built in a hidden sibling directory and renamed into place in
one step; replacing an old one (`--force`) renames the old aside, the new in, then deletes the old. Whatever fails
before that leaves what was on disk byte-identical and removes the temporary (and any parent dirs it created).
Used by traces, sim and the CLI (standard library only).
"""
from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

TMP_MARK = ".tmp-"
OLD_MARK = ".old-"


def is_temporary(name: str) -> bool:
    """True for the hidden names this module creates (readers skip them)."""
    return name.startswith(".") and (TMP_MARK in name or OLD_MARK in name)


def _absolute(path) -> Path:
    """Absolute and normalised ('out/.', 'a/../b' get a real name), without resolving symlinks."""
    return Path(os.path.abspath(path))


def _sibling(path: Path, mark: str) -> Path:
    return path.with_name(f".{path.name}{mark}{os.getpid()}-{secrets.token_hex(4)}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def atomic_write(path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary sibling of `path`, then rename it onto `path`; on failure remove it."""
    path = Path(path)
    tmp = _sibling(path, TMP_MARK)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    return path


def atomic_write_text(path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path, data: bytes) -> Path:
    return atomic_write(path, lambda p: p.write_bytes(data))


def _missing_parents(path: Path) -> list[Path]:
    """Ancestors of `path` that do not exist yet, outermost first; raises if the nearest existing one is unusable."""
    missing = []
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():  # a dangling link
            raise OSError(f"{path}: {parent} is a broken link")
        missing.append(parent)
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise OSError(f"{path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OSError(f"{path}: {parent} is not writable")
    return missing[::-1]


def check_out_path(path, force: bool, owns: Callable[[Path], bool] | None = None, what: str = "output",
                   flag: str = "--force") -> None:
    """Refuse, before any work, an output path that cannot or must not receive new results.

    Accepted: absent (its nearest existing ancestor a writable directory), an empty directory, or (with `force`)
    a directory that `owns` recognises as an earlier output of the same kind. Raises OSError/ValueError.
    """
    path = Path(path)
    if not _absolute(path).name:
        raise ValueError(f"{path}: not usable as an output directory (give a directory name)")
    if path.is_symlink():  # the rename would replace the link, not what it points to
        raise OSError(f"{path}: is a symbolic link; give the directory it points to ({os.path.realpath(path)})")
    if path.exists():
        if not path.is_dir():
            raise OSError(f"{path}: exists and is not a directory")
        if any(path.iterdir()):
            if not force:
                raise ValueError(f"{path}: exists and is not empty (an earlier {what}?); pass {flag} to replace it")
            if owns is not None and not owns(path):
                raise ValueError(f"{path}: not a {what} directory; refusing to replace it")
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise OSError(f"{path}: {path.parent} is not writable")
        return
    _missing_parents(path)


class StagedDir:
    """A hidden temporary sibling of `final` to write outputs into; `publish()` renames it into place.

    with StagedDir(out) as stage:   # created at once: an unwritable place fails before any work
        write files under stage.path
        stage.publish()             # replaces an existing `final` (the caller checked it may)
    Leaving the block without publishing (an exception) removes the stage and the parent dirs it created.
    """

    def __init__(self, final, replace: bool = False):
        self.final = _absolute(final)
        self.replace = replace  # may publish() replace a non-empty `final` (--force)?
        self.path: Path | None = None
        self._made: list[Path] = []
        self.published = False

    def __enter__(self) -> StagedDir:
        self._made = _missing_parents(self.final)
        try:
            for parent in self._made:
                parent.mkdir()
            while True:
                tmp = _sibling(self.final, TMP_MARK)
                try:
                    tmp.mkdir()
                    break
                except FileExistsError:
                    continue
        except OSError as exc:
            self._cleanup()
            raise OSError(f"{self.final}: cannot create the output ({exc.strerror or exc})") from None
        self.path = tmp
        return self

    def publish(self) -> Path:
        """Move the stage into place (an old `final` is renamed aside first and deleted after)."""
        old = None
        if self.final.is_dir() and not self.final.is_symlink():
            if any(self.final.iterdir()):
                if not self.replace:  # it appeared while we worked (another command): keep it
                    raise OSError(f"{self.final}: appeared while this command ran; nothing was replaced")
                old = _sibling(self.final, OLD_MARK)
                os.rename(self.final, old)
            else:
                os.rmdir(self.final)
        elif self.final.exists() or self.final.is_symlink():
            raise OSError(f"{self.final}: exists and is not a directory")
        try:
            os.rename(self.path, self.final)
        except BaseException:
            if old is not None:
                os.rename(old, self.final)
            raise
        self.published = True
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.final

    def _cleanup(self) -> None:
        if self.path is not None and not self.published:
            shutil.rmtree(self.path, ignore_errors=True)
        if not self.published:
            for parent in reversed(self._made):
                try:
                    parent.rmdir()
                except OSError:
                    break

    def __exit__(self, *exc) -> bool:
        self._cleanup()
        return False


class StagedFile:
    """Like StagedDir for one output file: `path` is the temporary name; `publish()` renames it onto `final`."""

    def __init__(self, final):
        self.final = _absolute(final)
        self.path = _sibling(self.final, TMP_MARK)
        self._made: list[Path] = []
        self.published = False

    def __enter__(self) -> StagedFile:
        if self.final.is_dir():
            raise OSError(f"{self.final}: is a directory")
        self._made = _missing_parents(self.final)
        try:
            for parent in self._made:
                parent.mkdir()
        except OSError as exc:
            self.__exit__()
            raise OSError(f"{self.final}: cannot create the output ({exc.strerror or exc})") from None
        return self

    def publish(self) -> Path:
        os.replace(self.path, self.final)
        self.published = True
        return self.final

    def __exit__(self, *exc) -> bool:
        if not self.published:
            _remove(self.path)
            for parent in reversed(self._made):
                try:
                    parent.rmdir()
                except OSError:
                    break
        return False
