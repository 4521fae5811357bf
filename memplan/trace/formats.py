"""Load a trace from any supported file: native JSON lines or an importable format.

The format is detected from the content, or named explicitly (`--format`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MemplanError, unknown_name
from .io import read_trace
from .model import Trace

FORMATS = ("memplan",)


def load_any(path: str | os.PathLike, format: str | None = None) -> Trace:
    """Read `path` as a Trace, detecting its format unless `format` names it.

    Raises:
        MemplanError: missing file or unknown format; TraceFormatError for bad content.
    """
    path = Path(path)
    if not path.exists():
        raise MemplanError(f"{path}: no such file")
    fmt = format or "memplan"
    if fmt not in FORMATS:
        raise unknown_name("trace format", fmt, FORMATS)
    return read_trace(path)
