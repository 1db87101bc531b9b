"""Atomic, owned outputs: an output appears complete or not at all, and `--force` replaces only what we wrote.

Every command that writes (replay, trace gen/convert, sweep, plan, report, sensitivity, policy-compare, the hw
commands, --trace-events) goes through this one module (standard library only):

- A directory output is built in a hidden sibling (`.NAME.tmp-XXXX`, created with mkdir, so never a planted path)
  and renamed into place in one step; its manifest `.ulacache-manifest.json` (the command, the time and every file
  with its size and sha256) is written LAST, inside the stage, just before the rename.
- A file output is written into a fresh hidden temporary directory beside it (`.NAME.tmp-XXXX`, mkdtemp: O_EXCL,
  mode 0700), fsynced and renamed onto its name; then its manifest `.NAME.ulacache-manifest.json` is written beside it.
- Before any work an existing target is refused without `--force`; with `--force` it is replaced only when its
  manifest says the same command wrote it and every file it holds is one the manifest lists, unchanged. Anything
  else (a folder of notes, a website, a device node, a symlink, a file we did not write) is refused in one line.
  The check is repeated just before the rename, so a target that changed while the command ran is kept.
Whatever fails before the rename leaves what was on disk byte-identical and removes the temporaries (and any parent
dirs created for the output).
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

TMP_MARK = ".tmp-"
OLD_MARK = ".old-"
MANIFEST = ".ulacache-manifest.json"  # in a directory output; `.NAME` + this beside a file output
MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 64 << 20  # a manifest lists files, one line each: 64 MiB is millions of them


def is_temporary(name: str) -> bool:
    """True for the hidden names this module creates (readers skip them)."""
    return name.startswith(".") and (TMP_MARK in name or OLD_MARK in name)


def is_manifest(name: str) -> bool:
    """True for a manifest this module writes (readers of result files skip them)."""
    return name.startswith(".") and name.endswith(MANIFEST)


def file_manifest(path) -> Path:
    """The manifest beside a file output."""
    path = Path(path)
    return path.with_name(f".{path.name}{MANIFEST}")


def _absolute(path) -> Path:
    """Absolute and normalised ('out/.', 'a/../b' get a real name), without resolving symlinks."""
    return Path(os.path.abspath(path))


def _tmp_prefix(name: str) -> str:
    """`.NAME.tmp-PID-` (+ mkdtemp's random tail): the pid lets a parent clean up after a killed child."""
    return f".{name}{TMP_MARK}{os.getpid()}-"


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


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems do not sync directories
        pass
    finally:
        os.close(fd)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _command_line() -> list[str]:
    return ["ulacache", *sys.argv[1:]] if sys.argv and sys.argv[0] else ["ulacache"]


def _manifest_doc(command: str, files: dict) -> bytes:
    doc = {"tool": "ulacache", "format": MANIFEST_FORMAT, "command": command, "argv": _command_line(),
           "written_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "files": files}
    return (json.dumps(doc, indent=1) + "\n").encode()


def _write_new(path: Path, data: bytes) -> None:
    """Write `data` to a new file (O_EXCL: never through a planted link) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _listing(root: Path) -> dict:
    """Every file under `root` (relative posix path -> size, sha256), fsynced; the top-level manifest excluded."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST:
                continue
            if path.is_symlink() or not path.is_file():
                raise OSError(f"{path}: the output holds something that is not a regular file")
            _fsync_file(path)
            files[rel] = {"bytes": path.stat().st_size, "sha256": _digest(path)}
        _fsync_dir(Path(dirpath))
    return files


def write_dir_manifest(directory, command: str) -> None:
    """Write `directory`'s manifest (call LAST, when every file is in place)."""
    directory = Path(directory)
    _write_new(directory / MANIFEST, _manifest_doc(command, _listing(directory)))


def _read_manifest(path: Path) -> dict | str:
    """The manifest's content, or why it is not a usable one."""
    try:
        if path.is_symlink() or not path.is_file():
            return f"no {MANIFEST}"
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            return f"its {path.name} is over {MAX_MANIFEST_BYTES >> 20} MiB"
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return f"its {path.name} is unreadable"
    if not isinstance(doc, dict) or doc.get("tool") != "ulacache" or not isinstance(doc.get("files"), dict) \
            or not isinstance(doc.get("command"), str):
        return f"its {path.name} is not a ulacache manifest"
    return doc


def _same(path: Path, entry) -> bool:
    try:
        return isinstance(entry, dict) and path.stat().st_size == entry.get("bytes") and \
            _digest(path) == entry.get("sha256")
    except OSError:
        return False


def foreign_dir_reason(path, command: str) -> str | None:
    """None when directory `path` is an output of `ulacache COMMAND` exactly as it wrote it; else why it is not."""
    path = Path(path)
    doc = _read_manifest(path / MANIFEST)
    if isinstance(doc, str):
        return f"{doc} (not written by ulacache)" if doc == f"no {MANIFEST}" else doc
    if doc["command"] != command:
        return f"it holds the output of `ulacache {doc['command']}`, not of `ulacache {command}`"
    listed = doc["files"]
    for dirpath, dirnames, filenames in os.walk(path):
        for name in sorted(dirnames):
            if (Path(dirpath) / name).is_symlink():
                return f"{(Path(dirpath) / name).relative_to(path)} is a symbolic link ulacache did not write"
        for name in sorted(filenames):
            file = Path(dirpath) / name
            rel = file.relative_to(path).as_posix()
            if rel == MANIFEST:
                continue
            if rel not in listed:
                return f"it holds {rel}, which ulacache did not write"
            if file.is_symlink() or not file.is_file() or not _same(file, listed[rel]):
                return f"{rel} changed since ulacache wrote it"
    return None


def foreign_file_reason(path, command: str) -> str | None:
    """None when file `path` is an output of `ulacache COMMAND` exactly as it wrote it; else why it is not."""
    path = Path(path)
    doc = _read_manifest(file_manifest(path))
    if isinstance(doc, str):
        return "not written by ulacache (no manifest beside it)" if doc == f"no {MANIFEST}" else doc
    if doc["command"] != command:
        return f"it is the output of `ulacache {doc['command']}`, not of `ulacache {command}`"
    if not _same(path, doc["files"].get(path.name)):
        return "it changed since ulacache wrote it"
    return None


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


def _refuse_foreign(path: Path, reason: str, command: str) -> ValueError:
    return ValueError(f"{path}: {reason}; refusing to replace it (--force replaces only an output that "
                      f"`ulacache {command}` wrote; move it away or choose another path)")


def check_out_path(path, force: bool, command: str, what: str = "output", flag: str = "--force") -> None:
    """Refuse, before any work, a directory output path that cannot or must not receive new results.

    Accepted: absent (its nearest existing ancestor a writable directory), an empty directory, or (with `force`)
    a directory that `ulacache COMMAND` wrote and nobody changed since (its manifest). Raises OSError/ValueError.
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
            reason = foreign_dir_reason(path, command)
            if reason is not None:
                raise _refuse_foreign(path, reason, command)
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise OSError(f"{path}: {path.parent} is not writable")
        return
    _missing_parents(path)


def check_out_file(path, force: bool, command: str, flag: str = "--force") -> None:
    """Refuse, before any work, a file output path: a link, a directory, a device or other non-regular file, an
    existing file without `force`, or (with it) a file that `ulacache COMMAND` did not write."""
    path = Path(path)
    if not _absolute(path).name or str(path).endswith(os.sep):
        raise ValueError(f"{path}: not usable as an output file (give a file name)")
    if path.is_symlink():
        raise OSError(f"{path}: is a symbolic link; give the file it points to ({os.path.realpath(path)})")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        _missing_parents(_absolute(path))
        return
    except NotADirectoryError:
        raise OSError(f"{path}: a parent is not a directory") from None
    if stat.S_ISDIR(mode):
        raise OSError(f"{path}: is a directory")
    if not stat.S_ISREG(mode):
        raise OSError(f"{path}: is not a regular file (a device, pipe or socket); refusing to write there")
    if not force:
        raise ValueError(f"{path}: exists; pass {flag} to replace it")
    reason = foreign_file_reason(path, command)
    if reason is not None:
        raise _refuse_foreign(path, reason, command)
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise OSError(f"{path}: {path.parent} is not writable")


def _stage_manifest(src: Path, final: Path, command: str) -> Path:
    """fsync the staged `src` and write final's manifest to a temporary name beside it (both can fail on a full
    disk: call for every file of an output before any rename)."""
    _fsync_file(src)
    data = _manifest_doc(command, {final.name: {"bytes": src.stat().st_size, "sha256": _digest(src)}})
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(final.name), dir=final.parent)  # O_EXCL
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
    except BaseException:
        _remove(Path(tmp))
        raise
    return Path(tmp)


def atomic_write(path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a temporary file of a fresh hidden dir beside `path`, fsync, rename it onto `path`.

    For the internal files of an output this command owns (a sweep's table); no manifest, no ownership check."""
    path = _absolute(path)
    stage = Path(tempfile.mkdtemp(prefix=_tmp_prefix(path.name), dir=path.parent))
    try:
        tmp = stage / path.name
        write(tmp)
        _fsync_file(tmp)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return path


def atomic_write_text(path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_bytes(path, data: bytes) -> Path:
    return atomic_write(path, lambda p: p.write_bytes(data))


def _make_parents(final: Path, made: list[Path]) -> None:
    for parent in _missing_parents(final):
        parent.mkdir()
        made.append(parent)


def _remove_made(made: list[Path]) -> None:
    for parent in reversed(made):
        try:
            parent.rmdir()
        except OSError:
            break


class StagedDir:
    """A hidden temporary sibling of `final` to write a directory output into; `publish()` renames it into place.

    with StagedDir(out, command="replay", replace=force) as stage:  # created at once: fails before any work
        write files under stage.path
        stage.publish()   # writes the manifest last, replaces an existing `final` only if `command` wrote it
    Leaving the block without publishing (an exception) removes the stage and the parent dirs it created.
    """

    def __init__(self, final, command: str, replace: bool = False):
        self.final = _absolute(final)
        self.command = command
        self.replace = replace  # may publish() replace a non-empty `final` (--force)?
        self.path: Path | None = None
        self._made: list[Path] = []
        self.published = False

    def __enter__(self) -> StagedDir:
        try:
            _make_parents(self.final, self._made)
            self.path = Path(tempfile.mkdtemp(prefix=_tmp_prefix(self.final.name), dir=self.final.parent))
            self.path.chmod(0o755)
        except OSError as exc:
            self._cleanup()
            raise OSError(f"{self.final}: cannot create the output ({exc.strerror or exc})") from None
        return self

    def publish(self) -> Path:
        """Write the manifest, then move the stage into place (an old `final` renamed aside first, deleted after)."""
        write_dir_manifest(self.path, self.command)
        old = None
        if self.final.is_dir() and not self.final.is_symlink():
            if any(self.final.iterdir()):
                if not self.replace:  # it appeared while we worked (another command): keep it
                    raise OSError(f"{self.final}: appeared while this command ran; nothing was replaced")
                reason = foreign_dir_reason(self.final, self.command)
                if reason is not None:  # it changed while we worked: keep it
                    raise _refuse_foreign(self.final, reason, self.command)
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
        _fsync_dir(self.final.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.final

    def _cleanup(self) -> None:
        if self.path is not None and not self.published:
            shutil.rmtree(self.path, ignore_errors=True)
        if not self.published:
            _remove_made(self._made)

    def __exit__(self, *exc) -> bool:
        self._cleanup()
        return False


class StagedFile:
    """Like StagedDir for a file output: `path` is a temporary name in a fresh hidden dir beside `final`;
    `sibling(name)` another file to publish beside it (e.g. a second calibration). `publish()` checks every
    target again, then fsyncs and renames each file onto its name and writes its manifest."""

    def __init__(self, final, command: str, replace: bool = False):
        self.final = _absolute(final)
        self.command = command
        self.replace = replace
        self.stage: Path | None = None
        self.path: Path | None = None
        self._made: list[Path] = []
        self.published = False

    def __enter__(self) -> StagedFile:
        check_out_file(self.final, self.replace, self.command)
        try:
            _make_parents(self.final, self._made)
            self.stage = Path(tempfile.mkdtemp(prefix=_tmp_prefix(self.final.name), dir=self.final.parent))
        except OSError as exc:
            self.__exit__()
            raise OSError(f"{self.final}: cannot create the output ({exc.strerror or exc})") from None
        self.path = self.stage / self.final.name
        return self

    def sibling(self, name: str) -> Path:
        return self.stage / name

    def publish(self) -> Path:
        staged = sorted(p for p in self.stage.iterdir())
        if self.path not in staged:
            raise OSError(f"{self.final}: the command wrote no output")
        for src in staged:  # every target checked before any is replaced
            if src.is_symlink() or not src.is_file():
                raise OSError(f"{self.final.parent / src.name}: the output is not a regular file")
            check_out_file(self.final.parent / src.name, self.replace, self.command)
        manifests = []
        try:
            for src in staged:
                manifests.append(_stage_manifest(src, self.final.parent / src.name, self.command))
            for src, manifest in zip(staged, manifests):  # renames only from here: nothing left to run out of
                os.replace(src, self.final.parent / src.name)
                os.replace(manifest, file_manifest(self.final.parent / src.name))  # each file's manifest LAST
        except BaseException:
            for manifest in manifests:
                _remove(manifest)
            raise
        _fsync_dir(self.final.parent)
        self.published = True
        shutil.rmtree(self.stage, ignore_errors=True)
        return self.final

    def __exit__(self, *exc) -> bool:
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
        if not self.published:
            _remove_made(self._made)
        return False
