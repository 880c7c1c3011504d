"""A results folder claimed before any work, and files in it written whole or not at all.

A command that runs for minutes must not find out at the end that it cannot write its
results, nor leave a half-written CSV beside a complete summary when it is stopped. So:

    claim       before the first run: the folder is created (or found empty), and a probe
                file is written and removed in it. A non-empty folder is refused unless the
                command was told to overwrite it; then the files of an earlier run are
                removed first, so no stale CSV sits beside the new summary. Only files a
                results folder holds (the patterns given) are ever removed: a folder holding
                anything else is refused, not emptied.
    atomic      each file is written to a hidden temporary file in the same folder and
                renamed over its final name (`os.replace`, atomic on one file system).
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

TEMP_PREFIX = ".partial-"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() would give; mkstemp's files are private (0600)


class OutputError(ValueError):
    """A results path that cannot be used, said in one line with what to do."""


class OutputFolder:
    """A claimed results folder; `path_for` writes one file atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def claim(cls, path: Path, *, flag: str, overwrite: bool, patterns: Sequence[str],
              keep: Sequence[str] = (), remedy: str | None = None) -> OutputFolder:
        """Create or check `path` before any work. `patterns`: the names this command writes
        (what --overwrite may remove); `keep`: names a resumed command reads and keeps;
        `remedy`: what to do about a folder that is not empty (default: --overwrite)."""
        if path.exists() and not path.is_dir():
            raise OutputError(f"{flag} {path} is a file, not a folder: give a folder")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"{flag} {path}: cannot create the folder ({exc.strerror})") from None
        entries = sorted(p.name for p in path.iterdir() if p.name not in keep)
        if entries and not overwrite:
            remedy = remedy or "pass --overwrite to replace its results, or give a new folder"
            raise OutputError(f"{flag} {path} is not empty (it holds {_some(entries)}): {remedy}")
        foreign = [n for n in entries if (path / n).is_dir()
                   or not _matches(n, (*patterns, TEMP_PREFIX + "*"))]
        if foreign:
            raise OutputError(f"{flag} {path} holds files these results do not "
                              f"({_some(foreign)}): --overwrite does not remove them; "
                              "give a new folder")
        probe(path, flag)
        for name in entries:
            (path / name).unlink()
        return cls(path)

    @contextlib.contextmanager
    def path_for(self, name: str) -> Iterator[Path]:
        """Yield a temporary path to write `name` to; it takes the name once the block ends
        without an exception, and is removed otherwise."""
        with atomic_path(self.path / name) as tmp:
            yield tmp

    def write_text(self, name: str, text: str) -> Path:
        with self.path_for(name) as tmp:
            tmp.write_text(text)
        return self.path / name


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """A hidden temporary path beside `final`, renamed to it when the block succeeds."""
    fd, name = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix="-" + final.name, dir=final.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def claim_file(path: Path, *, flag: str, overwrite: bool) -> Path:
    """Check before any work that `path` can be written: its folder exists (or is made) and
    takes a file, and the file is new unless `overwrite`."""
    if path.is_dir():
        raise OutputError(f"{flag} {path} is a folder: give a file name")
    if path.exists() and not overwrite:
        raise OutputError(f"{flag} {path} exists: pass --overwrite to replace it, "
                          "or give a new name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot create its folder ({exc.strerror})") from None
    probe(path.parent, flag, shown=path)
    return path


def check_out_path(path: Path, flag: str, *, folder: bool) -> None:
    """Before any work, OutputError naming `flag` and `path` unless `path` can be written as a
    folder (`folder`) or as a file, made with its missing parent folders; nothing is created."""
    if folder and path.exists() and not path.is_dir():
        raise OutputError(f"{flag} {path}: a file, not a folder; give a folder to write into")
    if not folder and path.is_dir():
        raise OutputError(f"{flag} {path}: a folder; give the path of the file to write")
    existing = next(p for p in (path, *path.parents) if p.exists() or p == Path(p.anchor))
    if existing != path and not existing.is_dir():
        raise OutputError(f"{flag} {path}: {existing} is a file, so no folder can be made "
                          "there; give another path")
    if not os.access(existing, os.W_OK):
        raise OutputError(f"{flag} {path}: {existing} cannot be written (no permission); "
                          "give a path you can write")


def probe(folder: Path, flag: str, shown: Path | None = None) -> None:
    """Write and remove a file in `folder`, or say in one line why it cannot be written."""
    try:
        with tempfile.NamedTemporaryFile(prefix=TEMP_PREFIX, dir=folder):
            pass
    except OSError as exc:
        raise OutputError(f"{flag} {shown or folder}: cannot write there "
                          f"({exc.strerror})") from None


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def _some(names: Sequence[str]) -> str:
    shown = ", ".join(names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
