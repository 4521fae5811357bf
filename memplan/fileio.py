"""Reading and writing files the way every memplan output is written: whole or not at all."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import TraceFormatError


def read_text(path: str | os.PathLike, what: str) -> str:
    """The text of `path`, or a TraceFormatError naming the file and what it should be."""
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: cannot read {what}: {exc}") from None


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
