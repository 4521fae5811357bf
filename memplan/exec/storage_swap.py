"""The storage swap executor: parameters, buffers, gradients and optimizer state (and the
later gaps of activations) go to host and come back at hook points, across the iteration
boundary where the plan says so.

At a gap's swap-out point the storage's bytes are copied on the d2h lane into the
storage's fixed region of a second host slab (allocated once, one region per swapped
storage), and the storage is then resized to zero bytes; at the prefetch point it is
resized back (allocated on the compute stream) and refilled on the h2d lane; at the wait
point the compute stream waits for that copy. Actions depend on the storage's state
(resident, away, coming back), so a point reached twice, or a prefetch for a storage the
first step never sent away, does nothing. Storages still away when the runtime closes,
or when `restore()` is called, come back synchronously.

NOTE why the storage is resized, not the tensor re-pointed (`p.data = host_copy`):
every holder of the storage sees the change at once and sees the data again after the
refill, because the StorageImpl is the same object -- the module's Parameter, the
optimizer's references, tied weights, views of a weight that autograd saved for backward
(`weight.t()` of a linear layer) and the optimizer state dict. Re-pointing one tensor
would leave every other alias holding the device memory (no saving) or, after an
in-place update, stale data. The copies go through separate byte views, whose version
counters are their own: autograd's saved-tensor version checks never see a swap. The
cost: an op reading the storage during its gap would read an empty storage, which some
kernels reject and others do not check at all (undefined behaviour, not a clean error).
That cannot happen when the run follows the trace, and that is checked: points must come in traced order,
optimizer-step ops must match the trace by name, every op of an optimizer step first
brings back any storage of its arguments that is away (`before_op`), and on any
divergence everything comes back and the step finishes unswapped. Between steps (a
wrap-around gap), the runtime brings everything back before the model or optimizer is
used outside a planned step (see runtime.py).

NOTE stream safety (rules of engine.py): the swap-out job reads the storage after the
compute stream's last write (rule 1); it is freed through `release` (rule 7), so the
caching allocator reuses the block only after the copy, and the CPU worker frees it only
after reading. The prefetch re-allocates only after `released` (CPU: the worker's free
is done), on the compute stream, and its copy is ordered after both the compute stream
(rules 1 and 3) and the swap-out (`after=`, rule 4); the compute stream waits for it at
the wait point (rule 5). The region is rewritten by the next swap-out only after the
compute stream waited for the prefetch that read it (rule 6).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .engine import CopyEngine
from .slab import HostSlab, Region
from .storage_schedule import Owner, StorageSchedule, StorageSwapSpec

log = logging.getLogger(__name__)

RESIDENT, AWAY, COMING = "resident", "away", "coming"  # states of a swapped storage


@dataclass(kw_only=True)
class StorageSwapStats:
    """Counters of the storage swap executor, over all steps."""

    swapped_out: int = 0  # storages sent to host
    swapped_out_bytes: int = 0  # their bytes
    prefetched: int = 0  # prefetches issued at their point
    late_prefetches: int = 0  # prefetches issued only at the wait point
    rescued: int = 0  # storages brought back by an optimizer op that touched them early
    unresolved: int = 0  # swap-outs not done: owner gone or storage not as traced
    diverged_steps: int = 0  # steps that left the traced order (everything came back)
    restored: int = 0  # storages brought back outside the plan (close, restore, divergence)
    dropped: int = 0  # activations still away when their step ended (their gaps never closed)


@dataclass(eq=False, kw_only=True)
class _Stored:
    """One swapped storage: its host region and where it is now."""

    sid: int  # trace storage id
    nbytes: int  # its size
    owner: Owner  # where the live storage is found
    region: Region  # fixed host region, reused by every gap
    state: str = RESIDENT
    storage: torch.UntypedStorage | None = None  # held while away or coming back
    d2h: object = None  # ticket of the last swap-out
    h2d: object = None  # ticket of the last prefetch


class StorageSwapExecutor:
    """Runs a StorageSchedule.

    Args:
        schedule: the storage-level swaps.
        engine: the copy engine.
        slab: the second host slab (one fixed region per swapped storage).
        model: the root module (parameters, buffers and gradients are found by name).
        optimizer: its optimizer (optimizer state is found by group, index and key).
    """

    def __init__(self, schedule: StorageSchedule, engine: CopyEngine, slab: HostSlab,
                 model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None):
        self.schedule = schedule
        self.engine = engine
        self.slab = slab
        self.model = model
        self.optimizer = optimizer
        self.stats = StorageSwapStats()
        self._stored: dict[int, _Stored] = {}
        self._actions: dict[tuple, list] = {}
        for spec in schedule.swaps:
            if spec.storage not in self._stored:
                self._stored[spec.storage] = _Stored(sid=spec.storage, nbytes=spec.nbytes, owner=spec.owner,
                                                     region=slab.take(spec.nbytes))
            entry = self._stored[spec.storage]
            for key, action in ((spec.out_at, self._out), (spec.fetch_at, self._fetch), (spec.wait_at, self._wait)):
                self._actions.setdefault(key, []).append((action, entry, spec))
        self._away: dict[int, _Stored] = {}  # StorageImpl address -> entry, while not resident
        self._watched = schedule.watched
        self._packed: dict[int, StorageWeakRef] = {}  # activation -> its storage, from this step's pack
        self._off = False

    @property
    def keys(self) -> frozenset:
        """Hook point keys with actions."""
        return frozenset(self._actions)

    @property
    def away(self) -> int:
        """Number of storages not resident now."""
        return len(self._away)

    # --- steps and points -------------------------------------------------------------------

    def begin_step(self) -> None:
        """A new iteration: act on its points again (after a diverged one), watch new packs."""
        self._off = False
        self._packed.clear()
        for entry in [e for e in self._away.values() if e.owner.kind == "activation"]:
            self.stats.dropped += 1  # its step is over: refilling it would only revive dead memory
            self.engine.released(entry.d2h)
            self._away.pop(entry.storage._cdata, None)
            entry.state, entry.storage = RESIDENT, None

    def note_pack(self, sid: int, t: torch.Tensor) -> None:
        """Autograd saved `t`, the trace's storage `sid`: remember its storage (weakly) for this step."""
        if sid in self._watched and sid not in self._packed:
            self._packed[sid] = StorageWeakRef(t.untyped_storage())

    def fire(self, key: tuple) -> None:
        """A hook point was reached: run its actions."""
        if self._off:
            return
        if key[0] == "opt_pre" and self._creates_state():
            self.diverged("the optimizer creates its state in this step", expected=True)
            return
        for action, entry, spec in self._actions.get(key, ()):
            action(entry, spec)

    def diverged(self, why: str, expected: bool = False) -> None:
        """The run left the traced order: bring everything back and stop for this step.

        Args:
            why: what differed.
            expected: a known difference (an optimizer's first step creates its state,
                so its ops are not the traced steady state's): logged quietly, not counted.
        """
        if self._off:
            return
        self._off = True
        if expected:
            log.info("storage swaps stop for the rest of this step: %s", why)
        else:
            self.stats.diverged_steps += 1
            (log.warning if self.stats.diverged_steps == 1 else log.info)(
                "step diverged from the traced hook points (%s): storage swaps stop for the rest of it", why)
        self.restore()

    def _creates_state(self) -> bool:
        """True when optimizer state the trace had does not exist yet (its lazy first step)."""
        return self.optimizer is not None and any(self._resolve(o) is None for o in self.schedule.state)

    def before_op(self, tensors) -> None:
        """Bring back any storage of `tensors` that is away (an optimizer op is about to run)."""
        if not self._away:
            return
        for t in tensors:
            entry = self._away.get(t.untyped_storage()._cdata)
            if entry is not None:
                self.stats.rescued += 1
                self._bring_back(entry)

    def restore(self) -> None:
        """Bring every storage that is away back now (the compute stream waits for it)."""
        for entry in list(self._away.values()):
            self.stats.restored += 1
            self._bring_back(entry)

    def close(self) -> None:
        """Forget the host regions (call after `restore`; the counters stay readable)."""
        if self._away:
            log.error("closing with %d storages still away: their data is lost", len(self._away))
        self._stored.clear()
        self._actions.clear()
        self._away.clear()

    # --- actions ------------------------------------------------------------------------------

    def _out(self, entry: _Stored, spec: StorageSwapSpec) -> None:
        if entry.state != RESIDENT:
            return
        storage = self._storage_of(entry)
        if storage is None:
            self.stats.unresolved += 1
            return
        src = _bytes(storage)
        dst = entry.region.data[: entry.nbytes]
        entry.d2h = self.engine.submit("d2h", lambda: dst.copy_(src, non_blocking=True), keep=(src,),
                                       release=lambda: storage.resize_(0))
        entry.storage, entry.state = storage, AWAY
        self._away[storage._cdata] = entry
        if spec.sync:
            self.engine.wait(entry.d2h)
        self.stats.swapped_out += 1
        self.stats.swapped_out_bytes += entry.nbytes

    def _fetch(self, entry: _Stored, spec: StorageSwapSpec | None = None) -> None:
        if entry.state != AWAY:
            return
        self.engine.released(entry.d2h)  # rule 7: the worker's free is done before we re-allocate
        entry.storage.resize_(entry.nbytes)
        dst = _bytes(entry.storage)
        src = entry.region.data[: entry.nbytes]
        entry.h2d = self.engine.submit("h2d", lambda: dst.copy_(src, non_blocking=True), keep=(dst,),
                                       after=entry.d2h)
        entry.state = COMING
        if spec is not None:
            self.stats.prefetched += 1

    def _wait(self, entry: _Stored, spec: StorageSwapSpec | None = None) -> None:
        if entry.state == AWAY:
            self.stats.late_prefetches += 1
            self._fetch(entry)
        self._land(entry)

    def _bring_back(self, entry: _Stored) -> None:
        self._fetch(entry)
        self._land(entry)

    def _land(self, entry: _Stored) -> None:
        if entry.state != COMING:
            return
        self.engine.wait(entry.h2d)
        self._away.pop(entry.storage._cdata, None)
        entry.state, entry.storage = RESIDENT, None

    # --- owners -------------------------------------------------------------------------------

    def _storage_of(self, entry: _Stored) -> torch.UntypedStorage | None:
        """The live storage the trace's storage is now, if it still looks as traced."""
        storage = self._live_storage(entry.owner)
        if storage is None or storage.device.type == "meta":
            return None
        if storage.nbytes() != entry.nbytes or not storage.resizable():
            log.debug("storage %d: live storage has %d bytes (traced %d) or is not resizable: kept",
                      entry.sid, storage.nbytes(), entry.nbytes)
            return None
        return storage

    def _live_storage(self, owner: Owner) -> torch.UntypedStorage | None:
        if owner.kind == "activation":
            ref = self._packed.get(owner.storage)
            return None if ref is None or ref.expired() else torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
        t = self._resolve(owner)
        return t.untyped_storage() if isinstance(t, torch.Tensor) else None

    def _resolve(self, owner: Owner):
        """The tensor an owner holds now (None if gone)."""
        try:
            if owner.kind == "state":
                param = self.optimizer.param_groups[owner.group]["params"][owner.index]
                return self.optimizer.state.get(param, {}).get(owner.key)
            if owner.kind == "buffer":
                return self.model.get_buffer(owner.name)
            param = self.model.get_parameter(owner.name)
            return param.grad if owner.kind == "grad" else param
        except (AttributeError, IndexError, KeyError):
            return None


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over all of `storage`, with a version counter of its own."""
    view = torch.empty(0, dtype=torch.uint8, device=storage.device)
    return view.set_(storage, 0, (storage.nbytes(),), (1,))
