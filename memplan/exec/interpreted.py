"""The interpreted executor: a dispatch mode that runs the step program at every op of a step.

It counts the step's ops as the tracer numbered them (`counts_as_op`) and matches each one
against the trace by name, in order; before and after op i it runs the program's actions for
that point (memplan.model.program): swap-outs, releases, prefetches, waits, drops and
recomputations. A swap-out whose decision lets its copy run beside its op (`overlap`: the
op only reads it) starts the copy before the op and releases after it. A storage is found
among the tensors of the op the program acts after, or through its owner for a wrap-around
gap (memplan.exec.locate). A run made elsewhere than its trace stays in sync by the rules of
memplan.exec.resync.

NOTE why storages are resized, not tensors re-pointed: every holder of a storage (the
Parameter, the optimizer, tied weights, tensors autograd saved and their views) sees the
change and the refill, because the StorageImpl is the same object. Copies go through byte
views with version counters of their own, so autograd's saved-tensor checks never see a swap.
An op touching a storage while it is away would read an empty buffer: before every op, a
tensor argument whose storage is not resident brings everything back and the rest of the
step runs unplanned (`diverged`); between steps, it brings back that storage (a wrap-around
gap). The executor's own copies pass the mode unseen (memplan.exec.mover, `moving`): a storage
coming back is not an op touching it while away, even where the mode is still entered (a
step's end or abort). A convolution op the plan splits runs in micro-batches, as one op (memplan.exec.microconv).
"""

from __future__ import annotations

from time import perf_counter
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..model import Trace
from ..model.program import StepProgram
from ..tracing.opinfo import OPTIONAL_OPS, counts_as_op, storage_roles
from . import microconv
from .engine import CopyEngine
from .locate import touched_entries
from .mover import Mover
from .op_replay import Replayer
from .points import ProgramPoints
from .residency import MovedStorage, Residency
from .resync import INSERTED_LIMIT, RESYNC_WINDOW, op_ahead
from .saved import detached_unseen, same
from .slab import HostSlab
from .storage_views import adopt


class InterpretedRunner(Mover, TorchDispatchMode):
    """Runs `program` for `trace` at every op of a step (arguments: as a Mover's)."""

    def __init__(self, trace: Trace, program: StepProgram, engine: CopyEngine, slab: HostSlab,
                 model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None):
        Mover.__init__(self, trace, program, engine, slab, model, optimizer)
        TorchDispatchMode.__init__(self)
        self.names = [op.name for op in trace.ops]
        self._named: dict = {}  # OpOverload -> its name (str() of an overload formats it every time)
        self.points = ProgramPoints(program)
        self.replayer = Replayer(trace, program.captured_ops, self.stats, adopt=self._adopt, call=self._call)
        # ops the program does nothing at: while nothing is away they run without the executor's work
        busy = self.points.busy_ops() | set(self.replayer.ops)
        self.plain = [i not in busy for i in range(len(self.names))]
        self.idle = not busy and not program.start_away  # nothing to do at any op: the mode need not be entered
        self.pos = 0
        self._inserted_in_a_row = 0
        # Where the trace index of the op being run is published (its `value`): the pool
        # allocator (memplan.exec.pooled) matches allocation requests to planned slots by it.
        self.op_clock = SimpleNamespace(value=-1)

    def __enter__(self):
        # The trace was recorded under saved-tensor hooks (memplan.tracing.tracer), which change
        # which detaches autograd makes: hooks that hand back the same storage make the same op sequence.
        self._hooks = torch.autograd.graph.saved_tensors_hooks(detached_unseen, same)
        self._hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._hooks.__exit__(*exc)

    # --- steps ----------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Start a step: the op count restarts and storages take their place at a step start."""
        self.end_step()
        self.replayer.begin_step()
        self.stats.steps += 1
        self.settle()  # nothing to do unless the model was used (and brought back) since the last step
        self.pos, self.off, self.active = 0, False, True
        self._inserted_in_a_row = 0

    def end_step(self, aborted: bool = False) -> None:
        """End the step (a step cut short brings everything back; `aborted`: by an exception)."""
        if aborted and self.active:
            self.off = True
            self.abort()
            self.replayer.begin_step()  # the dead step's recorded calls hold its tensors
            self.replayer.drop_temporaries()
        elif self.active and not self.off and not self.idle and self.pos != len(self.names):
            if len(self.names) - self.pos <= RESYNC_WINDOW:
                self._skip_to(len(self.names))  # the run skipped the trace's last ops (rule 2)
            else:
                self.diverge(f"the step ended after {self.pos} of the trace's {len(self.names)} ops")
        self.active = False

    # --- the mode -------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.moving:  # the mover's own copy (memplan.exec.mover): not an op of the step
            return func(*args, **kwargs)
        self.stats.ops_in_mode += 1
        if self.active and not self.off:
            i = self.pos
            if i < len(self.names) and (self._named.get(func) or self._name(func)) == self.names[i]:
                if not self.plain[i]:
                    return self._run(i, func, args, kwargs)
                if self.away or self.replayer.temporaries:
                    return self._plain(i, func, args, kwargs)
                self.op_clock.value = i  # the fast path: nothing to do, nothing to guard
                self.pos = i + 1
                self._inserted_in_a_row = 0
                return func(*args, **kwargs)
            return self._out_of_turn(func, args, kwargs)
        self._guard(func, args, kwargs)
        return func(*args, **kwargs)

    def _out_of_turn(self, func, args, kwargs):
        """An op that is not the trace's next one (memplan.exec.resync, rules 1-3)."""
        name = self._name(func)
        ahead = None if name in OPTIONAL_OPS else op_ahead(
            self.trace, self.names, self.pos, name, lambda: storage_roles(func, args, kwargs, None)[0],
            self.finder.counted)
        if ahead is not None:
            self._skip_to(ahead)
            return self._run(ahead, func, args, kwargs)
        self._guard(func, args, kwargs)
        out = func(*args, **kwargs)
        if self.off or name in OPTIONAL_OPS or not counts_as_op(func, args, kwargs, out):
            return out
        self.stats.inserted_ops += 1
        self._inserted_in_a_row += 1
        if self._inserted_in_a_row > INSERTED_LIMIT or self.pos >= len(self.names):
            where = self.names[self.pos] if self.pos < len(self.names) else "end of step"
            self.diverge(f"op {self.pos} is {name}, the trace's {where}")
        return out

    def _skip_to(self, j: int) -> None:
        """The run did not make trace ops pos..j-1: run their actions without their tensors."""
        for k in range(self.pos, j):
            if self.names[k] not in OPTIONAL_OPS:
                self.stats.skipped_ops += 1
            for after in (False, True):
                for action in self.points.actions(k, after):
                    self._act(action, None)
        self.pos = j

    def _name(self, func) -> str:
        name = self._named.get(func)
        if name is None:
            name = self._named[func] = str(func)
        return name

    def _plain(self, i: int, func, args, kwargs):
        """Op i, at which the program does nothing: guarded while storages are away."""
        self.op_clock.value = i
        if self.away:
            self._guard(func, args, kwargs)
            if self.off:
                return func(*args, **kwargs)
        if self.replayer.temporaries:
            self.replayer.drop_temporaries()
        self.pos = i + 1
        self._inserted_in_a_row = 0
        return func(*args, **kwargs)

    def _run(self, i: int, func, args, kwargs):
        self.op_clock.value = i
        for action in self.points.actions(i, False):
            self._act(action, None)
        self.replayer.drop_temporaries()
        self._guard(func, args, kwargs)
        if self.off:  # the op touched a storage the program has away: it left the program
            return func(*args, **kwargs)
        captured = i in self.replayer.ops
        rng = self.replayer.rng_before(func, args) if captured else None
        if self.points.early.get(i):
            self._copy_beside(i, func, args, kwargs)
        out = self._call(i, func, args, kwargs)
        self.pos = i + 1
        self._inserted_in_a_row = 0
        if captured:
            started = perf_counter()
            self.replayer.record(i, func, args, kwargs, out, rng)
            self.stats.record_s += perf_counter() - started
        after = self.points.actions(i, True)
        if after:
            self.op_clock.value = i + 1  # what an action after op i allocates is planned at op i + 1
            found = self.finder.at_op(i, func, args, kwargs, out)
            for action in after:
                self._act(action, found)
        return out

    def _call(self, i: int, func, args, kwargs):
        """Run op i: a convolution the plan splits runs in micro-batches (memplan.exec.microconv)."""
        split = self.points.splits.get(i)
        return func(*args, **kwargs) if split is None else microconv.run(func, args, kwargs, split)

    def _guard(self, func, args, kwargs) -> None:
        if not self.away:
            return
        touched = touched_entries(self.away, args, kwargs)
        if not touched:
            return
        if self.active and not self.off:
            self.diverge(f"{func} at op {self.pos} touches storage {touched[0].sid} while it is {touched[0].state}")
            return
        for entry in touched:
            self.stats.restored += 1
            self._bring_back(entry)

    # --- actions ----------------------------------------------------------------------------

    def _copy_beside(self, i: int, func, args, kwargs) -> None:
        """Start the copies of storages op i only reads before it runs (the swap-out after it
        then only releases): on a GPU they run beside the op, as vDNN overlaps a layer's offload
        with its computation (the simulator's `overlap`)."""
        reads = dict(zip(self.trace.ops[i].reads, storage_roles(func, args, kwargs, None)[0]))
        for action in self.points.early[i]:
            entry = self.entries[self.program.decisions[action.decision].storage]
            storage = self.finder.found(entry, reads) if entry.sid in reads else None
            if storage is not None and entry.state == Residency.RESIDENT:
                self._copy_out(entry, storage, action.decision, release=False)
                self.stats.copied_beside += 1

    def _can_rebuild(self, k: int) -> bool:
        return self.replayer.can_rebuild(self.program.rebuilds[k].steps)  # NOTE rule 4

    def _after_rebuild(self) -> None:
        self.replayer.drop_temporaries()

    def _recompute(self, entry: MovedStorage, k: int, found=None) -> None:
        if entry.state != Residency.DROPPED:
            return  # already made by an earlier chain's replay (see _adopt)
        rebuild = self.program.rebuilds[k]
        self.replayer.rebuild(rebuild.steps, entry.storage)
        self.replayer.drop_temporaries(rebuild.frees)
        if entry.state == Residency.DROPPED:  # else the replay made it and `_adopt` took it
            self._resident(entry)
            self.stats.recomputed += 1

    def _adopt(self, sid: int, fresh: torch.UntypedStorage) -> None:
        """A replay made storage `sid` too: if it is recomputed before this op, take it now."""
        entry = self.entries.get(sid)
        recomputed_here = sid in self.points.recomputed_at.get(self.pos, ())
        if entry is None or entry.state != Residency.DROPPED or not recomputed_here:
            return
        adopt(entry.storage, fresh)
        self._resident(entry)
        self.stats.recomputed += 1
