"""Record one training iteration of any PyTorch step function as a `Trace`.

A `TorchDispatchMode` sees every aten op of the step (forward, backward and optimizer
step) and records the storages each op reads and writes. Storages are identified by
their StorageImpl, so views and in-place results map to the buffer they alias; a
storage is born at the op that first writes it (op 0 if it pre-exists) and dies at the
first op after the framework freed it (weak references swept between ops), or at the
end. Phase and owning module come from `context.ProgramContext`, kinds from `classify`.

Steady state: the step runs `warmup` times (default once) before the traced run, so an
optimizer that creates its state lazily (Adam, SGD with momentum) has it already: the
traced iteration is a steady-state one, and its optimizer state is persistent.

With fake tensors (`FakeTensorMode`) nothing is allocated: a 40 GB iteration traces on a
laptop, and with `time_ops` each op is timed alone on real random inputs of its shapes, on
the device the trace stands for (`opbench`). With real CUDA tensors each op's duration is
measured with CUDA events as it runs; with real CPU tensors and `time_repeats`, as the least
wall time over that many more iterations (`optimes`). The math settings in force (TF32,
autocast) are recorded in `meta["math"]` (`mathmode`), for the cost model.

Saved-tensor hooks record every tensor autograd saves (`Trace.saved`) and the context every
module call (`Trace.calls`), gradient accumulated and optimizer step (`Trace.marks`, with where each
parameter's update begins in a step that updates one at a time: memplan.tracing.stepwise): the
points the hooked executor acts at (memplan.model.hookpoints).
Under them autograd makes other detaches than without (optional ops, memplan.tracing.opinfo):
the interpreted executor and the CPU op timer run the step under identity hooks, so they meet
the trace's ops exactly, and plain training differs from them only in optional ops. `Trace.owners` says who holds each persistent storage
between steps: a parameter, buffer or parameter's gradient by name, or optimizer state by
(param group, index in the group, state key); the executor finds them with it before any op
of a step runs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

import torch
from torch._guards import detect_fake_mode
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

from ..errors import MemplanError, model_code
from ..model import Op, Owner, Saved, Trace
from .classify import kind_of, to_storage
from .context import ProgramContext
from .fake import new_fake_mode, optimizer_as_on_device, quiet_fake_warnings
from .mathmode import math_settings
from .opbench import OpBench
from .opinfo import bytes_accessed, conv_params, counts_as_op, flops_of, is_recorded, moves_no_data, split_tensors
from .optimes import time_ops as time_ops_apart
from .stepwise import update_marks
from .storages import StorageTable

log = logging.getLogger(__name__)

PROGRESS_EVERY = 512  # ops between two progress callbacks
DEFAULT_WARMUP = 1  # untraced iterations first, so lazily created optimizer state exists
_MS = 1e-3


def trace(step_fn: Callable, *example_inputs, fake: bool = True, model: torch.nn.Module | None = None,
          optimizer: torch.optim.Optimizer | None = None, warmup: int = DEFAULT_WARMUP,
          progress: Callable[[int], None] | None = None, meta: dict | None = None,
          time_repeats: int = 0, time_clock: str = "wall", time_ops: bool = False) -> Trace:
    """Trace one training iteration `step_fn(*example_inputs)`.

    Args:
        step_fn: runs forward, backward and the optimizer step (a zoo Workload's `.step`).
        example_inputs: its arguments.
        fake: True when the model and inputs were built under a `FakeTensorMode` (nothing
            is allocated); False for real CPU or CUDA tensors.
        model: the model, to name modules and parameters (found on `step_fn.__self__.model`
            when omitted).
        optimizer: its optimizer, to find optimizer state (likewise).
        warmup: untraced iterations run first (steady state; lazily created state exists).
        progress: called with the number of ops recorded so far, now and then.
        meta: extra entries for `trace.meta` (model name, batch, ...).
        time_repeats: real CPU tensors only: run this many more iterations after the traced
            one and give every op its least measured duration (0: no durations). The
            iterations train the model on: restore it afterwards where that matters.
        time_clock: "wall" or "cpu" (this thread's CPU time), see `optimes`.
        time_ops: fake tensors only: time each op alone on real random inputs of its shapes, on
            the device the fake tensors stand for (`opbench`; identical calls are timed once).
    Returns:
        The trace of the last iteration.
    Raises:
        MemplanError: `fake` disagrees with the tensors given; `time_ops` on real tensors, or
            for a device this machine does not have.
        ModelError: the step raised (one line, "its training step failed: Type: message").
    """
    model, optimizer = _owners(step_fn, model, optimizer)
    mode = _fake_mode_for(fake, example_inputs, model)
    if time_ops and not fake:
        raise MemplanError("time_ops times the ops of a fake trace; a real trace measures them as they run "
                           "(CUDA events, or time_repeats on the CPU)")
    device = _device_of(example_inputs, model)
    bench = OpBench(device) if time_ops else None
    with mode if mode is not None else contextlib.nullcontext(), quiet_fake_warnings(), \
            optimizer_as_on_device(optimizer) if fake else contextlib.nullcontext(), \
            model_code("its training step failed"):
        for _ in range(warmup):
            step_fn(*example_inputs)
        recorder = _Recorder(ProgramContext(model), timed=not fake and _on_cuda(example_inputs, model),
                             progress=progress, bench=bench)
        _register_preexisting(recorder.table, model, optimizer, example_inputs)
        start = time.perf_counter()
        recorder.run(step_fn, example_inputs)
        _hint_after_step(recorder.table, model, optimizer)
        recorder.find_owners(model, optimizer)
        seconds = time.perf_counter() - start
        if time_repeats and not fake and not _on_cuda(example_inputs, model):
            recorder.measured = time_ops_apart(step_fn, example_inputs, [op.name for op in recorder.ops],
                                               time_repeats, time_clock)
    log.info("traced %d ops, %d storages in %.2f s", len(recorder.ops), len(recorder.table.entries), seconds)
    timing = _timing_meta(bench, bool(recorder.measured), time_repeats, time_clock)
    info = {"source": "tracer", "fake": fake, "warmup": warmup, "torch": torch.__version__,
            **timing, **({"torch_threads": torch.get_num_threads()} if timing else {}),
            "math": math_settings(torch.device(device).type), "device": device, "trace_seconds": round(seconds, 3),
            **(meta or {})}
    return recorder.build(info)


def _timing_meta(bench: OpBench | None, measured: bool, time_repeats: int, time_clock: str) -> dict:
    """How the trace's op times were found: op by op on the device (with each op's inner memory),
    or over repeated iterations on the CPU; empty when it has none."""
    if bench is None:
        return {"time_repeats": time_repeats, "time_clock": time_clock} if measured else {}
    timing: dict = {"op_times": bench.summary()}
    if bench.inner_bytes():  # JSON keys are strings: memplan.cost.device_memory reads them back
        timing["op_inner_bytes"] = {str(op): nbytes for op, nbytes in sorted(bench.inner_bytes().items())}
    return timing


class _Recorder(TorchDispatchMode):
    """The dispatch mode that records ops and storages."""

    def __init__(self, context: ProgramContext, *, timed: bool, progress, bench: OpBench | None = None):
        super().__init__()
        self.table = StorageTable()
        self.context = context
        self.ops: list[Op] = []
        self.saved: list[list] = []  # per pack: [storage id or None, packed at, unpacked at or None]
        context.clock = lambda: (len(self.ops), len(self.saved))
        context.storages_of = self._storages_of
        self.alive_at_end: set[int] = set()
        self.owners: tuple[Owner, ...] = ()
        self._timer = _CudaTimer() if timed else None
        self.measured: list[float | None] | None = None  # measured apart (optimes), or op by op (opbench)
        self._bench = bench
        self._progress = progress

    def run(self, step_fn: Callable, inputs: tuple) -> None:
        """Run the step once under the mode and the module hooks."""
        with self.context.installed(), self, self._watching_resizes(), self._saving():
            step_fn(*inputs)
        self.alive_at_end = {e.sid for e in self.table.alive()}
        self.table.sweep(len(self.ops))

    @contextlib.contextmanager
    def _watching_resizes(self):
        """See `UntypedStorage.resize_` calls: FSDP2 frees unsharded parameters by resizing
        their storage to 0 (and back before the next all-gather), which no op shows."""
        original = torch.UntypedStorage.resize_
        recorder = self

        def resize_(storage, size):
            out = original(storage, size)
            phase = recorder.context.phase()
            recorder.table.resized(storage, storage.nbytes(), len(recorder.ops), phase)
            return out

        torch.UntypedStorage.resize_ = resize_
        try:
            yield
        finally:
            torch.UntypedStorage.resize_ = original

    def _storages_of(self, args, kwargs) -> tuple[int, ...]:
        entries = (self.table.lookup(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
        return tuple(dict.fromkeys(e.sid for e in entries if e is not None))

    def _saving(self):
        """Record what autograd saves, and when backward unpacks it (the tensor itself is kept)."""
        def pack(t):
            entry = self.table.lookup(t)
            self.saved.append([None if entry is None else entry.sid, len(self.ops), None])
            return len(self.saved) - 1, t

        def unpack(packed):
            n, t = packed
            if self.saved[n][2] is None:
                self.saved[n][2] = len(self.ops)
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(is_traceable_wrapper_subclass(t) for t in tree_leaves((args, kwargs))):
            # A tensor subclass (FSDP2's DTensor parameters): it runs its ops on its local
            # tensors, which come back through this mode; the rank's memory is theirs.
            return NotImplemented
        if not is_recorded(func):
            return func(*args, **kwargs)
        index = len(self.ops)
        self.table.sweep(index)
        phase = self.context.phase()
        module = self.context.module(phase)
        call = self._bench.call(func, args, kwargs) if self._bench else None  # before an in-place view op
        start = self._timer.start() if self._timer else None
        out = func(*args, **kwargs)
        if not counts_as_op(func, args, kwargs, out):
            return out  # a metadata query, or no tensor involved
        if self._timer:
            self._timer.stop(index, start)
        if call is not None:
            self._bench.time(index, call)
        self._record(func, args, kwargs, out, index, phase, module)
        return out

    def _record(self, func, args, kwargs, out, index: int, phase: str, module: str) -> None:
        tensors = split_tensors(func, args, kwargs, out)
        reads = [self.table.get_or_add(t, 0, None).sid for t in tensors.reads]
        writes = [self.table.get_or_add(t, 0, None).sid for t in tensors.written]
        writes += [self.table.get_or_add(t, index, phase).sid for t in tensors.fresh]
        touched = () if tensors.is_view or moves_no_data(func) else tensors.reads + tensors.written + tensors.fresh
        self.ops.append(Op(index=index, name=str(func), phase=phase, module=module,
                           reads=tuple(dict.fromkeys(reads)), writes=tuple(dict.fromkeys(writes)),
                           flops=flops_of(func, args, kwargs, out), bytes_accessed=bytes_accessed(touched),
                           conv=conv_params(func, args)))
        if self._progress and (index + 1) % PROGRESS_EVERY == 0:
            self._progress(index + 1)

    def find_owners(self, model, optimizer) -> None:
        """Who holds each persistent storage after the step, and where each parameter's update began."""
        self.owners = owner_records(self.table, model, optimizer)
        updates = update_marks(self.ops, self.owners, self.context.marks, model, optimizer)
        self.context.marks = sorted([*self.context.marks, *updates], key=lambda m: m.point)  # stable: fire order

    def build(self, meta: dict) -> Trace:
        """The Trace of the recorded iteration."""
        n = len(self.ops)
        first_bwd = next((op.index for op in self.ops if op.phase == "backward"), None)
        touched: dict[int, set[str]] = {}
        for op in self.ops:
            for sid in op.reads + op.writes:
                touched.setdefault(sid, set()).add(op.phase)
        storages = tuple(to_storage(e, kind_of(e, alive_at_end=e.sid in self.alive_at_end, first_backward=first_bwd,
                                               touched_in=frozenset(touched.get(e.sid, ()))), n)
                         for e in self.table.entries)
        ops = tuple(self.ops)
        if self._bench:
            self.measured = self._bench.durations(n)
        durations = self._timer.durations(n) if self._timer else self.measured
        if durations:
            ops = tuple(_with_duration(op, d) for op, d in zip(ops, durations))
        saved = tuple(Saved(storage=sid, packed_at=packed, unpacked_at=unpacked)
                      for sid, packed, unpacked in self.saved)
        calls = tuple(sorted(self.context.calls, key=lambda c: (c.first_op, -c.end_op, c.first_saved)))
        return Trace(storages=storages, ops=ops, meta=meta, owners=self.owners, saved=saved, calls=calls,
                     marks=tuple(self.context.marks))


def owner_records(table: StorageTable, model, optimizer) -> tuple[Owner, ...]:
    """Who holds each persistent storage: a parameter, buffer or gradient by the parameter's
    or buffer's name, optimizer state by its place in `optimizer.param_groups` and its key."""
    out: dict[int, Owner] = {}

    def add(t, **record):
        entry = table.lookup(t) if isinstance(t, torch.Tensor) else None
        if entry is not None and entry.sid not in out:
            out[entry.sid] = Owner(storage=entry.sid, **record)

    if model is not None:
        for name, p in model.named_parameters():
            add(p, kind="param", name=name)
            add(p.grad, kind="grad", name=name)
        for name, b in model.named_buffers():
            add(b, kind="buffer", name=name)
    for g, group in enumerate(getattr(optimizer, "param_groups", ())):
        for i, p in enumerate(group["params"]):
            for key, value in optimizer.state.get(p, {}).items():
                add(value, kind="state", group=g, index=i, key=key)
    return tuple(sorted(out.values(), key=lambda o: o.storage))


class _CudaTimer:
    """Per-op CUDA event pairs, resolved once after the step (one synchronize)."""

    def __init__(self):
        self._events: dict[int, tuple] = {}

    def start(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, index: int, start) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._events[index] = (start, end)

    def durations(self, n: int) -> list[float | None]:
        """Seconds per op (None for ops without events)."""
        torch.cuda.synchronize()
        pairs = [self._events.get(i) for i in range(n)]
        return [p[0].elapsed_time(p[1]) * _MS if p else None for p in pairs]


def _with_duration(op: Op, duration: float | None) -> Op:
    fields = {k: getattr(op, k) for k in op.__dataclass_fields__}
    return Op(**{**fields, "duration_s": duration})


def _owners(step_fn, model, optimizer):
    """Model and optimizer, taken from a bound Workload method when not given."""
    owner = getattr(step_fn, "__self__", None)
    model = model if model is not None else getattr(owner, "model", None)
    optimizer = optimizer if optimizer is not None else getattr(owner, "optimizer", None)
    return model if isinstance(model, torch.nn.Module) else None, optimizer


def _tensors_of(inputs: tuple, model) -> list[torch.Tensor]:
    tensors = [t for t in torch.utils._pytree.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    if model is not None:
        tensors += list(model.parameters()) + list(model.buffers())
    return tensors


def _fake_mode_for(fake: bool, inputs: tuple, model):
    """The FakeTensorMode to run under (None for real tensors), checked against `fake`."""
    tensors = _tensors_of(inputs, model)
    try:
        mode = detect_fake_mode(tensors)
    except AssertionError:  # torch's check that all fake tensors share one mode
        raise MemplanError("the model and inputs are fake tensors of different FakeTensorModes: build them "
                           "all under one (trace_workload does)") from None
    if fake and mode is None and tensors:
        raise MemplanError("fake=True, but the model and inputs are real tensors: build them under a "
                           "FakeTensorMode (trace_workload does), or pass fake=False")
    if not fake and mode is not None:
        raise MemplanError("fake=False, but the model and inputs are fake tensors: pass fake=True")
    if fake and mode is None:
        mode = new_fake_mode()
    return mode


def _on_cuda(inputs: tuple, model) -> bool:
    return any(t.is_cuda for t in _tensors_of(inputs, model))


def _device_of(inputs: tuple, model) -> str:
    tensors = _tensors_of(inputs, model)
    return str(tensors[0].device) if tensors else "cpu"


def _register_preexisting(table: StorageTable, model, optimizer, inputs: tuple) -> None:
    """Params, buffers, optimizer state and inputs exist before op 0 (even if never touched)."""
    names = _param_names(model)
    if model is not None:
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if table.lookup(t) is None:
                table.add(t, 0, None, pinned=True, hint="param", name=name)
    for name, t in _optimizer_state(optimizer, names):
        if table.lookup(t) is None:
            table.add(t, 0, None, pinned=True, hint="optimizer_state", name=name)
    for i, t in enumerate(torch.utils._pytree.tree_leaves(inputs)):
        if isinstance(t, torch.Tensor) and table.lookup(t) is None:
            table.add(t, 0, None, pinned=True, hint="input", name=f"input{i}")


def _hint_after_step(table: StorageTable, model, optimizer) -> None:
    """Name gradients and (lazily created) optimizer state found after the step."""
    names = _param_names(model)
    params = list(model.parameters()) if model is not None else []
    for p in params + [p for g in getattr(optimizer, "param_groups", ()) for p in g["params"]]:
        entry = table.lookup(p.grad) if p.grad is not None else None
        if entry is not None and entry.hint is None:
            entry.hint, entry.name = "grad", f"{names.get(id(p), 'param')}.grad"
    for name, t in _optimizer_state(optimizer, names):
        entry = table.lookup(t)
        if entry is not None and entry.hint is None:
            entry.hint, entry.name = "optimizer_state", name


def _param_names(model) -> dict[int, str]:
    return {id(p): n for n, p in model.named_parameters()} if model is not None else {}


def _optimizer_state(optimizer, names: dict[int, str]):
    """(name, tensor) for every tensor in the optimizer's state."""
    if optimizer is None:
        return
    for i, (param, state) in enumerate(optimizer.state.items()):
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                yield f"{names.get(id(param), f'param{i}')}.{key}", value
