"""Traces as JSON lines: a header line, then one storage or op record per line.

Loading checks the schema and every field, and names the file, line and field that is
wrong; writing goes to a temporary file renamed into place, so no half-written trace is
ever left behind. The header counts the storage and op records, so a file cut short (even
at a line boundary) is refused rather than read as a shorter iteration; every op's storage
ids and every lifetime must lie inside the trace.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields

from ..errors import TraceFormatError
from ..fileio import atomic_write_text, read_text
from ..model import READABLE_VERSIONS, SCHEMA, SCHEMA_VERSION, Call, ConvParams, Mark, Op, Owner, Saved, Storage, Trace

_REQUIRED = {
    "storage": {"id": int, "nbytes": int, "kind": str, "alloc_op": int, "free_op": int},
    "op": {"index": int, "name": str, "phase": str},
    "owner": {"storage": int, "kind": str},
    "saved": {"packed_at": int},
    "call": {"module": str, "occurrence": int, "first_op": int, "end_op": int, "first_saved": int, "end_saved": int},
    "mark": {"kind": str, "key": str, "occurrence": int, "point": int},
}
_OPTIONAL = {
    "storage": {"persistent": bool, "dtype": (str, type(None)), "shape": (list, type(None)),
                "name": (str, type(None))},
    "op": {"module": str, "reads": list, "writes": list, "flops": (int, float),
           "bytes_accessed": int, "duration_s": (int, float, type(None)), "conv": dict},
    "owner": {"name": str, "group": int, "index": int, "key": str},
    "saved": {"storage": (int, type(None)), "unpacked_at": (int, type(None))},
    "call": {"args": list},
    "mark": {},
}
_CLASSES = {"storage": Storage, "op": Op, "owner": Owner, "saved": Saved, "call": Call, "mark": Mark}
# The header's count of each record kind, by the name it has there.
_COUNTS = (("storages", "storage"), ("ops", "op"), ("owners", "owner"), ("saved", "saved"), ("calls", "call"),
           ("marks", "mark"))


def write_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Write `trace` to `path` as JSON lines, atomically."""
    header = {"schema": SCHEMA, "version": SCHEMA_VERSION, "meta": trace.meta,
              "num_steps_hint": trace.num_steps_hint, "storages": len(trace.storages), "ops": len(trace.ops),
              "owners": len(trace.owners), "saved": len(trace.saved), "calls": len(trace.calls),
              "marks": len(trace.marks)}
    lines = [json.dumps(header, default=str)]
    lines += [json.dumps({"type": "storage", **_compact(asdict(s))}) for s in trace.storages]
    lines += [json.dumps({"type": "op", **_compact(asdict(op))}) for op in trace.ops]
    lines += [json.dumps({"type": "owner", **_compact(asdict(o))}) for o in trace.owners]
    lines += [json.dumps({"type": "saved", **_compact(asdict(s))}) for s in trace.saved]
    lines += [json.dumps({"type": "call", **asdict(c)}) for c in trace.calls]
    lines += [json.dumps({"type": "mark", **asdict(m)}) for m in trace.marks]
    atomic_write_text(path, "\n".join(lines) + "\n")


def read_trace(path: str | os.PathLike) -> Trace:
    """Read a trace written by `write_trace`.

    Raises:
        TraceFormatError: naming the file, line and field that is wrong.
    """
    return parse_trace(read_text(path, "trace"), str(path))


def parse_trace(text: str, source: str = "<trace>") -> Trace:
    """Parse the JSON-lines text of a trace; `source` names it in errors."""
    lines = text.splitlines()
    if not lines:
        raise TraceFormatError(f"{source}: empty file, expected a memplan trace header")
    header = _json_line(lines[0], source, 1)
    if header.get("schema") != SCHEMA:
        raise TraceFormatError(f"{source}:1: field 'schema': expected {SCHEMA!r}, got {header.get('schema')!r}")
    if header.get("version") not in READABLE_VERSIONS:
        raise TraceFormatError(f"{source}:1: field 'version': expected one of {READABLE_VERSIONS}, "
                               f"got {header.get('version')!r}")
    records: dict[str, list] = {kind: [] for kind in _REQUIRED}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        record = _json_line(line, source, lineno)
        kind = record.pop("type", None)
        if not isinstance(kind, str) or kind not in _REQUIRED:
            raise TraceFormatError(f"{source}:{lineno}: field 'type': expected one of "
                                   f"{', '.join(map(repr, _REQUIRED))}, got {kind!r}")
        _check_fields(record, kind, source, lineno)
        try:
            records[kind].append(_build(kind, record))
        except ValueError as exc:
            raise TraceFormatError(f"{source}:{lineno}: {exc}") from None
    _check_counts(header, records, source)
    hint = header.get("num_steps_hint") or 0
    meta = header.get("meta") or {}
    if not _is(hint, int) or hint < 0 or not isinstance(meta, dict):
        raise TraceFormatError(f"{source}:1: field 'num_steps_hint' or 'meta': wrong type")
    try:
        trace = Trace(storages=tuple(records["storage"]), ops=tuple(records["op"]), owners=tuple(records["owner"]),
                      saved=tuple(records["saved"]), calls=tuple(records["call"]), marks=tuple(records["mark"]),
                      meta=meta, num_steps_hint=hint)
    except ValueError as exc:
        raise TraceFormatError(f"{source}: {exc}") from None
    _check_references(trace, source)
    return trace


def _check_counts(header: dict, records: dict[str, list], source: str) -> None:
    """Traces written with record counts must have them all (older files have none)."""
    for name, kind in _COUNTS:
        expected = header.get(name)
        if expected is None:
            continue
        if not _is(expected, int):
            raise TraceFormatError(f"{source}:1: field {name!r}: wrong type {type(expected).__name__}")
        if expected != len(records[kind]):
            raise TraceFormatError(f"{source}: the header announces {expected} {name}, the file has "
                                   f"{len(records[kind])} (cut short or edited?)")


def _check_references(trace: Trace, source: str) -> None:
    """Storage ids of every op, and every lifetime, inside the trace."""
    n_storages, horizon = len(trace.storages), trace.num_steps
    for op in trace.ops:
        bad = next((sid for sid in op.reads + op.writes if not 0 <= sid < n_storages), None)
        if bad is not None:
            raise TraceFormatError(f"{source}: op {op.index} names storage {bad}, the trace has {n_storages}")
    for s in trace.storages:
        if s.alloc_op < 0 or s.free_op > horizon:
            raise TraceFormatError(f"{source}: storage {s.id}: lifetime [{s.alloc_op}, {s.free_op}) is outside "
                                   f"the trace's {horizon} steps")


_ALWAYS_WRITTEN = ("id", "index", "alloc_op", "free_op", "nbytes", "storage", "group", "packed_at")


def _compact(record: dict) -> dict:
    """Drop fields at their defaults to keep lines short (a scalar's shape () is kept)."""
    return {k: v for k, v in record.items()
            if v not in (None, (), False, "", 0.0) or k in _ALWAYS_WRITTEN or (k == "shape" and v is not None)}


def _json_line(line: str, source: str, lineno: int) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{source}:{lineno}: not JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise TraceFormatError(f"{source}:{lineno}: expected a JSON object")
    return record


def _check_fields(record: dict, kind: str, source: str, lineno: int) -> None:
    for name, typ in _REQUIRED[kind].items():
        if name not in record:
            raise TraceFormatError(f"{source}:{lineno}: {kind} record is missing field {name!r}")
        if not _is(record[name], typ):
            raise TraceFormatError(f"{source}:{lineno}: field {name!r}: wrong type {type(record[name]).__name__}")
    for name, value in record.items():
        typ = _REQUIRED[kind].get(name) or _OPTIONAL[kind].get(name)
        if typ is None:
            raise TraceFormatError(f"{source}:{lineno}: unknown {kind} field {name!r}")
        if not _is(value, typ):
            raise TraceFormatError(f"{source}:{lineno}: field {name!r}: wrong type {type(value).__name__}")
    for name in ("reads", "writes", "shape", "args"):
        if isinstance(record.get(name), list) and not all(_is(v, int) for v in record[name]):
            raise TraceFormatError(f"{source}:{lineno}: field {name!r}: expected a list of integers")


def _is(value, typ) -> bool:
    """isinstance, except that bool is not accepted as an int."""
    types = typ if isinstance(typ, tuple) else (typ,)
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _build(kind: str, record: dict):
    cls = _CLASSES[kind]
    names = {f.name for f in fields(cls)}
    args = {k: v for k, v in record.items() if k in names}
    for key in ("reads", "writes", "shape", "args"):
        if isinstance(args.get(key), list):
            args[key] = tuple(args[key])
    if "conv" in args:
        args["conv"] = _conv(args["conv"])
    return cls(**args)


_CONV_FIELDS = {f.name: (list if f.name == "kernels" else str if f.name == "dtype" else int)
                for f in fields(ConvParams)}


def _conv(record: dict) -> ConvParams:
    """An op's convolution parameters, every field of its JSON type (ValueError names the bad one)."""
    for name, value in record.items():
        typ = _CONV_FIELDS.get(name)
        if typ is None or not _is(value, typ):
            raise ValueError(f"field 'conv': bad or unknown entry {name!r}")
    if not all(isinstance(k, str) for k in record.get("kernels", [])):
        raise ValueError("field 'conv': kernels must be strings")
    try:
        return ConvParams(**{**record, "kernels": tuple(record.get("kernels", ()))})
    except TypeError as exc:
        raise ValueError(f"field 'conv': {exc}") from None
