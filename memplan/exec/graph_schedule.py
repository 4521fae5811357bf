"""What a captured step holds, derived from its step program: the capture schedule, as data.

memplan.exec.graphed captures one planned step as a CUDA graph. Everything the graph needs is
fixed by the step program before the capture, and this module says what it is:

- static inputs: one device buffer per input tensor of the step, of its shape and dtype; each
  replay copies the batch into them;
- pinned host buffers: the host slab (memplan.exec.slab's `host_layout`), allocated before the
  capture (a graph copies to and from fixed pinned addresses);
- the copy lanes' events: one per swap-out (device-to-host) and per prefetch (host-to-device),
  recorded on its lane after the action that issues the copy, and waited for by the compute
  stream at the action the program orders it with (the swap-out's release, the prefetch's wait;
  a copy no action waits for is joined at the step's end, as a capture requires);
- the recomputations captured as kernels: per recompute action, the module call run again
  (hooked) or the ops replayed (interpreted), and how many ops they are;
- the memory pool the graph allocates from: with a plan laid out in a pool (X+smartpool, under
  the pool allocator) the layout's arena, whose footprint is the graph's memory; otherwise the
  graph's private pool of PyTorch's caching allocator, which should reach the program's
  simulated peak.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..model import Trace
from ..model.program import HOOKED, ActionKind, StepProgram
from .slab import host_layout

LAYOUT, PRIVATE = "layout", "private"  # the pools a graph allocates from
_ISSUES = {ActionKind.SWAP_OUT: "d2h", ActionKind.PREFETCH: "h2d"}  # actions that issue a copy, by lane
_JOINS = {ActionKind.RELEASE: "d2h", ActionKind.WAIT: "h2d"}  # actions whose wait joins it


@dataclass(frozen=True, kw_only=True)
class StaticInput:
    """A device buffer the batch is copied into before each replay."""

    shape: tuple[int, ...]  # the input's shape
    dtype: str  # its dtype, e.g. "float32"
    nbytes: int  # its size


@dataclass(frozen=True, kw_only=True)
class CopyEvent:
    """One event of a copy lane: recorded after a copy, waited for by the compute stream."""

    lane: str  # "d2h" (a swap-out) or "h2d" (a prefetch)
    decision: int  # index into StepProgram.decisions
    storage: int  # the trace storage copied
    nbytes: int  # its size
    issued_by: int  # index into StepProgram.actions: the action that issues the copy
    waited_by: int | None  # the action at which the compute stream waits for it (None: joined at the step's end)


@dataclass(frozen=True, kw_only=True)
class CapturedRun:
    """A recomputation captured as kernels."""

    action: int  # index into StepProgram.actions
    decision: int  # its recompute decision
    storage: int  # the storage it rebuilds
    module: str  # the module call run again (hooked); "" for replayed ops (interpreted)
    ops: int  # ops it runs (0: made by an earlier run at the same point)


@dataclass(frozen=True, kw_only=True)
class CaptureSchedule:
    """Everything a captured step holds, fixed before the capture (see the module docstring)."""

    level: str  # the executor level captured (memplan.model.program.LEVELS)
    static_inputs: tuple[StaticInput, ...]  # one per input tensor
    pinned_host_bytes: int  # the host slab
    events: tuple[CopyEvent, ...]  # in program order
    recomputations: tuple[CapturedRun, ...]  # in program order
    pool: str  # LAYOUT: the plan's arena; PRIVATE: the graph's private pool
    pool_bytes: int  # LAYOUT: the layout's footprint; PRIVATE: the program's simulated peak
    predicted_replay_s: float | None = None  # simulated seconds of one replay (memplan.sim.replayed), if known

    @property
    def static_input_bytes(self) -> int:
        """Bytes of the static inputs."""
        return sum(s.nbytes for s in self.static_inputs)

    def to_json(self) -> dict:
        """JSON-ready, with the totals a report shows."""
        out = asdict(self)
        out.update(static_input_bytes=self.static_input_bytes, copies={lane: sum(e.lane == lane for e in self.events)
                                                                       for lane in ("d2h", "h2d")},
                   recomputed_ops=sum(r.ops for r in self.recomputations))
        return out


def capture_schedule(trace: Trace, program: StepProgram, signature: tuple, *, layout_bytes: int | None = None,
                     predicted_replay_s: float | None = None) -> CaptureSchedule:
    """The capture schedule of `program` (compiled for `trace`).

    Args:
        trace: the traced iteration.
        program: its step program.
        signature: (shape, dtype, device type) of each input tensor (memplan.workflows.step_trace.input_signature).
        layout_bytes: the footprint of the plan's pool layout, when the graph allocates from it.
        predicted_replay_s: the simulated replay, when known.
    """
    inputs = tuple(StaticInput(shape=tuple(shape), dtype=str(dtype).removeprefix("torch."),
                               nbytes=math.prod(shape) * dtype.itemsize) for shape, dtype, _ in signature)
    pool, pool_bytes = (LAYOUT, layout_bytes) if layout_bytes is not None else \
        (PRIVATE, program.predicted.peak_load_bytes)
    return CaptureSchedule(level=program.level, static_inputs=inputs,
                           pinned_host_bytes=host_layout(trace, program).nbytes, events=copy_events(trace, program),
                           recomputations=captured_runs(trace, program), pool=pool, pool_bytes=int(pool_bytes),
                           predicted_replay_s=predicted_replay_s)


def copy_events(trace: Trace, program: StepProgram) -> tuple[CopyEvent, ...]:
    """One event per swap-out and per prefetch, each with the action that waits for it."""
    events: list[CopyEvent] = []
    open_at: dict[tuple[str, int], int] = {}  # (lane, decision) -> index in events of its last unjoined copy
    for i, a in enumerate(program.actions):
        if a.kind in _ISSUES:
            sid = program.decisions[a.decision].storage
            open_at[(_ISSUES[a.kind], a.decision)] = len(events)
            events.append(CopyEvent(lane=_ISSUES[a.kind], decision=a.decision, storage=sid,
                                    nbytes=int(trace.storages[sid].nbytes), issued_by=i, waited_by=None))
        elif a.kind in _JOINS:
            k = open_at.pop((_JOINS[a.kind], a.decision), None)
            if k is not None:
                e = events[k]
                events[k] = CopyEvent(lane=e.lane, decision=e.decision, storage=e.storage, nbytes=e.nbytes,
                                      issued_by=e.issued_by, waited_by=i)
    return tuple(events)


def captured_runs(trace: Trace, program: StepProgram) -> tuple[CapturedRun, ...]:
    """Per recompute action, what it runs: a hooked program's region run (once per run and point:
    the first action runs it, the others find their storage made), an interpreted one's replayed ops."""
    out, seen = [], set()
    for i, a in enumerate(program.actions):
        if a.kind != ActionKind.RECOMPUTE:
            continue
        sid = program.decisions[a.decision].storage
        if program.level == HOOKED:
            run = program.regions[a.decision]
            call = trace.calls[run.call]
            fresh = (run, a.op) not in seen
            seen.add((run, a.op))
            out.append(CapturedRun(action=i, decision=a.decision, storage=sid, module=call.module,
                                   ops=run.stop - call.first_op if fresh else 0))
        else:
            rebuild = program.rebuilds.get(a.decision)
            ops = sum(len(step.ops) for step in rebuild.steps) if rebuild else 0
            out.append(CapturedRun(action=i, decision=a.decision, storage=sid, module="", ops=ops))
    return tuple(out)

