"""The step runner: a dispatch mode that runs the step program at every op of a step.

It counts the step's ops as the tracer numbered them (`counts_as_op`) and matches each one
against the trace by name, in order; before and after op i it runs the program's actions for
that point (memplan.model.program): swap-outs, releases, prefetches, waits, drops and
recomputations. A swap-out whose decision lets its copy run beside its op (`overlap`: the
op only reads it) starts the copy before the op and releases after it. A storage is found
at the op the program acts after (it is among that
op's tensors: `storage_roles` pairs them with the trace's storage ids), or, for gaps that
start before any op of the step (wrap-around swaps), through its owner (a parameter, a
buffer, a gradient or optimizer state, `Trace.owners`).

NOTE how the run stays in sync with a trace made elsewhere (a fake trace, another device):
 1. Ops that move no data and come and go between runs (`OPTIONAL_OPS`: lift_fresh, detach,
    `.item()`) pass without being matched.
 2. An op the trace has a little later (within RESYNC_WINDOW) means the run skipped the trace's
    ops before it: their actions run without their tensors (a swap-out or drop there finds no
    storage and keeps it resident, counted `unresolved`), and the count goes on from there.
 3. Any other op is one the trace does not have: it runs unplanned (`inserted_ops`); more than
    INSERTED_LIMIT of them in a row leave the program for the step.
 4. A storage is dropped for recomputation only when every op its replay needs was recorded in
    this step, so a skipped op never leaves a storage that cannot be rebuilt.

NOTE why storages are resized, not tensors re-pointed: every holder of a storage sees the
change at once and sees the data again after the refill, because the StorageImpl is the
same object -- the module's Parameter, the optimizer's references, tied weights, tensors
autograd saved for backward and their views. Copies go through separate byte views whose
version counters are their own, so autograd's saved-tensor checks never see a swap. An op
touching a storage while it is away would read an empty buffer; that cannot happen while
the run follows the trace, and it is checked: before every op, any tensor argument whose
storage is not resident brings everything back and the rest of the step runs unplanned
(`diverged`). Between steps, an op touching a storage left on the host (a wrap-around gap)
brings it back. A convolution op the plan splits runs in micro-batches, as one op
(memplan.exec.microconv says why not a module).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..model import Trace
from ..model.blocks import allocated_size
from ..model.program import Action, StepProgram
from ..tracing.opinfo import OPTIONAL_OPS, counts_as_op, storage_roles
from . import microconv
from .engine import CopyEngine, blocked_s
from .owners import resolve_owner
from .replay import Replayer, adopt, byte_view
from .hostcopy import load, store, typed_bytes
from .slab import HostSlab

log = logging.getLogger(__name__)

RESIDENT, LEAVING, AWAY, COMING, DROPPED = "resident", "leaving", "away", "coming", "dropped"
RESYNC_WINDOW = 32  # trace ops looked ahead for an op the run makes out of turn (rule 2)
INSERTED_LIMIT = 64  # ops in a row the trace does not have before the step leaves the program (rule 3)


@dataclass(kw_only=True)
class ExecStats:
    """What the runner did, over all steps."""

    steps: int = 0  # steps begun
    swapped_out: int = 0  # swap-outs started
    swapped_out_bytes: int = 0  # their bytes
    copied_beside: int = 0  # of them, copies started before the op they follow (Decision.overlap)
    released: int = 0  # swap-outs whose device memory was freed
    release_wait_s: float = 0.0  # host time spent waiting for a swap-out copy at a release
    prefetched: int = 0  # prefetches issued at their point
    late_prefetches: int = 0  # prefetches issued only at the wait (their point was missed)
    kept: int = 0  # prefetches due before their swap-out was released: the bytes simply stayed
    prefetch_wait_s: float = 0.0  # time spent waiting for prefetches to land
    dropped: int = 0  # storages dropped for recomputation
    recomputed: int = 0  # storages rebuilt by replaying their ops
    start_sent: int = 0  # storages sent to host at a step start (first step, or after a restore)
    restored: int = 0  # storages brought back outside the program (restore, divergence, close)
    diverged_steps: int = 0  # steps that left the traced program (the rest ran unplanned)
    skipped_ops: int = 0  # trace ops the run did not make (their actions ran without their tensors)
    inserted_ops: int = 0  # ops the run made that the trace does not have (ran unplanned)
    unresolved: int = 0  # actions not done: storage not found or not as traced (kept resident)
    link_bytes: int = 0  # bytes over the host link, both directions (before compression)


@dataclass(eq=False, kw_only=True)
class _Entry:
    """One storage the program moves, and where it is now."""

    sid: int  # trace storage id
    nbytes: int  # its size in the trace (as the device's allocator counts it)
    real_nbytes: int = 0  # its size as a storage (set when it is first found)
    dtype: str | None  # its traced dtype (for compression)
    state: str = RESIDENT
    storage: torch.UntypedStorage | None = None  # held while not resident
    decision: int = -1  # the decision of its current gap (its host region)
    d2h: object = None  # ticket of the last swap-out
    h2d: object = None  # ticket of the last prefetch
    packed: dict | None = None  # where the host copy is and how it is laid out (hostcopy.store)


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
        self.model = model
        self.optimizer = optimizer
        self.names = [op.name for op in trace.ops]
        self._named: dict = {}  # OpOverload -> its name (str() of an overload formats it every time)
        self.at = program.actions_at()
        # vDNN's offload beside the op (Decision.overlap): swap-outs whose copy starts before op i
        self.early = {op: [a for a in acts if a.kind == "swap_out" and _beside(program.decisions[a.decision])]
                      for (op, after), acts in self.at.items() if after}
        self.splits = program.splits()  # convolution op -> micro-batch sizes per kernel
        self.replayer = Replayer(trace, program.captured_ops, adopt=self._adopt, call=self._call)
        # ops the program does nothing at: while nothing is away they run without the executor's work
        busy = {op for op, _ in self.at} | set(self.splits) | set(self.replayer.ops)
        self.plain = [i not in busy for i in range(len(self.names))]
        self.idle = not busy and not program.start_away  # nothing to do at any op: the mode need not be entered
        self.recomputed_at = {}  # op -> storages recomputed before it
        for a in program.actions:
            if a.kind == "recompute":
                self.recomputed_at.setdefault(a.op, set()).add(program.decisions[a.decision].storage)
        self.owners = {o.storage: o for o in trace.owners}
        self.rounded = trace.meta.get("device_memory", {}).get("rounded_to", 1) > 1  # memplan.cost.device_memory
        self.entries = {d.storage: _Entry(sid=d.storage, nbytes=trace.storages[d.storage].nbytes,
                                          dtype=trace.storages[d.storage].dtype) for d in program.decisions}
        self.away: dict[int, _Entry] = {}  # storage address -> entry, for every storage not resident
        self.stats = ExecStats()
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
            if entry.state != RESIDENT:
                self.stats.restored += 1
                self._bring_back(entry)

    # --- the mode -------------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.active and not self.off:
            i = self.pos
            if i < len(self.names) and (self._named.get(func) or self._name(func)) == self.names[i]:
                if self.plain[i] and not self.away:  # the fast path: nothing to do, nothing to guard
                    self.op_clock.value = i
                    self.pos = i + 1
                    self._inserted_in_a_row = 0
                    return func(*args, **kwargs)
                return self._run(i, func, args, kwargs)
            return self._out_of_turn(func, args, kwargs)
        self._guard(func, args, kwargs)
        return func(*args, **kwargs)



    def _out_of_turn(self, func, args, kwargs):
        """An op that is not the trace's next one (NOTE rules 1-3)."""
        name = self._name(func)
        ahead = None if name in OPTIONAL_OPS else self._ahead(name, func, args, kwargs)
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

    def _ahead(self, name: str, func, args, kwargs) -> int | None:
        """The next trace op within the window with this name that reads storages of the sizes
        this call reads (None: there is none, the call is one the trace does not have)."""
        end = min(self.pos + 1 + RESYNC_WINDOW, len(self.names))
        candidates = [j for j in range(self.pos + 1, end) if self.names[j] == name]
        if not candidates:
            return None
        sizes = [self._counted(t.untyped_storage().nbytes()) for t in storage_roles(func, args, kwargs, None)[0]]
        storages = self.trace.storages
        return next((j for j in candidates if [storages[s].nbytes for s in self.trace.ops[j].reads] == sizes), None)

    def _skip_to(self, j: int) -> None:
        """The run did not make trace ops pos..j-1: run their actions without their tensors."""
        for k in range(self.pos, j):
            if self.names[k] not in OPTIONAL_OPS:
                self.stats.skipped_ops += 1
            for after in (False, True):
                for action in self.at.get((k, after), ()):
                    self._act(action, None)
        self.pos = j

    def _name(self, func) -> str:
        name = self._named.get(func)
        if name is None:
            name = self._named[func] = str(func)
        return name

    def _run(self, i: int, func, args, kwargs):
        self.op_clock.value = i
        for action in self.at.get((i, False), ()):
            self._act(action, None)
        self.replayer.drop_temporaries()
        self._guard(func, args, kwargs)
        if self.off:  # the op touched a storage the program has away: it left the program
            return func(*args, **kwargs)
        captured = i in self.replayer.ops
        rng = self.replayer.rng_before(func, args) if captured else None
        if self.early.get(i):
            self._copy_beside(i, func, args, kwargs)
        out = self._call(i, func, args, kwargs)
        self.pos = i + 1
        self._inserted_in_a_row = 0
        if captured:
            self.replayer.record(i, func, args, kwargs, out, rng)
        after = self.at.get((i, True))
        if after:
            self.op_clock.value = i + 1  # what an action after op i allocates is planned at op i + 1
            found = self._locate(i, func, args, kwargs, out)
            for action in after:
                self._act(action, found)
        return out

    def _call(self, i: int, func, args, kwargs):
        """Run op i: a convolution the plan splits runs in micro-batches (memplan.exec.microconv)."""
        split = self.splits.get(i)
        return func(*args, **kwargs) if split is None else microconv.run(func, args, kwargs, split)

    def _guard(self, func, args, kwargs) -> None:
        if not self.away:
            return
        touched = [self.away[k] for k in {t.untyped_storage()._cdata for t in _tensors(args, kwargs)}
                   if k in self.away]
        if not touched:
            return
        if self.active and not self.off:
            self.diverge(f"{func} at op {self.pos} touches storage {touched[0].sid} while it is {touched[0].state}")
            return
        for entry in touched:
            self.stats.restored += 1
            self._bring_back(entry)

    def _locate(self, i: int, func, args, kwargs, out) -> dict[int, torch.Tensor]:
        op = self.trace.ops[i]
        reads, writes = storage_roles(func, args, kwargs, out)
        return dict(list(zip(op.reads, reads)) + list(zip(op.writes, writes)))

    # --- actions ----------------------------------------------------------------------------

    def _act(self, action: Action, found) -> None:
        d = self.program.decisions[action.decision]
        entry = self.entries[d.storage]
        getattr(self, f"_{action.kind}")(entry, action.decision, found)

    def _swap_out(self, entry: _Entry, k: int, found) -> None:
        if entry.state == LEAVING and entry.decision == k:  # its copy started beside the op
            if self.program.decisions[k].sync:
                self._release(entry, k)
            return
        storage = self._found(entry, found)
        if storage is None or entry.state != RESIDENT:
            return
        self._copy_out(entry, storage, k)

    def _copy_beside(self, i: int, func, args, kwargs) -> None:
        """Start the copies of storages op i only reads before it runs (the swap-out after it
        then only releases): on a GPU they run beside the op, as vDNN overlaps a layer's offload
        with its computation (the simulator's `overlap`)."""
        reads = dict(zip(self.trace.ops[i].reads, storage_roles(func, args, kwargs, None)[0]))
        for action in self.early[i]:
            entry = self.entries[self.program.decisions[action.decision].storage]
            storage = self._found(entry, reads) if entry.sid in reads else None
            if storage is not None and entry.state == RESIDENT:
                self._copy_out(entry, storage, action.decision, release=False)
                self.stats.copied_beside += 1

    def _release(self, entry: _Entry, k: int, found=None) -> None:
        if entry.state != LEAVING:
            return
        self.stats.release_wait_s += blocked_s(self.engine, entry.d2h, self.engine.sync)
        entry.storage.resize_(0)
        entry.state = AWAY
        self.stats.released += 1

    def _prefetch(self, entry: _Entry, k: int, found=None) -> None:
        if entry.state == LEAVING:  # fetched before its swap-out was released: it never left
            self.engine.cancel(entry.d2h)
            self._resident(entry)
            self.stats.kept += 1
        if entry.state != AWAY:
            return
        self._copy_in(entry)
        self.stats.prefetched += 1

    def _wait(self, entry: _Entry, k: int, found=None) -> None:
        if entry.state == AWAY:
            self.stats.late_prefetches += 1
            self._copy_in(entry)
        if entry.state == COMING:
            self.stats.prefetch_wait_s += blocked_s(self.engine, entry.h2d, self.engine.wait)
            self._resident(entry)

    def _drop(self, entry: _Entry, k: int, found) -> None:
        storage = self._found(entry, found)
        if storage is None or entry.state != RESIDENT:
            return
        if not self.replayer.can_rebuild(self.program.replays[k]):  # NOTE rule 4
            self.stats.unresolved += 1
            return
        self._leave(entry, storage, k, DROPPED)
        storage.resize_(0)
        self.stats.dropped += 1

    def _recompute(self, entry: _Entry, k: int, found=None) -> None:
        if entry.state != DROPPED:
            return  # already made by an earlier chain's replay (see _adopt)
        self.replayer.rebuild(self.program.replays[k], entry.storage)
        self.replayer.drop_temporaries(self.program.frees.get(k, ()))
        self._resident(entry)
        self.stats.recomputed += 1

    def _adopt(self, sid: int, fresh: torch.UntypedStorage) -> None:
        """A replay made storage `sid` too: if it is recomputed before this op, take it now."""
        entry = self.entries.get(sid)
        if entry is None or entry.state != DROPPED or sid not in self.recomputed_at.get(self.pos, ()):
            return
        adopt(entry.storage, fresh)
        self._resident(entry)
        self.stats.recomputed += 1

    # --- moving bytes ---------------------------------------------------------------------------

    def _copy_out(self, entry: _Entry, storage: torch.UntypedStorage, k: int, release: bool = True) -> None:
        """Start the swap-out of `storage` into decision k's host region (a `sync` decision's
        release follows at once unless `release` is false)."""
        d = self.program.decisions[k]
        region = self.slab.region(k)
        src = byte_view(storage)
        self._leave(entry, storage, k, LEAVING)
        typed = typed_bytes(src, entry.dtype) if d.compress_ratio is not None else None

        def job():
            entry.packed = store(src, typed, region)

        entry.d2h = self.engine.submit("d2h", job)
        self.stats.swapped_out += 1
        self.stats.swapped_out_bytes += entry.nbytes
        self.stats.link_bytes += entry.nbytes
        if d.sync and release:
            self._release(entry, k)

    def _copy_in(self, entry: _Entry) -> None:
        """Allocate the storage again and start copying its bytes back."""
        entry.storage.resize_(entry.real_nbytes)
        dst = byte_view(entry.storage)

        def job():
            load(dst, entry.packed)

        entry.h2d = self.engine.submit("h2d", job, after=entry.d2h)
        entry.state = COMING
        self.stats.link_bytes += entry.nbytes

    def _leave(self, entry: _Entry, storage: torch.UntypedStorage, k: int, state: str) -> None:
        """The storage stops being resident: from now on no op may touch it (see `_guard`)."""
        entry.storage, entry.decision, entry.state = storage, k, state
        self.away[storage._cdata] = entry

    def _resident(self, entry: _Entry) -> None:
        self.away.pop(entry.storage._cdata, None)
        entry.state, entry.storage = RESIDENT, None

    def _bring_back(self, entry: _Entry) -> None:
        if entry.state == LEAVING:
            self.engine.sync(entry.d2h)
            self._resident(entry)
        elif entry.state == DROPPED:
            self._recompute(entry, entry.decision)
            self.replayer.drop_temporaries()
        else:
            self._wait(entry, entry.decision)

    def _send_away(self, k: int) -> None:
        """A step starts with decision k's storage on the host: send it there now if it is not."""
        entry = self.entries[self.program.decisions[k].storage]
        if entry.state != RESIDENT:
            return
        storage = self._owned(entry)
        if storage is None:
            self.stats.unresolved += 1
            return
        with torch.utils._python_dispatch._disable_current_modes():  # not the step's ops (settle may run in one)
            self._copy_out(entry, storage, k)
            self._release(entry, k)
        self.stats.start_sent += 1

    # --- finding storages -----------------------------------------------------------------------

    def _found(self, entry: _Entry, found) -> torch.UntypedStorage | None:
        t = found.get(entry.sid) if found else None
        storage = t.untyped_storage() if isinstance(t, torch.Tensor) else None
        return self._usable(entry, storage)

    def _owned(self, entry: _Entry) -> torch.UntypedStorage | None:
        owner = self.owners.get(entry.sid)
        t = resolve_owner(owner, self.model, self.optimizer) if owner is not None else None
        return self._usable(entry, t.untyped_storage() if isinstance(t, torch.Tensor) else None)

    def _usable(self, entry: _Entry, storage) -> torch.UntypedStorage | None:
        if storage is None or self._counted(storage.nbytes()) != entry.nbytes or not storage.resizable():
            self.stats.unresolved += 1
            log.debug("storage %d not found as traced: kept resident", entry.sid)
            return None
        entry.real_nbytes = storage.nbytes()
        return storage

    def _counted(self, nbytes: int) -> int:
        """`nbytes` as the trace counts it (a device view counts allocator blocks)."""
        return allocated_size(nbytes) if self.rounded else nbytes


def _tensors(args: tuple, kwargs: dict):
    """The tensor arguments of an aten call (tensors, or lists of tensors, one level deep)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (t for t in value if isinstance(t, torch.Tensor))


def _beside(d) -> bool:
    """The decision's copy may start with its op: the op only reads it, and it is copied as it is."""
    return d.action == "swap" and d.overlap and d.compress_ratio is None
