"""Load a trace from any supported file: native JSON lines or an importable format.

The format is detected from the content, or named explicitly (`--format`):

- memplan: JSON lines whose first line is the memplan trace header;
- snapshot: a PyTorch CUDA memory snapshot, the pickle `_dump_snapshot` writes or a JSON
  dict with `device_traces` / `segments`;
- dtr: DTR (simrd) operator log lines with `INSTRUCTION`;
- minimalloc: a CSV with the header `id,lower,upper,size`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import MemplanError, TraceFormatError, unknown_name
from ..model import SCHEMA, Trace
from .importers.dtr import read_dtr_log
from .importers.minimalloc import looks_like_minimalloc, read_minimalloc
from .importers.snapshot import read_snapshot
from .io import read_trace

FORMATS = ("memplan", "snapshot", "dtr", "minimalloc")
SNIFF_BYTES = 1 << 16  # enough of the start of a file to tell the formats apart
PICKLE_PROTOCOL_BYTE = 0x80  # pickles of protocol 2 and later start with PROTO
SNAPSHOT_KEYS = ("device_traces", "segments")


def load_any(path: str | os.PathLike, format: str | None = None) -> Trace:
    """Read `path` as a Trace, detecting its format unless `format` names it.

    Args:
        path: the file.
        format: one of FORMATS, or None to detect it from the content.
    Returns:
        The Trace; imported traces name their format in `meta["source"]`.
    Raises:
        MemplanError: missing file or unknown format; TraceFormatError for bad content.
    """
    path = Path(path)
    if not path.exists():
        raise MemplanError(f"{path}: no such file")
    if path.is_dir():
        raise MemplanError(f"{path}: is a directory, expected a trace file")
    if format is not None and format not in FORMATS:
        raise unknown_name("trace format", format, FORMATS)
    fmt = format or _sniff(path)
    if fmt is not None:
        return _READERS[fmt](path)
    try:  # unrecognised: the memplan reader names the first bad line and field
        return read_trace(path)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{exc} (not a memplan trace, snapshot, DTR log or minimalloc CSV either; "
                               f"formats: {', '.join(FORMATS)})") from None


def detect_format(path: str | os.PathLike) -> str:
    """The format of `path`, from its first bytes.

    Raises:
        TraceFormatError: no known format matches.
    """
    fmt = _sniff(Path(path))
    if fmt is None:
        raise TraceFormatError(f"{path}:1: unknown trace format (expected one of {', '.join(FORMATS)}; "
                               "name it with --format)")
    return fmt


def _sniff(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError as exc:
        raise MemplanError(f"{path}: cannot read: {exc}") from None
    if head[:1] == bytes([PICKLE_PROTOCOL_BYTE]):
        return "snapshot"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    first = next((line for line in text.splitlines() if line.strip()), "").strip()
    return _format_of_line(first) or _format_of_json_file(text)


def _format_of_line(first: str) -> str | None:
    if looks_like_minimalloc(first):
        return "minimalloc"
    if not first.startswith("{"):
        return None
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return None  # a JSON document over several lines, or a first line past the sniffed bytes
    if not isinstance(record, dict):
        return None
    if record.get("schema") == SCHEMA:
        return "memplan"
    if "INSTRUCTION" in record:
        return "dtr"
    if any(k in record for k in SNAPSHOT_KEYS):
        return "snapshot"
    return None


def _format_of_json_file(text: str) -> str | None:
    """"snapshot" for a JSON document (possibly over many lines) holding a snapshot dict."""
    if not text.lstrip().startswith("{"):
        return None
    if f'"{SCHEMA}"' in text:
        return "memplan"  # a header line longer than the sniffed bytes
    if any(f'"{k}"' in text for k in SNAPSHOT_KEYS):
        return "snapshot"
    if '"INSTRUCTION"' in text:
        return "dtr"
    return None


def _read_snapshot(path: Path) -> Trace:
    return read_snapshot(path)


def _read_dtr(path: Path) -> Trace:
    return read_dtr_log(path)


def _read_minimalloc(path: Path) -> Trace:
    return read_minimalloc(path)


_READERS = {"memplan": read_trace, "snapshot": _read_snapshot, "dtr": _read_dtr, "minimalloc": _read_minimalloc}
