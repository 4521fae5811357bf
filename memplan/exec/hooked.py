"""The hooked executor: a step program run at the hooks PyTorch calls during a step, not at every op.

A hooked program (memplan.sim.lowering) has every action at a site (memplan.model.hooksites): a
module call's start or end (forward pre-hook or forward hook; both on a module that opens a window
or holds a region's arguments), a parameter's gradient accumulated
(`register_post_accumulate_grad_hook`), the optimizer's step beginning or ending (its step pre-
and post-hooks), a saved tensor's pack or first unpack inside a window (a module call during which
the runner's `saved_tensors_hooks` are installed), or the step's start or end. The runner installs
the sites its program needs (`HookSites.installed`) and knows where the step is at each: the k-th
call of a module is its k-th `Call`, the n-th pack is `Trace.saved[n]` (a window counts packs from
its call's first), the k-th firing of a mark is its k-th `Mark`. At each it runs the actions due
by then (a cursor over the program, in order). The storage of a decision is found through its
owner (a parameter, gradient, buffer or optimizer state: memplan.exec.owners) or else taken from
its first pack. A recomputation runs again the module call that made the storage (its region,
`StepProgram.regions`; memplan.exec.rerun), from the arguments held at the call's forward
pre-hook; the storages it hands over move into the dropped ones by swapping data pointers (every
alias autograd holds sees them). No op goes through Python: the step's host work grows with the
hooks the program needs and its actions, not with its ops.

NOTE why this is safe (cited as "rule N" where relied on):
 1. A storage away is one the trace says no op touches until the program brings it back: one
    autograd saved and away only until backward, where only autograd (and Python frames past their
    last use of it) still holds it; or one its owner holds (a parameter, gradient, buffer or
    optimizer state), which no op reads until the point its prefetch and wait run at, and every
    point is exact (a hook at point p fires after op p-1 and before op p, in the run as traced).
 2. The run is the traced one while its packs are: a pack beyond the trace's count, of a storage
    of another size than traced, or a window that saved another number of tensors than its call
    did, leaves the program (`diverged`): everything comes back and the rest of the step runs
    unplanned.
 3. An unpack of a tensor whose storage is not resident brings it back first (a late prefetch
    or recomputation): autograd never reads a freed storage, even where a point was missed. Every
    pack of a storage the program moves is inside a window, so every unpack of it is seen.
 4. A storage is dropped only while its region's arguments are held, so its run can happen.
 5. Between steps a storage the program keeps away comes back when the model or the optimizer
    is used (memplan.exec.runtime's idle guards); a step brings it back at its program's points.
"""

from __future__ import annotations

import bisect
import weakref
from functools import partial
from time import perf_counter

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from ..model import Trace
from ..model.hooksites import WHOLE_STEP, HookSites, without_updates
from ..model.program import ActionKind, RegionRun, StepProgram
from ..tracing.stepwise import Stepwise, split_step
from .engine import CopyEngine
from .mover import Mover
from .rerun import Held, run_again
from .residency import MovedStorage, Residency
from .slab import HostSlab
from .storage_views import adopt

_TAKES_STORAGE = (ActionKind.SWAP_OUT, ActionKind.DROP)  # actions on a storage a pack hands over


class HookedRunner(Mover):
    """Runs a hooked `program` for `trace` at the hooks of a step (see the module docstring).

    Args:
        trace: the traced iteration (with its saved tensors, module calls and marks).
        program: its compiled step program, at the hooked level.
        engine: the copy lanes.
        slab: the host slab (one region per swap decision).
        model: the root module (hooked modules are found in it by path; owned storages through it).
        optimizer: the model's optimizer (its state is found through it).
        device: where the step runs (its RNG and autocast are held per region).
    """

    idle = False  # acts in every step (the runtime installs it)

    def __init__(self, trace: Trace, program: StepProgram, engine: CopyEngine, slab: HostSlab,
                 model: torch.nn.Module | None, optimizer=None, device: torch.device | str = "cpu"):
        super().__init__(trace, program, engine, slab, model, optimizer)
        self.device = torch.device(device)
        self.saved = trace.saved
        # each pack's storage size as the run must find it (a pack of a storage the trace does not know: any)
        self.expected = [trace.storages[s.storage].nbytes if s.storage is not None else None for s in trace.saved]
        sites = HookSites(without_updates(trace) if program.whole_step else trace)
        self.when = _points_of(program, sites.points)
        regions = {run.call for run in program.regions.values()}
        self.sites = sites.installed(self.when, {d.storage for d in program.decisions}, regions)
        self.modules = _hooked_modules(self.sites.modules, model)  # windows, regions: both hooks
        self.starts = _hooked_modules(self.sites.starts, model)  # only a call's start is a site
        self.ends = _hooked_modules(self.sites.ends, model)  # only a call's end is a site
        hooked = {**self.modules, **self.starts, **self.ends}
        self.calls = {(c.module, c.occurrence): k for k, c in enumerate(trace.calls) if c.module in hooked}
        self.marks = {(m.kind, m.key, m.occurrence): m.point for m in trace.marks if (m.kind, m.key) in self.sites.marks}
        self.last_run = {}  # call -> index of the program's last action that runs it (its hold ends there)
        for i, a in enumerate(program.actions):
            if a.kind == ActionKind.RECOMPUTE:
                self.last_run[program.regions[a.decision].call] = i
        buffers = frozenset(o.storage for o in trace.owners if o.kind == "buffer")
        self.restores = {c: any(w in buffers for i in range(trace.calls[c].first_op, trace.calls[c].end_op)
                                for w in trace.ops[i].writes) for c in self.last_run}
        self.op_clock = None  # no op clock: a pool needs the interpreted runner's
        # Per pack, per unpack and per action what its hook needs, looked up once here (the hooks run
        # hundreds of times a step: memplan.sim prices each call):
        # a pack's (storage size as traced or None, storage to take from it or None, point)
        self.pack_facts = [(size, s.storage if s.storage in self.entries and s.storage not in self.finder.owners
                            else None, s.packed_at) for size, s in zip(self.expected, trace.saved)]
        self.unpacked_at = [s.unpacked_at for s in trace.saved]
        # an action's storage, whether it waits for that storage's pack, the call whose hold it ends, its entry
        self.action_facts = []
        for i, a in enumerate(program.actions):
            sid = program.decisions[a.decision].storage
            ends = program.regions[a.decision].call if a.kind == ActionKind.RECOMPUTE else None
            self.action_facts.append((sid, a.kind in _TAKES_STORAGE and sid not in self.finder.owners,
                                      ends if ends is not None and self.last_run.get(ends) == i else None,
                                      self.entries[sid]))
        self.calls_of: dict[int, list] = {}  # id of a hooked module -> its calls by occurrence (None: untraced)
        for (path, occurrence), k in self.calls.items():
            calls = self.calls_of.setdefault(id(hooked[path]), [])
            calls.extend([None] * (occurrence + 1 - len(calls)))
            calls[occurrence] = k
        self.held: dict[int, Held] = {}
        self.found: dict[int, weakref.ref] = {}  # storage id -> its tensor, from its first pack this step
        self.seen: dict = {}  # id of a module or (kind, key) of a mark -> its calls so far this step
        self.open: list[tuple[int | None, bool]] = []  # per module call running: (its call, a window pushed)
        self.packs = 0
        self.cursor = 0
        self.rerunning = False
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._handles: list = []
        self.stepwise: Stepwise | None = None

    # --- installation and steps ---------------------------------------------------------------

    def __enter__(self):
        updates = self.sites.updates
        self.stepwise = split_step(self.finder.optimizer, self.finder.model, updates,
                                   lambda key: self._marked(("update", key))) if updates else None  # may refuse
        handles = []
        for module in self.modules.values():
            handles.append(module.register_forward_pre_hook(self._entered, with_kwargs=True))
            handles.append(module.register_forward_hook(self._left, always_call=True))
        for module in self.starts.values():
            handles.append(module.register_forward_pre_hook(self._started))
        for module in self.ends.values():
            handles.append(module.register_forward_hook(self._ended))
        for kind, key in self.sites.marks:
            if kind == "accumulated" and self.finder.model is not None:
                handles.append(self.finder.model.get_parameter(key).register_post_accumulate_grad_hook(
                    partial(self._marked, (kind, key))))
        if ("step", "") in self.sites.marks:
            handles.append(register_optimizer_step_pre_hook(lambda *_: self._marked(("step", ""))))
        if ("stepped", "") in self.sites.marks:
            handles.append(register_optimizer_step_post_hook(lambda *_: self._marked(("stepped", ""))))
        if self.stepwise is not None:
            handles.append(self.stepwise.install())
        self._handles = handles
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False

    def begin_step(self) -> None:
        """Start a step: counts and the program's cursor restart; storages take their place at a step
        start (nothing to do unless the model was used, and brought back, since the last step)."""
        self.end_step()
        self.stats.steps += 1
        self.settle()
        self.packs, self.cursor, self.off, self.active = 0, 0, False, True
        self.seen.clear()
        if WHOLE_STEP in self.sites.windows:  # a tensor saved outside every call is taken or guarded
            self._saving.__enter__()
            self.open.append((None, True))
        self._advance(0)

    def end_step(self, aborted: bool = False) -> None:
        """End the step: the program's last actions, then nothing is held any more (`aborted`: an
        exception cut the step short; what it dropped is forgotten, what it copied away comes back)."""
        if aborted and self.active:
            self.off = True
            self.abort()
            if self.stepwise is not None:  # an optimizer's step cut short leaves its groups narrowed
                self.stepwise.restore()
        elif self.active and not self.off:
            if WHOLE_STEP in self.sites.windows and self.packs != len(self.saved):
                self.diverge(f"the step saved {self.packs} tensors where the trace saved {len(self.saved)}")
            else:
                self._advance(len(self.trace.ops), force=True)
        while self.open:  # windows an exception left open, and the whole step's
            if self.open.pop()[1]:
                self._saving.__exit__(None, None, None)
        self.active = False
        self.held.clear()
        self.found.clear()

    # --- hooks ------------------------------------------------------------------------------------

    def _pack(self, t: torch.Tensor):
        n = self.packs
        self.packs = n + 1
        kept = t.detach()  # saved.detached, written out: no cycle through autograd (memplan.exec.saved)
        if not self.active or self.off:
            return n, kept
        stats = self.stats
        stats.hook_calls += 1
        started = perf_counter()
        if n < len(self.pack_facts):
            size, sid, point = self.pack_facts[n]
            if size is not None and self.finder.counted(t.untyped_storage().nbytes()) != size:
                self.diverge(f"pack {n} is not the traced one")
            else:
                if sid is not None and sid not in self.found:
                    self.found[sid] = weakref.ref(kept)  # alive while autograd holds it
                if self.cursor < len(self.when) and self.when[self.cursor] <= point:
                    self._advance(point)
        else:
            self.diverge(f"pack {n} is not the traced one")
        stats.host_s += perf_counter() - started
        return n, kept

    def _unpack(self, packed) -> torch.Tensor:
        n, t = packed
        if self.active and not self.off:
            stats = self.stats
            stats.hook_calls += 1
            started = perf_counter()
            point = self.unpacked_at[n] if n < len(self.unpacked_at) else None
            if point is not None and self.cursor < len(self.when) and self.when[self.cursor] <= point:
                self._advance(point)
            if self.away:  # rule 3
                entry = self.away.get(t.untyped_storage()._cdata)
                if entry is not None:
                    stats.late_unpacks += entry.state != Residency.COMING  # else only its wait comes early
                    self._bring_back(entry)
            stats.host_s += perf_counter() - started
        return t

    def _entered(self, module, args, kwargs):
        """A hooked module's forward begins: its window opens, a region's call is held, the step is at
        its call's first op."""
        if self.rerunning:
            return
        c = None
        if self.active and not self.off:
            self.stats.hook_calls += 1
            started = perf_counter()
            key = id(module)
            occurrence = self.seen.get(key, 0)
            self.seen[key] = occurrence + 1
            calls = self.calls_of.get(key, ())
            c = calls[occurrence] if occurrence < len(calls) else None
        self.open.append((c, c in self.sites.windows))
        if c is None:
            return
        if c in self.last_run:
            self.held[c] = Held.of(module, args, kwargs, self.device)
        if c in self.sites.windows:
            self._saving.__enter__()
            self.packs = self.trace.calls[c].first_saved
        self._advance(self.trace.calls[c].first_op)
        self.stats.host_s += perf_counter() - started

    def _left(self, module, args, output):
        """A hooked module's forward ended: its window closes (having saved what its call saved, rule 2),
        the step is past its call's last op."""
        if self.rerunning or not self.open:
            return
        c, pushed = self.open.pop()
        if pushed:
            self._saving.__exit__(None, None, None)
        if not self.active or self.off:
            return
        self.stats.hook_calls += 1
        if c is None:
            return
        started = perf_counter()
        call = self.trace.calls[c]
        if pushed and self.packs != call.end_saved:
            self.diverge(f"call {call.occurrence} of {call.module or 'the model'} saved {self.packs - call.first_saved} "
                         f"tensors where the trace's saved {call.end_saved - call.first_saved}")
        else:
            self._advance(call.end_op)
        self.stats.host_s += perf_counter() - started

    def _started(self, module, args) -> None:
        """A call of a module hooked only where calls start began: the step is at its first op."""
        if self.active and not self.off and not self.rerunning:
            self._at_edge(id(module), True)

    def _ended(self, module, args, output) -> None:
        """A call of a module hooked only where calls end ended: the step is past its last op."""
        if self.active and not self.off and not self.rerunning:
            self._at_edge(("end", id(module)), False)

    def _at_edge(self, key, start: bool) -> None:
        self.stats.hook_calls += 1
        started = perf_counter()
        occurrence = self.seen.get(key, 0)
        self.seen[key] = occurrence + 1
        calls = self.calls_of.get(key if start else key[1], ())
        c = calls[occurrence] if occurrence < len(calls) else None
        if c is not None:
            call = self.trace.calls[c]
            self._advance(call.first_op if start else call.end_op)
        self.stats.host_s += perf_counter() - started

    def _marked(self, key: tuple, *_) -> None:
        """A mark's hook fired (a gradient accumulated, the optimizer's step began, began updating a
        parameter, or ended)."""
        if not self.active or self.off or self.rerunning:
            return
        self.stats.hook_calls += 1
        occurrence = self.seen.get(key, 0)
        self.seen[key] = occurrence + 1
        point = self.marks.get((*key, occurrence))
        if point is not None:
            started = perf_counter()
            self._advance(point)
            self.stats.host_s += perf_counter() - started

    # --- the program ----------------------------------------------------------------------------

    def _advance(self, point: int, force: bool = False) -> None:
        """Run the program's actions due at or before `point`, in order. A swap-out or drop of a storage
        no owner holds waits for its storage's pack when that comes later at the same point (one op
        saves several tensors)."""
        actions, when, facts, found = self.program.actions, self.when, self.action_facts, self.found
        while self.cursor < len(actions) and when[self.cursor] <= point and not self.off:
            action = actions[self.cursor]
            sid, takes, ends_hold, entry = facts[self.cursor]
            ref = found.get(sid)
            if ref is None and takes and not force:
                return
            if action.kind == ActionKind.RECOMPUTE and entry.state != Residency.DROPPED:
                pass  # an earlier run of its region made it (what `_recompute` would find)
            elif action.kind == ActionKind.DROP:
                self._drop(entry, action.decision, {sid: ref()} if ref is not None else None)
            else:
                self._act(action, {sid: ref()} if ref is not None else None)
            if ends_hold is not None:
                self.held.pop(ends_hold, None)
            self.cursor += 1

    def _can_rebuild(self, k: int) -> bool:
        return self.program.regions[k].call in self.held  # rule 4

    def _recompute(self, entry: MovedStorage, k: int, found=None) -> None:
        if entry.state != Residency.DROPPED:
            return  # an earlier run of its region made it
        self._run_region(self.program.regions[k])
        if entry.state == Residency.DROPPED:
            raise RuntimeError(f"memplan: recomputing storage {entry.sid} did not make it (region of call "
                               f"{self.program.regions[k].call}): the run is not the traced one")

    def _run_region(self, run: RegionRun) -> None:
        """Run call `run.call` again from its held arguments until it saved every storage wanted."""
        held = self.held.get(run.call)
        if held is None:
            raise RuntimeError(f"memplan: no arguments held for module call {run.call}: cannot recompute")
        self.rerunning = True
        try:
            fresh = run_again(held, self.trace.calls[run.call].first_saved, dict(run.captures), self.restores[run.call])
        finally:
            self.rerunning = False
        for sid, storage in fresh.items():
            entry = self.entries[sid]
            if entry.state == Residency.DROPPED and storage.nbytes() == entry.real_nbytes:
                adopt(entry.storage, storage)
                self._resident(entry)
                self.stats.recomputed += 1
        self.stats.regions_recomputed += 1


def _hooked_modules(paths, model: torch.nn.Module | None) -> dict[str, torch.nn.Module]:
    """The modules the runner hooks (windows, regions, module sites), by path."""
    if paths and model is None:
        raise ValueError("a hooked program that acts at module calls needs the model (its calls are sites)")
    return {p: model.get_submodule(p) for p in sorted(paths)}


def _points_of(program: StepProgram, points: list[int]) -> list[int]:
    """The point each action runs at: an action after op i at the first site's at or after i + 1, one
    before op i at the last at or before i; never before the action ahead of it."""
    out, last = [], 0
    for a in program.actions:
        if a.after:
            point = points[bisect.bisect_left(points, a.op + 1)]
        else:
            point = points[bisect.bisect_right(points, a.op) - 1]
        last = max(last, point)
        out.append(last)
    return out
