"""Reading and writing files the way every memplan output is written: whole or not at all.

An output goes to a temporary file in the target's folder and is renamed into place, so
an interrupted or failed write never leaves a partial file under the target's name (nor
the temporary one). The file gets the permissions a plain `open(path, "w")` would give
(0666 minus the umask), not the 0600 of a temporary file. A command with several outputs
writes them inside `written_together()`: none is renamed into place before all are written.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import MemplanError, TraceFormatError

NEW_FILE_MODE = 0o666  # what open(path, "w") asks for; the umask takes its bits away
# The outputs of the innermost open `written_together()` block: (temporary file, target) pairs.
_TOGETHER: contextvars.ContextVar[list[tuple[str, Path]] | None] = contextvars.ContextVar("together", default=None)


def read_text(path: str | os.PathLike, what: str) -> str:
    """The text of `path`, or a TraceFormatError naming the file and what it should be."""
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: cannot read {what}: {exc}") from None


# The file names each kind of output may have: what is written follows the name, and a name
# that says another format is refused before any work.
SUFFIXES = {
    "JSON": (".json",),
    "JSON lines": (".jsonl",),
    "CSV": (".csv",),
    "SQLite": (".sqlite", ".sqlite3", ".db"),
    "plot": (".png", ".pdf", ".svg"),
    "HTML": (".html", ".htm"),  # matplotlib writes each of these as its name says
}


def check_output_path(path: str | os.PathLike, kind: str | None = None) -> Path:
    """`path` as a Path, if a file can be written there; else MemplanError in one line.

    Checked before any long work, so that a bad `-o` fails at once: the path must not be
    a folder, its folder must exist (memplan creates files, never folders) and be
    writable, and with `kind` (a key of SUFFIXES) its name must end as that format's do.
    """
    path = Path(path)
    if path.is_dir():
        raise MemplanError(f"{path}: is a directory, expected a file name")
    folder = path.parent
    if not folder.is_dir():
        raise MemplanError(f"{path}: folder {folder} does not exist (memplan creates files, not folders)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise MemplanError(f"{path}: cannot write here ({folder} is not a writable directory)")
    if kind is not None and path.suffix.lower() not in SUFFIXES[kind]:
        raise MemplanError(f"{path}: a {kind} file's name ends in {' or '.join(SUFFIXES[kind])}")
    return path


def check_output_folder(path: str | os.PathLike) -> Path:
    """`path` as a Path, if it is a writable folder or one can be made there (its parent
    exists and is writable; only the last level is ever created); else MemplanError."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise MemplanError(f"{path}: is a file, expected a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise MemplanError(f"{path}: cannot write here (not a writable folder)")
        return path
    check_output_path(path)
    return path


def make_output_folder(path: str | os.PathLike) -> Path:
    """The folder `path`, made if missing (after `check_output_folder`)."""
    path = check_output_folder(path)
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise MemplanError(f"{path}: cannot make the folder: {exc.strerror or exc}") from None
    return path


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[str]:
    """Yield a temporary file name to write; on success it is renamed to `path` (inside
    `written_together()`, when that block completes).

    Args:
        path: the output file.
        suffix: the temporary file's suffix (writers that infer the format from it, like
            matplotlib, need the real one).
    Raises:
        MemplanError: `path` is a folder, its folder does not exist, or it cannot be written
            (one line; nothing left behind).
    """
    path = check_output_path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
        os.close(fd)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    together = _TOGETHER.get()
    try:
        yield tmp
        os.chmod(tmp, NEW_FILE_MODE & ~_umask())
        if together is None:
            os.replace(tmp, path)
        else:
            together.append((tmp, path))  # renamed when the block ends, removed if it fails
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    finally:
        if together is None or (tmp, path) not in together:
            Path(tmp).unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, then rename."""
    with atomic_output(path) as tmp:
        Path(tmp).write_text(text)


@contextlib.contextmanager
def written_together() -> Iterator[None]:
    """Outputs written inside (through `atomic_output`) appear only once the whole block has
    completed: an error or an interruption (Ctrl-C) in it leaves none of them, nor their
    temporary files, and a file they would replace keeps its old content.

    Raises:
        MemplanError: a finished output cannot be renamed into place.
    """
    staged: list[tuple[str, Path]] = []
    token = _TOGETHER.set(staged)
    completed = False
    try:
        yield
        completed = True
    finally:
        _TOGETHER.reset(token)
        _finish(staged, rename=completed)


def _finish(staged: list[tuple[str, Path]], rename: bool) -> None:
    """Rename the staged outputs into place (when `rename`); any temporary file left is removed."""
    try:
        for tmp, path in staged if rename else ():
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise _cannot_write(path, exc) from None
    finally:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)


def _cannot_write(path: Path, exc: OSError) -> MemplanError:
    return MemplanError(f"{path}: cannot write: {exc.strerror or exc}")


def _umask() -> int:
    # The only portable way to read the umask is to set it and set it back; the window is
    # two system calls, and memplan does not create files from other threads meanwhile.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
