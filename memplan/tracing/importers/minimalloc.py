"""minimalloc CSV (google/minimalloc): `id,lower,upper,size`, half-open lifespans [lower, upper).

Importing gives a pool-only Trace: no ops, `num_steps_hint = max(upper)`, one "temp" storage
per row named by the CSV id (ids may be strings). Exporting writes any trace (one row per
storage with a non-empty lifetime), pool problem (`memplan.pool.problem.PoolProblem`) or
sequence of (id, lower, upper, size) rows back in that format, so problems made from model
traces can be handed to minimalloc itself.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable

from ...errors import MemplanError, TraceFormatError
from ...fileio import atomic_write_text, read_text
from ...model import Storage, Trace

COLUMNS = ("id", "lower", "upper", "size")  # further columns (a solution's offset) are ignored


def is_minimalloc_header(line: str) -> bool:
    """True when `line` starts with the columns id,lower,upper,size."""
    return tuple(c.strip() for c in line.strip().split(",")[: len(COLUMNS)]) == COLUMNS


def looks_like_minimalloc(line: str) -> bool:
    """True for a CSV header naming any of the columns: the importer then says what is missing."""
    cells = [c.strip().lower() for c in line.strip().split(",")]
    return len(cells) >= 2 and any(c in COLUMNS for c in cells)


def read_minimalloc(path: str | os.PathLike) -> Trace:
    """Read a minimalloc CSV as a pool-only Trace.

    Raises:
        TraceFormatError: naming the file, line and field that is wrong.
    """
    return parse_minimalloc(read_text(path, "minimalloc CSV"), str(path))


def parse_minimalloc(text: str, source: str = "<csv>") -> Trace:
    """Parse minimalloc CSV text; `source` names it in errors."""
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or not is_minimalloc_header(",".join(rows[0])):
        raise TraceFormatError(f"{source}:1: expected the header {','.join(COLUMNS)}")
    storages, seen = [], {}
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        storage = _storage(row, len(storages), source, lineno)
        if storage.name in seen:
            raise TraceFormatError(f"{source}:{lineno}: field 'id': {storage.name!r} is already used on line "
                                   f"{seen[storage.name]}")
        seen[storage.name] = lineno
        storages.append(storage)
    horizon = max((s.free_op for s in storages), default=0)
    return Trace(storages=tuple(storages), ops=(), num_steps_hint=horizon,
                 meta={"source": "minimalloc", "file": source})


def _storage(row: list[str], sid: int, source: str, lineno: int) -> Storage:
    if len(row) < len(COLUMNS):
        raise TraceFormatError(f"{source}:{lineno}: expected {len(COLUMNS)} columns {','.join(COLUMNS)}, got {len(row)}")
    values = []
    for name, cell in zip(COLUMNS[1:], row[1:4]):
        try:
            values.append(int(cell))
        except ValueError:
            raise TraceFormatError(f"{source}:{lineno}: field {name!r}: expected an integer, got {cell!r}") from None
    lower, upper, size = values
    if lower < 0 or upper <= lower:
        raise TraceFormatError(f"{source}:{lineno}: field 'upper': need 0 <= lower < upper, got [{lower}, {upper})")
    if size <= 0:
        raise TraceFormatError(f"{source}:{lineno}: field 'size': need a positive size, got {size}")
    return Storage(id=sid, nbytes=size, kind="temp", alloc_op=lower, free_op=upper, name=row[0].strip())


def minimalloc_rows(obj) -> list[tuple[str, int, int, int]]:
    """The (id, lower, upper, size) rows of a Trace, a PoolProblem or a row sequence.

    Args:
        obj: a Trace (storages with a non-empty lifetime and size; id = name for imported
            minimalloc traces, else the storage id), an object with `names`, `starts`, `ends`,
            `sizes` (a PoolProblem), or an iterable of 4-tuples.
    Returns:
        The rows, ready to write.
    """
    if isinstance(obj, Trace):
        use_names = obj.meta.get("source") == "minimalloc"
        return [(s.name if use_names and s.name else str(s.id), s.alloc_op, s.free_op, s.nbytes)
                for s in obj.storages if s.nbytes > 0 and s.free_op > s.alloc_op]
    if all(hasattr(obj, a) for a in ("names", "starts", "ends", "sizes")):
        return [(str(n), int(lo), int(hi), int(sz))
                for n, lo, hi, sz in zip(obj.names, obj.starts, obj.ends, obj.sizes)]
    return _check_rows(obj)


def _check_rows(rows: Iterable) -> list[tuple[str, int, int, int]]:
    out = []
    for i, row in enumerate(rows):
        try:
            ident, lower, upper, size = row
            out.append((str(ident), int(lower), int(upper), int(size)))
        except (TypeError, ValueError):
            raise MemplanError(f"buffer {i}: expected (id, lower, upper, size), got {row!r}") from None
        if out[-1][2] <= out[-1][1] or out[-1][3] <= 0 or out[-1][1] < 0:
            raise MemplanError(f"buffer {i} ({out[-1][0]}): need 0 <= lower < upper and size > 0")
    return out


def write_minimalloc_csv(trace_or_buffers, path: str | os.PathLike) -> int:
    """Write a trace, pool problem or (id, lower, upper, size) rows as a minimalloc CSV, atomically.

    Returns:
        The number of rows written.
    """
    rows = minimalloc_rows(trace_or_buffers)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())
    return len(rows)
