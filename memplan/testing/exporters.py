"""Write any Trace in the formats memplan imports, so tests can feed planners imported traces.

- `dtr_log(trace)`: a DTR (simrd) operator log. Storages that exist before their first
  write are CONSTANTs; an op that makes storages is a CALL with them as results (its
  in-place targets become plain arguments: a DTR call has no in-place results), an op
  that only writes in place is a MUTATE, and an op that writes nothing (a view) is a CALL
  whose result aliases its first argument. RELEASE ends lifetimes; ANNOTATE BACKWARD
  starts the backward phase. Module paths, FLOPs and the optimizer phase are lost, as in
  a real log.
- `snapshot(trace)`: a CUDA memory snapshot dict: an alloc event per storage born in the
  iteration, a free per storage that dies before its end, stack frames that tell the
  importer the phase, and persistent storages as blocks still allocated at the end.
- `reimport(trace, fmt)`: the trace written in `fmt` (those two, or minimalloc's CSV, or
  memplan's own JSON lines) and read back through `memplan.tracing.formats.load_any`,
  format detection included.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ..model.blocks import allocated_size
from ..model import Trace
from ..tracing.formats import load_any
from ..tracing.importers.minimalloc import write_minimalloc_csv
from ..tracing.io import write_trace

DEFAULT_OP_NS = 10_000  # a DTR CALL needs a time; ops the trace leaves to the cost model get this
FORMATS = ("memplan", "dtr", "snapshot", "minimalloc")
_SUFFIX = {"memplan": ".jsonl", "dtr": ".log", "snapshot": ".json", "minimalloc": ".csv"}
_FRAMES = {  # a stack per phase, as the snapshot importer reads phases from them
    "forward": [{"filename": "model.py", "line": 1, "name": "forward"}],
    "backward": [{"filename": "torch/autograd/graph.py", "line": 1, "name": "_engine_run_backward"}],
    "optimizer": [{"filename": "torch/optim/sgd.py", "line": 1, "name": "step"}],
}
ADDRESS_SHIFT = 32  # storage i lives at address (i + 1) << 32: distinct, whatever the sizes


def made_by(trace: Trace, sid: int) -> int | None:
    """The op that creates storage `sid` (its first access, a write, at its alloc op); None when
    it exists before that (persistent, an input, or first read)."""
    s = trace.storages[sid]
    accesses = trace.accesses[sid]
    if s.persistent or not accesses or accesses[0] != s.alloc_op:
        return None
    return s.alloc_op if sid in trace.ops[s.alloc_op].writes else None


# --- DTR --------------------------------------------------------------------------------------------


def dtr_log(trace: Trace) -> str:
    """The trace as a DTR operator log (see the module docstring)."""
    makers = [made_by(trace, s.id) for s in trace.storages]
    lines, started_backward = [], False
    for i, op in enumerate(trace.ops):
        for s in _constants_at(trace, makers, i):
            lines += [_record("CONSTANT", NAME=_name(s.id)), _record("MEMORY", NAME=_name(s.id), MEMORY=s.nbytes)]
        if op.phase != "forward" and not started_backward:
            lines.append(_record("ANNOTATE", ANNOTATION="BACKWARD"))
            started_backward = True
        lines += _op_records(trace, op, [w for w in op.writes if makers[w] == i])
        lines += [_record("RELEASE", NAME=_name(s.id)) for s in _dying_after(trace, i)]
    return "".join(json.dumps(r) + "\n" for r in lines)


def _dying_after(trace: Trace, i: int) -> list:
    """Storages whose lifetime ends with op i, before the end of the iteration."""
    return [s for s in trace.storages if s.free_op == i + 1 < len(trace.ops)]


def _constants_at(trace: Trace, makers: list, i: int) -> list:
    """Storages that exist before their first write and are born at op i."""
    return [s for s in trace.storages if makers[s.id] is None and s.alloc_op == i and s.free_op > s.alloc_op]


def _op_records(trace: Trace, op, new: list[int]) -> list[dict]:
    time_ns = round((DEFAULT_OP_NS / 1e9 if op.duration_s is None else op.duration_s) * 1e9)
    in_place = [w for w in op.writes if w not in new]
    args = list(dict.fromkeys((*op.reads, *in_place)))
    if in_place and not new:
        return [_record("MUTATE", NAME=op.name, ARGS=[_name(a) for a in args],
                        MUTATE=[args.index(w) for w in in_place], TIME=time_ns)]
    if not new and args:  # a view: its result aliases its first argument, and is dropped at once
        view = f"view{op.index}"
        return [_record("CALL", NAME=op.name, ARGS=[_name(a) for a in args], RESULT=[view], TIME=time_ns),
                _record("MEMORY", NAME=view, MEMORY=0), _record("ALIAS", NAME=view, ALIAS=0),
                _record("RELEASE", NAME=view)]
    out = [_record("CALL", NAME=op.name, ARGS=[_name(a) for a in args], RESULT=[_name(s) for s in new], TIME=time_ns)]
    for s in new:
        out += [_record("MEMORY", NAME=_name(s), MEMORY=trace.storages[s].nbytes),
                _record("ALIAS", NAME=_name(s), ALIAS=-1)]
    return out


def _record(instruction: str, **fields) -> dict:
    return {"INSTRUCTION": instruction, **fields}


def _name(sid: int) -> str:
    return f"t{sid}"


# --- CUDA memory snapshot ---------------------------------------------------------------------------


def snapshot(trace: Trace) -> dict:
    """The trace as a CUDA memory snapshot dict (see the module docstring)."""
    events = []
    for i, op in enumerate(trace.ops):
        frames = _FRAMES[op.phase]
        events += [_event("alloc", s, frames) for s in trace.storages
                   if s.alloc_op == i < s.free_op and not s.persistent]
        for s in _dying_after(trace, i):
            events += [_event("free_requested", s, frames), _event("free_completed", s, frames)]
    # a block's size is the allocator's (memplan.model.blocks), its requested_size what was asked
    segments = [{"device": 0, "address": _address(s.id), "total_size": allocated_size(s.nbytes), "stream": 0,
                 "blocks": [{"size": allocated_size(s.nbytes), "requested_size": s.nbytes, "state": "active_allocated",
                             "frames": []}]}
                for s in trace.storages if s.persistent]
    return {"segments": segments, "device_traces": [events]}


def _event(action: str, s, frames) -> dict:
    return {"action": action, "addr": _address(s.id), "size": s.nbytes, "stream": 0, "frames": frames}


def _address(sid: int) -> int:
    return (sid + 1) << ADDRESS_SHIFT


# --- round trip -------------------------------------------------------------------------------------


def write_as(trace: Trace, fmt: str, path: str | Path) -> Path:
    """Write `trace` to `path` in format `fmt` (one of FORMATS); returns the path."""
    path = Path(path)
    if fmt == "memplan":
        write_trace(trace, path)
    elif fmt == "dtr":
        path.write_text(dtr_log(trace))
    elif fmt == "snapshot":
        path.write_text(json.dumps(snapshot(trace)))
    elif fmt == "minimalloc":
        write_minimalloc_csv(trace, path)
    else:
        raise ValueError(f"unknown format {fmt!r}; known: {FORMATS}")
    return path


def reimport(trace: Trace, fmt: str) -> Trace:
    """`trace` written in `fmt` and read back with format detection (`load_any`)."""
    with tempfile.TemporaryDirectory(prefix="memplan-export-") as folder:
        return load_any(write_as(trace, fmt, Path(folder) / f"trace{_SUFFIX[fmt]}"))
