"""Import a DTR operator log (the JSON lines simrd parses, uwsampl/dtr-prototype).

One JSON object a line with `INSTRUCTION`:

- CONSTANT {NAME}, then MEMORY {NAME, MEMORY}: a tensor that exists before any op
  (weights, inputs): a persistent "param" storage unless it is released.
- CALL {RESULT: [names], NAME, ARGS: [names], TIME}, then per result MEMORY {NAME, MEMORY}
  and ALIAS {NAME, ALIAS}: one op taking TIME nanoseconds; a result with ALIAS -1 is a new
  storage of MEMORY bytes, ALIAS i makes it a view of the storage of ARGS[i].
- MUTATE {NAME, ARGS, MUTATE: [arg indices], TIME}: an in-place op writing those arguments
  (simrd models it as a fresh copy for rematerialisation; here the buffer is the same one).
- COPY {DST, SRC}: DST names the same tensor as SRC (one more reference).
- COPY_FROM {DST, SRC}: DST drops its tensor and names SRC's.
- RELEASE {NAME}: drops one reference; a storage is freed when no name refers to it.
- ANNOTATE {ANNOTATION}: START (what comes before is skipped, as simrd does) or BACKWARD.

Ops are CALL and MUTATE in log order, with their measured duration; the phase is forward
until BACKWARD (or an op named "...backward..."). A freed storage's lifetime ends with the
op after its last reference is released; what is never freed lives to the end.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ...errors import TraceFormatError
from ...fileio import read_text
from ...model import Op, Storage, Trace

NS_PER_S = 1e9
INSTRUCTIONS = ("CONSTANT", "MEMORY", "ALIAS", "CALL", "MUTATE", "COPY", "COPY_FROM", "RELEASE", "ANNOTATE")
NO_ALIAS = -1


@dataclass
class _Store:
    """A storage being built."""

    nbytes: int
    kind: str
    alloc_op: int
    refs: int = 0  # names (and views) currently referring to it
    free_op: int | None = None
    name: str = ""


@dataclass
class _Pending:
    """A CALL whose MEMORY/ALIAS lines are still being read."""

    lineno: int
    op: int  # its op index
    results: list  # result names
    args: list  # argument names
    memory: dict = field(default_factory=dict)  # result name -> bytes
    alias: dict = field(default_factory=dict)  # result name -> arg index or -1


@dataclass
class _Log:
    """State while replaying a log."""

    source: str
    stores: list = field(default_factory=list)
    names: dict = field(default_factory=dict)  # tensor name -> storage index
    ops: list = field(default_factory=list)  # dicts of Op fields
    pending: _Pending | None = None
    pending_const: tuple | None = None  # (name, lineno) of a CONSTANT awaiting its MEMORY
    phase: str = "forward"

    def where(self, lineno: int) -> str:
        return f"{self.source}:{lineno}"


def read_dtr_log(path: str | os.PathLike) -> Trace:
    """Read a DTR/simrd operator log as a Trace (see the module docstring).

    Raises:
        TraceFormatError: naming the file and line that is wrong.
    """
    return parse_dtr_log(read_text(path, "DTR log"), str(path))


def parse_dtr_log(text: str, source: str = "<dtr log>") -> Trace:
    """Parse the text of a DTR log; `source` names it in errors."""
    records = [(n, _json(line, source, n)) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    starts = [i for i, (_, r) in enumerate(records) if r.get("INSTRUCTION") == "ANNOTATE"
              and r.get("ANNOTATION") == "START"]
    st = _Log(source=source)
    for lineno, rec in records[starts[0] + 1 if starts else 0:]:
        _step(st, rec, lineno)
    _finish_pending(st)
    if st.pending_const:
        raise TraceFormatError(f"{st.where(st.pending_const[1])}: CONSTANT {st.pending_const[0]!r} has no MEMORY line")
    return _trace_of(st)


def _json(line: str, source: str, lineno: int) -> dict:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{source}:{lineno}: not JSON ({exc.msg})") from None
    if not isinstance(rec, dict) or rec.get("INSTRUCTION") not in INSTRUCTIONS:
        got = rec.get("INSTRUCTION") if isinstance(rec, dict) else rec
        raise TraceFormatError(f"{source}:{lineno}: field 'INSTRUCTION': expected one of {INSTRUCTIONS}, got {got!r}")
    return rec


def _get(rec: dict, key: str, typ, where: str):
    value = rec.get(key)
    if typ in (int, float):  # simrd writes some numbers as strings
        try:
            return typ(value)
        except (TypeError, ValueError):
            raise TraceFormatError(f"{where}: field {key!r}: expected a number, got {value!r}") from None
    if not isinstance(value, typ):
        raise TraceFormatError(f"{where}: field {key!r}: expected {typ.__name__}, got {value!r}")
    return value


def _step(st: _Log, rec: dict, lineno: int) -> None:
    instr, where = rec["INSTRUCTION"], st.where(lineno)
    if instr in ("MEMORY", "ALIAS"):
        _result_info(st, rec, instr, lineno)
        return
    _finish_pending(st)
    if st.pending_const:
        raise TraceFormatError(f"{where}: expected the MEMORY line of CONSTANT {st.pending_const[0]!r}")
    _HANDLERS[instr](st, rec, lineno)


def _result_info(st: _Log, rec: dict, instr: str, lineno: int) -> None:
    where = st.where(lineno)
    name = _get(rec, "NAME", str, where)
    if instr == "MEMORY" and st.pending_const and st.pending_const[0] == name:
        _new_name(st, name, _Store(nbytes=_get(rec, "MEMORY", int, where), kind="param", alloc_op=len(st.ops),
                                   name=name))
        st.pending_const = None
        return
    p = st.pending
    if p is None or name not in p.results:
        raise TraceFormatError(f"{where}: {instr} for {name!r} does not follow a CALL or CONSTANT producing it")
    if instr == "MEMORY":
        p.memory[name] = _get(rec, "MEMORY", int, where)
    else:
        p.alias[name] = _get(rec, "ALIAS", int, where)


def _constant(st: _Log, rec: dict, lineno: int) -> None:
    st.pending_const = (_get(rec, "NAME", str, st.where(lineno)), lineno)


def _call(st: _Log, rec: dict, lineno: int) -> None:
    where = st.where(lineno)
    name = _get(rec, "NAME", str, where)
    args = _get(rec, "ARGS", list, where)
    reads = _storages_of(st, args, where)
    _add_op(st, name, _get(rec, "TIME", float, where), reads, ())
    results = _get(rec, "RESULT", list, where)
    if not all(isinstance(r, str) for r in results):
        raise TraceFormatError(f"{where}: field 'RESULT': expected a list of tensor names, got {results!r}")
    st.pending = _Pending(lineno=lineno, op=len(st.ops) - 1, results=list(results), args=list(args))


def _mutate(st: _Log, rec: dict, lineno: int) -> None:
    where = st.where(lineno)
    args = _get(rec, "ARGS", list, where)
    reads = _storages_of(st, args, where)
    idx = _get(rec, "MUTATE", list, where)
    if not all(isinstance(i, int) and 0 <= i < len(args) for i in idx):
        raise TraceFormatError(f"{where}: field 'MUTATE': expected indices into ARGS, got {idx!r}")
    _add_op(st, _get(rec, "NAME", str, where), _get(rec, "TIME", float, where), reads,
            tuple(dict.fromkeys(reads[i] for i in idx)))


def _add_op(st: _Log, name: str, time_ns: float, reads, writes) -> None:
    if "backward" in name:
        st.phase = "backward"
    st.ops.append({"name": name, "phase": st.phase, "reads": tuple(dict.fromkeys(reads)), "writes": writes,
                   "duration_s": time_ns / NS_PER_S})


def _finish_pending(st: _Log) -> None:
    p, st.pending = st.pending, None
    if p is None:
        return
    new = []
    for r in p.results:
        if r not in p.memory or r not in p.alias:
            missing = "MEMORY" if r not in p.memory else "ALIAS"
            raise TraceFormatError(f"{st.where(p.lineno)}: CALL result {r!r} has no {missing} line")
        a = p.alias[r]
        if a == NO_ALIAS:
            sid = _new_name(st, r, _Store(nbytes=p.memory[r], kind=_kind(st.phase), alloc_op=p.op, name=r))
            new.append(sid)
        elif 0 <= a < len(p.args):
            _bind(st, r, st.names[p.args[a]])
        else:
            raise TraceFormatError(f"{st.where(p.lineno)}: ALIAS of {r!r} is {a}, not an index into ARGS")
    op = st.ops[p.op]
    op["writes"] = tuple(dict.fromkeys((*op["writes"], *new)))


def _kind(phase: str) -> str:
    return "activation" if phase == "forward" else "temp"


def _new_name(st: _Log, name: str, store: _Store) -> int:
    st.stores.append(store)
    _bind(st, name, len(st.stores) - 1)
    return len(st.stores) - 1


def _bind(st: _Log, name: str, sid: int) -> None:
    """Make `name` refer to storage `sid` (dropping what it referred to before)."""
    if name in st.names:
        _unref(st, st.names[name])
    st.names[name] = sid
    st.stores[sid].refs += 1


def _unref(st: _Log, sid: int) -> None:
    s = st.stores[sid]
    s.refs -= 1
    if s.refs == 0 and s.free_op is None:
        s.free_op = len(st.ops)  # released after op len(ops)-1 ran: gone from the next op on


def _storages_of(st: _Log, names: list, where: str) -> list[int]:
    out = []
    for n in names:
        if not isinstance(n, str):
            raise TraceFormatError(f"{where}: tensor names must be strings, got {n!r}")
        if n not in st.names:
            raise TraceFormatError(f"{where}: argument {n!r} was never defined")
        out.append(st.names[n])
    return out


def _copy(st: _Log, rec: dict, lineno: int) -> None:
    where = st.where(lineno)
    src = _get(rec, "SRC", str, where)
    (sid,) = _storages_of(st, [src], where)
    _bind(st, _get(rec, "DST", str, where), sid)


def _release(st: _Log, rec: dict, lineno: int) -> None:
    name = _get(rec, "NAME", str, st.where(lineno))
    if name in st.names:  # simrd ignores releases of undefined tensors too
        _unref(st, st.names.pop(name))


def _annotate(st: _Log, rec: dict, lineno: int) -> None:
    if rec.get("ANNOTATION") == "BACKWARD":
        st.phase = "backward"


_HANDLERS = {"CONSTANT": _constant, "CALL": _call, "MUTATE": _mutate, "COPY": _copy, "COPY_FROM": _copy,
             "RELEASE": _release, "ANNOTATE": _annotate}


def _trace_of(st: _Log) -> Trace:
    n = len(st.ops)
    storages = tuple(
        Storage(id=i, nbytes=s.nbytes, kind=s.kind, alloc_op=s.alloc_op,
                free_op=n if s.free_op is None else s.free_op,
                persistent=s.kind == "param" and s.free_op is None and s.alloc_op == 0, name=s.name)
        for i, s in enumerate(st.stores))
    ops = tuple(Op(index=i, **fields) for i, fields in enumerate(st.ops))
    return Trace(storages=storages, ops=ops, meta={"source": "dtr", "file": st.source})
