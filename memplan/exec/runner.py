"""The step runner: a dispatch mode that runs the step program at every op of a step.

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
gap). A convolution op the plan splits runs in micro-batches, as one op (memplan.exec.microconv).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..model import Trace
from ..model.program import Action, ActionKind, StepProgram
from ..tracing.opinfo import OPTIONAL_OPS, counts_as_op, storage_roles
from . import microconv
from .engine import CopyEngine, blocked_s
from .hostcopy import load, store, typed_bytes
from .locate import StorageFinder, touched_entries
from .points import ProgramPoints
from .replay import Replayer, adopt, byte_view
from .residency import ExecStats, MovedStorage, Residency
from .resync import INSERTED_LIMIT, RESYNC_WINDOW, op_ahead
from .slab import HostSlab

log = logging.getLogger(__name__)

# The method that runs each kind of action, looked up at every action (a test may replace one).
_ACTION_METHODS = {ActionKind.SWAP_OUT: "_swap_out", ActionKind.RELEASE: "_release", ActionKind.PREFETCH: "_prefetch",
                   ActionKind.WAIT: "_wait", ActionKind.DROP: "_drop", ActionKind.RECOMPUTE: "_recompute"}


class StepRunner(TorchDispatchMode):
    """Runs `program` for `trace` at every op of a step.

    Args:
        trace: the traced iteration.
        program: its compiled step program.
        engine: the copy lanes.
        slab: the host slab (one region per swap decision).
        model, optimizer: where owned storages are found (wrap-around gaps).
    """

    def __init__(self, trace: Trace, program: StepProgram, engine: CopyEngine, slab: HostSlab,
                 model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None):
        super().__init__()
        self.trace = trace
        self.program = program
        self.engine = engine
        self.slab = slab
        self.names = [op.name for op in trace.ops]
        self._named: dict = {}  # OpOverload -> its name (str() of an overload formats it every time)
        self.points = ProgramPoints(program)
        self.replayer = Replayer(trace, program.captured_ops, adopt=self._adopt, call=self._call)
        # ops the program does nothing at: while nothing is away they run without the executor's work
        busy = self.points.busy_ops() | set(self.replayer.ops)
        self.plain = [i not in busy for i in range(len(self.names))]
        self.idle = not busy and not program.start_away  # nothing to do at any op: the mode need not be entered
        self.entries = {d.storage: MovedStorage(sid=d.storage, nbytes=trace.storages[d.storage].nbytes,
                                                dtype=trace.storages[d.storage].dtype) for d in program.decisions}
        self.away: dict[int, MovedStorage] = {}  # storage address -> entry, for every storage not resident
        self.stats = ExecStats()
        self.finder = StorageFinder(trace, self.stats, model, optimizer)
        self.pos = 0
        self.active = False
        self.off = False
        self._inserted_in_a_row = 0
        # Where the trace index of the op being run is published (its `value`): the pool
        # allocator (memplan.exec.pooled) matches allocation requests to planned slots by it.
        self.op_clock = SimpleNamespace(value=-1)

    # --- steps ----------------------------------------------------------------------------

    def settle(self) -> None:
        """Put storages where a step starts with them: on the host for gaps across the boundary."""
        for k in self.program.start_away:
            self._send_away(k)

    def begin_step(self) -> None:
        """Start a step: the op count restarts and storages take their place at a step start."""
        self.end_step()
        self.replayer.begin_step()
        self.stats.steps += 1
        self.settle()  # nothing to do unless the model was used (and brought back) since the last step
        self.pos, self.off, self.active = 0, False, True
        self._inserted_in_a_row = 0

    def end_step(self) -> None:
        """End the step (a step cut short brings everything back)."""
        if self.active and not self.off and not self.idle and self.pos != len(self.names):
            if len(self.names) - self.pos <= RESYNC_WINDOW:
                self._skip_to(len(self.names))  # the run skipped the trace's last ops (rule 2)
            else:
                self.diverge(f"the step ended after {self.pos} of the trace's {len(self.names)} ops")
        self.active = False

    def diverge(self, reason: str) -> None:
        """Leave the program for the rest of the step: bring every storage back."""
        if not self.off:
            self.stats.diverged_steps += 1
            log.warning("step left the planned trace (%s): the rest of it runs unplanned", reason)
        self.off = True
        self.restore()

    def restore(self) -> None:
        """Bring every storage the program moved back to the device."""
        for entry in list(self.entries.values()):
            if entry.state != Residency.RESIDENT:
                self.stats.restored += 1
                self._bring_back(entry)

    # --- the mode -------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
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
            self.replayer.record(i, func, args, kwargs, out, rng)
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

    def _act(self, action: Action, found) -> None:
        d = self.program.decisions[action.decision]
        entry = self.entries[d.storage]
        getattr(self, _ACTION_METHODS[action.kind])(entry, action.decision, found)

    def _swap_out(self, entry: MovedStorage, k: int, found) -> None:
        if entry.state == Residency.LEAVING and entry.decision == k:  # its copy started beside the op
            if self.program.decisions[k].sync:
                self._release(entry, k)
            return
        storage = self.finder.found(entry, found)
        if storage is None or entry.state != Residency.RESIDENT:
            return
        self._copy_out(entry, storage, k)

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

    def _release(self, entry: MovedStorage, k: int, found=None) -> None:
        if entry.state != Residency.LEAVING:
            return
        # the compute side waits for the copy, on the device on a GPU (memplan.exec.engine, rule 5)
        self.stats.release_wait_s += blocked_s(self.engine, entry.d2h, self.engine.wait)
        entry.storage.resize_(0)
        entry.state = Residency.AWAY
        self.stats.released += 1

    def _prefetch(self, entry: MovedStorage, k: int, found=None) -> None:
        if entry.state == Residency.LEAVING:  # fetched before its swap-out was released: it never left
            self.engine.cancel(entry.d2h)
            self._resident(entry)
            self.stats.kept += 1
        if entry.state != Residency.AWAY:
            return
        self._copy_in(entry)
        self.stats.prefetched += 1

    def _wait(self, entry: MovedStorage, k: int, found=None) -> None:
        if entry.state == Residency.AWAY:
            self.stats.late_prefetches += 1
            self._copy_in(entry)
        if entry.state == Residency.COMING:
            self.stats.prefetch_wait_s += blocked_s(self.engine, entry.h2d, self.engine.wait)
            self._resident(entry)

    def _drop(self, entry: MovedStorage, k: int, found) -> None:
        storage = self.finder.found(entry, found)
        if storage is None or entry.state != Residency.RESIDENT:
            return
        if not self.replayer.can_rebuild(self.program.rebuilds[k].steps):  # NOTE rule 4
            self.stats.unresolved += 1
            return
        self._leave(entry, storage, k, Residency.DROPPED)
        storage.resize_(0)
        self.stats.dropped += 1

    def _recompute(self, entry: MovedStorage, k: int, found=None) -> None:
        if entry.state != Residency.DROPPED:
            return  # already made by an earlier chain's replay (see _adopt)
        rebuild = self.program.rebuilds[k]
        self.replayer.rebuild(rebuild.steps, entry.storage)
        self.replayer.drop_temporaries(rebuild.frees)
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

    # --- moving bytes ---------------------------------------------------------------------------

    def _copy_out(self, entry: MovedStorage, storage: torch.UntypedStorage, k: int, release: bool = True) -> None:
        """Start the swap-out of `storage` into decision k's host region (a `sync` decision's
        release follows at once unless `release` is false)."""
        d = self.program.decisions[k]
        region = self.slab.region(k)
        src = byte_view(storage)
        self._leave(entry, storage, k, Residency.LEAVING)
        typed = typed_bytes(src, entry.dtype) if d.compress_ratio is not None else None

        def job():
            entry.host_copy = store(src, typed, region)

        entry.d2h = self.engine.submit("d2h", job)
        self.stats.swapped_out += 1
        self.stats.swapped_out_bytes += entry.nbytes
        self.stats.link_bytes += entry.nbytes
        if d.sync and release:
            self._release(entry, k)

    def _copy_in(self, entry: MovedStorage) -> None:
        """Allocate the storage again and start copying its bytes back."""
        entry.storage.resize_(entry.real_nbytes)
        dst = byte_view(entry.storage)

        def job():
            load(dst, entry.host_copy)

        entry.h2d = self.engine.submit("h2d", job, after=entry.d2h)
        entry.state = Residency.COMING
        self.stats.link_bytes += entry.nbytes

    def _leave(self, entry: MovedStorage, storage: torch.UntypedStorage, k: int, state: str) -> None:
        """The storage stops being resident: from now on no op may touch it (see `_guard`)."""
        entry.storage, entry.decision, entry.state = storage, k, state
        self.away[storage._cdata] = entry

    def _resident(self, entry: MovedStorage) -> None:
        self.away.pop(entry.storage._cdata, None)
        entry.state, entry.storage = Residency.RESIDENT, None

    def _bring_back(self, entry: MovedStorage) -> None:
        if entry.state == Residency.LEAVING:
            self.engine.sync(entry.d2h)
            self._resident(entry)
        elif entry.state == Residency.DROPPED:
            self._recompute(entry, entry.decision)
            self.replayer.drop_temporaries()
        else:
            self._wait(entry, entry.decision)

    def _send_away(self, k: int) -> None:
        """A step starts with decision k's storage on the host: send it there now if it is not."""
        entry = self.entries[self.program.decisions[k].storage]
        if entry.state != Residency.RESIDENT:
            return
        storage = self.finder.owned(entry)
        if storage is None:
            self.stats.unresolved += 1
            return
        with _disable_current_modes():  # not the step's ops (settle may run in one)
            self._copy_out(entry, storage, k)
            self._release(entry, k)
        self.stats.start_sent += 1
