"""The hooked executor: a step program run at autograd's saved-tensor hooks, not at every op.

A hooked program (memplan.sim.lowering) moves only tensors autograd saves, and each of its
actions sits at a hook point: a pack or an unpack of a saved tensor, or the step's start or end
(memplan.model.hookpoints). So the runner installs `saved_tensors_hooks` for the step and counts
packs: the n-th pack of a step is `Trace.saved[n]`, whose point says where the step is, and at
each pack and unpack it runs the actions due by then (a cursor over the program, in order). The
storage of a decision is the one its first pack hands over. A recomputation runs again the
module call that made the storage (its region, `StepProgram.regions`): the call's arguments, RNG
state and autocast state are held from its forward (a forward pre-hook on that module, as
torch.utils.checkpoint holds a region's inputs), and the run, under saved-tensor hooks of its own,
hands over the storages wanted by their pack index and stops once it has them all; their bytes
move into the dropped storages by swapping data pointers (every alias autograd holds sees them),
and module buffers the run updated (batch norm's running statistics) are put back. No op goes
through Python: the step's host work grows with its saved tensors and actions, not its ops.

NOTE why this is safe (cited as "rule N" where relied on):
 1. A storage away is one the trace says no op touches until the program brings it back; only
    autograd, and Python frames past their last use of it, still hold it.
 2. The run is the traced one while its packs are: a pack beyond the trace's count, or of a
    storage of another size than traced, leaves the program (`diverged`): everything comes back
    and the rest of the step runs unplanned.
 3. An unpack of a tensor whose storage is not resident brings it back first (a late prefetch
    or recomputation): autograd never reads a freed storage, even where a point was missed.
 4. A storage is dropped only while its region's arguments are held, so its run can happen.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass

import torch

from ..model import Trace
from ..model.hookpoints import hook_points
from ..model.program import ActionKind, RegionRun, StepProgram
from .engine import CopyEngine
from .mover import Mover
from .op_replay import adopt
from .residency import MovedStorage, Residency
from .slab import HostSlab

log = logging.getLogger(__name__)

_TAKES_STORAGE = (ActionKind.SWAP_OUT, ActionKind.DROP)  # actions on the storage a pack hands over


@dataclass(frozen=True)
class _Held:
    """What a region's run needs from its forward call."""

    module: torch.nn.Module
    args: tuple
    kwargs: dict
    rng: tuple  # (CPU generator state, (device, CUDA generator state) or None)
    autocast: tuple  # (device type, enabled, dtype)


class _RegionDone(Exception):
    """Raised from a run's pack hook once it has every storage wanted (the rest need not run)."""


class HookedRunner(Mover):
    """Runs a hooked `program` for `trace` at saved-tensor hooks (see the module docstring).

    Args:
        trace: the traced iteration (with its saved tensors and module calls).
        program: its compiled step program, at the hooked level.
        engine: the copy lanes.
        slab: the host slab (one region per swap decision).
        model: the root module (regions are found in it by path).
        optimizer: unused by hooked programs (kept for the executors' common signature).
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
        self.when = _points_of(program, hook_points(trace.saved, len(trace.ops)))
        self.modules = _region_modules(trace, program, model)
        self.last_run = {}  # call -> index of the program's last action that runs it (its hold ends there)
        for i, a in enumerate(program.actions):
            if a.kind == ActionKind.RECOMPUTE:
                self.last_run[program.regions[a.decision].call] = i
        self.wanted = {(trace.calls[c].module, trace.calls[c].occurrence): c for c in self.last_run}
        buffers = frozenset(o.storage for o in trace.owners if o.kind == "buffer")
        self.restores = {c: any(w in buffers for i in range(trace.calls[c].first_op, trace.calls[c].end_op)
                                for w in trace.ops[i].writes) for c in self.last_run}
        self.op_clock = None  # no op clock: a pool needs the interpreted runner's
        self.held: dict[int, _Held] = {}
        self.found: dict[int, weakref.ref] = {}  # storage id -> its tensor, from its first pack this step
        self.calls_seen: dict[str, int] = {}
        self.packs = 0
        self.cursor = 0
        self.active = False
        self.off = False
        self.rerunning = False
        self._handles: list = []
        self._hooks = None

    # --- installation and steps ---------------------------------------------------------------

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        self._handles = [m.register_forward_pre_hook(self._entered, with_kwargs=True) for m in self.modules.values()]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._hooks.__exit__(*exc)
        return False

    def begin_step(self) -> None:
        """Start a step: the pack count and the program's cursor restart."""
        self.end_step()
        self.stats.steps += 1
        self.packs, self.cursor, self.off, self.active = 0, 0, False, True
        self.calls_seen.clear()
        self._advance(0)

    def end_step(self, aborted: bool = False) -> None:
        """End the step: the program's last actions, then nothing is held any more (`aborted`: an
        exception cut the step short; what it dropped is forgotten, what it copied away comes back)."""
        if aborted and self.active:
            self.off = True
            self.abort()
        elif self.active and not self.off:
            if self.packs != len(self.saved):
                self.diverge(f"the step saved {self.packs} tensors where the trace saved {len(self.saved)}")
            else:
                self._advance(len(self.trace.ops), force=True)
        self.active = False
        self.held.clear()
        self.found.clear()

    def diverge(self, reason: str) -> None:
        """Leave the program for the rest of the step: bring every storage back (rule 2)."""
        if not self.off:
            self.stats.diverged_steps += 1
            log.warning("step left the planned trace (%s): the rest of it runs unplanned", reason)
        self.off = True
        self.restore()

    # --- hooks ------------------------------------------------------------------------------------

    def _pack(self, t: torch.Tensor):
        n = self.packs
        self.packs += 1
        # kept as a detached alias: a saved output held as itself would hold its own node, a cycle
        # through autograd that no collector frees when no backward releases the graph (an aborted step)
        kept = t.detach()
        if not self.active or self.off:
            return n, kept
        started = time.perf_counter()
        expected = self.expected[n] if n < len(self.expected) else -1
        if expected == -1 or (expected is not None and self.finder.counted(t.untyped_storage().nbytes()) != expected):
            self.diverge(f"pack {n} is not the traced one")
        else:
            sid = self.saved[n].storage
            if sid in self.entries and sid not in self.found:
                self.found[sid] = weakref.ref(kept)  # alive while autograd holds it
            self._advance(self.saved[n].packed_at)
        self.stats.host_s += time.perf_counter() - started
        return n, kept

    def _unpack(self, packed) -> torch.Tensor:
        n, t = packed
        if self.active and not self.off:
            started = time.perf_counter()
            point = self.saved[n].unpacked_at if n < len(self.saved) else None
            if point is not None:
                self._advance(point)
            if self.away:  # rule 3
                entry = self.away.get(t.untyped_storage()._cdata)
                if entry is not None:
                    self.stats.late_unpacks += 1
                    self._bring_back(entry)
            self.stats.host_s += time.perf_counter() - started
        return t

    def _entered(self, module, args, kwargs):
        """A region module's forward begins: hold what a run of this call needs."""
        if not self.active or self.off or self.rerunning:
            return
        path = self.modules.path(module)
        occurrence = self.calls_seen.get(path, 0)
        self.calls_seen[path] = occurrence + 1
        c = self.wanted.get((path, occurrence))
        if c is not None:
            self.held[c] = _Held(module=module, args=args, kwargs=kwargs, rng=self._rng_state(),
                                 autocast=_autocast_state(self.device.type))

    # --- the program ----------------------------------------------------------------------------

    def _advance(self, point: int, force: bool = False) -> None:
        """Run the program's actions due at or before `point`, in order. A swap-out or drop waits for
        its storage's pack when that comes later at the same point (one op saves several tensors)."""
        actions, when = self.program.actions, self.when
        while self.cursor < len(actions) and when[self.cursor] <= point and not self.off:
            action = actions[self.cursor]
            sid = self.program.decisions[action.decision].storage
            ref = self.found.get(sid)
            if ref is None and action.kind in _TAKES_STORAGE and not force:
                return
            self._act(action, {sid: ref()} if ref is not None else None)
            if action.kind == ActionKind.RECOMPUTE and self.last_run.get(self.program.regions[action.decision].call) \
                    == self.cursor:
                self.held.pop(self.program.regions[action.decision].call, None)
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
        wanted = dict(run.captures)
        fresh: dict[int, torch.UntypedStorage] = {}
        index = [self.trace.calls[run.call].first_saved]

        def pack(t):
            sid = wanted.get(index[0])
            index[0] += 1
            if sid is not None:
                fresh[sid] = t.untyped_storage()
                if len(fresh) == len(wanted):
                    raise _RegionDone
            # held by the run's graph until the run ends, as the simulator counts it; detached, as
            # torch.utils.checkpoint's recompute does: a saved output would hold its own node (a
            # cycle only the garbage collector frees, for a graph no backward releases)
            return t.detach()

        buffers = [(b, b.detach().clone()) for b in held.module.buffers()] if self.restores[run.call] else []
        # arguments cut from the step's graph (as torch.utils.checkpoint's are): a run stopped midway may
        # leave a node behind, which must not hold the step's graph alive
        args, kwargs = _cut((held.args, held.kwargs))
        self.rerunning = True
        try:
            with _rng_restored(held.rng), torch.enable_grad(), _autocast(held.autocast), \
                    torch.autograd.graph.saved_tensors_hooks(pack, _never_unpacked):
                held.module(*args, **kwargs)
        except _RegionDone:
            pass
        finally:
            self.rerunning = False
            with torch.no_grad():
                for b, value in buffers:
                    b.copy_(value)
        for sid, storage in fresh.items():
            entry = self.entries[sid]
            if entry.state == Residency.DROPPED and storage.nbytes() == entry.real_nbytes:
                adopt(entry.storage, storage)
                self._resident(entry)
                self.stats.recomputed += 1
        self.stats.regions_recomputed += 1

    def _rng_state(self) -> tuple:
        cuda = (self.device, torch.cuda.get_rng_state(self.device)) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda


class _Modules(dict):
    """Region modules by path, and each module's path back."""

    def __init__(self, by_path: dict[str, torch.nn.Module]):
        super().__init__(by_path)
        self._paths = {id(m): p for p, m in by_path.items()}

    def path(self, module: torch.nn.Module) -> str:
        return self._paths[id(module)]


def _region_modules(trace: Trace, program: StepProgram, model: torch.nn.Module | None) -> _Modules:
    """The modules whose calls the program runs again, by path."""
    paths = {trace.calls[run.call].module for run in program.regions.values()}
    if paths and model is None:
        raise ValueError("a hooked program that recomputes needs the model (its regions are module calls)")
    return _Modules({p: model.get_submodule(p) for p in sorted(paths)})


def _points_of(program: StepProgram, points: list[int]) -> list[int]:
    """The hook point each action runs at: an action after op i at the first at or after i + 1, one
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


@contextlib.contextmanager
def _rng_restored(rng: tuple):
    """Run under the generator states `rng` (a region's, from its forward); the current ones after."""
    cpu, cuda = rng
    with torch.random.fork_rng(devices=[cuda[0]] if cuda else []):
        torch.set_rng_state(cpu)
        if cuda:
            torch.cuda.set_rng_state(cuda[1], cuda[0])
        yield


def _autocast_state(device_type: str) -> tuple:
    return device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)


def _autocast(state: tuple):
    device_type, enabled, dtype = state
    return torch.autocast(device_type, dtype=dtype, enabled=enabled)


def _cut(value):
    """`value` with every tensor in its tuples, lists and dicts cut from its history, requiring
    grad as it did (so autograd saves what it saved). Written out: pytree's map costs about 50 us
    a call here, more than the module call it prepares."""
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    if type(value) in (tuple, list):
        return type(value)(_cut(v) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_cut(v) for v in value))
    if type(value) is dict:
        return {k: _cut(v) for k, v in value.items()}
    return value


def _never_unpacked(_):
    raise RuntimeError("memplan: a region's run is never differentiated")
