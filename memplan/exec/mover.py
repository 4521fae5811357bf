"""Moving a step's storages off the device and back: what both executors do at an action.

A Mover holds, per storage the step program moves, where it is (memplan.exec.residency), and
runs the program's actions on it: a swap-out copies a storage into its host region and frees its
device bytes at the release (resizing the storage to 0: every holder of it sees the change), a
prefetch allocates it again and copies it back, a wait joins that copy, a drop frees a storage to
be recomputed. How a storage is found and how a recomputation runs is the executor's own: op by
op in a dispatch mode (memplan.exec.interpreted) or at autograd's hooks (memplan.exec.hooked).
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ..model import Trace
from ..model.program import Action, ActionKind, StepProgram
from .engine import CopyEngine, blocked_s
from .hostcopy import fits, load, store, store_whole, typed_bytes
from .locate import StorageFinder
from .residency import ExecStats, MovedStorage, Residency
from .slab import HostSlab
from .storage_views import byte_view

log = logging.getLogger(__name__)

# The method that runs each kind of action, looked up at every action (a test may replace one).
ACTION_METHODS = {ActionKind.SWAP_OUT: "_swap_out", ActionKind.RELEASE: "_release", ActionKind.PREFETCH: "_prefetch",
                  ActionKind.WAIT: "_wait", ActionKind.DROP: "_drop", ActionKind.RECOMPUTE: "_recompute"}


class Mover:
    """The storages `program` moves and the actions that move them.

    Args:
        trace: the traced iteration.
        program: its compiled step program.
        engine: the copy lanes.
        slab: the host slab (one region per swap decision).
        model, optimizer: where owned storages are found (wrap-around gaps).
    """

    def __init__(self, trace: Trace, program: StepProgram, engine: CopyEngine, slab: HostSlab,
                 model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None):
        self.trace = trace
        self.program = program
        self.engine = engine
        self.slab = slab
        self.entries = {d.storage: MovedStorage(sid=d.storage, nbytes=trace.storages[d.storage].nbytes,
                                                dtype=trace.storages[d.storage].dtype) for d in program.decisions}
        self.away: dict[int, MovedStorage] = {}  # storage address -> entry, for every storage not resident
        self.moving = False  # the mover's own copies run: their ops are not the step's (memplan.exec.interpreted)
        self.stats = ExecStats()
        self.finder = StorageFinder(trace, self.stats, model, optimizer)
        self.active = False  # a step is running
        self.off = False  # the step left its program (`diverge`): the rest of it runs unplanned

    def settle(self) -> None:
        """Put storages where a step starts with them: on the host for gaps across the boundary."""
        for k in self.program.start_away:
            self._send_away(k)

    def restore(self) -> None:
        """Bring every storage the program moved back to the device."""
        for entry in list(self.entries.values()):
            if entry.state != Residency.RESIDENT:
                self.stats.restored += 1
                self._bring_back(entry)

    def diverge(self, reason: str) -> None:
        """Leave the program for the rest of the step: bring every storage back (the run is not the
        traced one: memplan.exec.hooked's rule 2, memplan.exec.resync's rules)."""
        if not self.off:
            self.stats.diverged_steps += 1
            log.warning("step left the planned trace (%s): the rest of it runs unplanned", reason)
        self.off = True
        self.restore()

    def abort(self) -> None:
        """An exception cut the step short: its graph is gone, so storages dropped to be recomputed
        are forgotten (nothing reads them again: rebuilding them would be wasted work, and could fail
        over the caller's error), and every storage copied away comes back (it may be a parameter)."""
        self.stats.aborted_steps += 1
        for entry in self.entries.values():
            if entry.state == Residency.DROPPED:
                self._resident(entry)
        self.restore()

    # --- actions ----------------------------------------------------------------------------

    def _act(self, action: Action, found) -> None:
        d = self.program.decisions[action.decision]
        entry = self.entries[d.storage]
        getattr(self, ACTION_METHODS[action.kind])(entry, action.decision, found)

    def _swap_out(self, entry: MovedStorage, k: int, found) -> None:
        if entry.state == Residency.LEAVING and entry.decision == k:  # its copy started beside the op
            if self.program.decisions[k].sync:
                self._release(entry, k)
            return
        storage = self._storage_of(entry, found)
        if storage is None or entry.state != Residency.RESIDENT:
            return
        self._copy_out(entry, storage, k)

    def _release(self, entry: MovedStorage, k: int, found=None) -> None:
        if entry.state != Residency.LEAVING:
            return
        if self.program.decisions[entry.decision].compress_ratio is None:
            # the compute side waits for the copy, on the device on a GPU (memplan.exec.engine, rule 5)
            self.stats.release_wait_s += blocked_s(self.engine, entry.d2h, self.engine.wait)
        else:  # the host reads whether the compressed copy held every non-zero (memplan.exec.hostcopy)
            self.stats.release_wait_s += blocked_s(self.engine, entry.d2h, self.engine.sync)
            if not fits(entry.host_copy):  # it did not: the whole bytes go too, and are waited for likewise
                self._submit_out(entry, entry.storage, store_whole)
                self.stats.release_wait_s += blocked_s(self.engine, entry.d2h, self.engine.wait)
        entry.storage.resize_(0)
        entry.state = Residency.AWAY
        self.stats.released += 1

    def _prefetch(self, entry: MovedStorage, k: int, found=None) -> None:
        if entry.state == Residency.LEAVING:  # fetched before its swap-out was released: it never left
            self.engine.cancel(entry.d2h)
            self.engine.wait(entry.d2h)  # a copy still reading it ends before its memory can be freed (rule 5)
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
        storage = self._storage_of(entry, found)
        if storage is None or entry.state != Residency.RESIDENT:
            return
        if not self._can_rebuild(k):
            self.stats.unresolved += 1
            return
        self._leave(entry, storage, k, Residency.DROPPED)
        storage.resize_(0)
        self.stats.dropped += 1

    def _storage_of(self, entry: MovedStorage, found) -> torch.UntypedStorage | None:
        """The entry's storage among `found` tensors, or, where they do not hold it, through its owner (the
        interpreted executor finds an op's tensors: a state swapped out after the step's last update is not one)."""
        if (found is None or entry.sid not in found) and entry.sid in self.finder.owners:
            return self.finder.owned(entry)
        return self.finder.found(entry, found)

    def _can_rebuild(self, k: int) -> bool:
        """Whether recompute decision k's storage can be rebuilt when its time comes."""
        raise NotImplementedError

    def _recompute(self, entry: MovedStorage, k: int, found=None) -> None:
        raise NotImplementedError

    def _after_rebuild(self) -> None:
        """A storage was rebuilt outside the program (restore, divergence): clean up after it."""

    # --- moving bytes ---------------------------------------------------------------------------

    def _copy_out(self, entry: MovedStorage, storage: torch.UntypedStorage, k: int, release: bool = True) -> None:
        """Start the swap-out of `storage` into decision k's host region (a `sync` decision's
        release follows at once unless `release` is false)."""
        d = self.program.decisions[k]
        self._leave(entry, storage, k, Residency.LEAVING)
        compressed = d.compress_ratio is not None
        self._submit_out(entry, storage, lambda src, region: store(src, typed_bytes(src, entry.dtype) if compressed
                                                                   else None, region))
        self.stats.swapped_out += 1
        self.stats.swapped_out_bytes += entry.nbytes
        self.stats.link_bytes += entry.nbytes
        if d.sync and release:
            self._release(entry, k)

    def _submit_out(self, entry: MovedStorage, storage: torch.UntypedStorage, how) -> None:
        """Queue on the d2h lane the copy of `storage` into its region, made by `how(src, region)`."""
        region = self.slab.region(entry.decision)
        with self._own_work():
            src = byte_view(storage)

            def job():
                entry.host_copy = how(src, region)

            entry.d2h = self.engine.submit("d2h", job)

    def _copy_in(self, entry: MovedStorage) -> None:
        """Allocate the storage again and start copying its bytes back."""
        with self._own_work():
            entry.storage.resize_(entry.real_nbytes)
            dst = byte_view(entry.storage)

            def job():
                load(dst, entry.host_copy)

            entry.h2d = self.engine.submit("h2d", job, after=entry.d2h)
        entry.state = Residency.COMING
        self.stats.link_bytes += entry.nbytes

    @contextlib.contextmanager
    def _own_work(self):
        """The mover's copies: a dispatch mode of the executor lets their ops through unseen (else a copy
        back of a storage away would meet the mode's guard, which would bring the same storage back from
        inside its own copy)."""
        was, self.moving = self.moving, True
        try:
            yield
        finally:
            self.moving = was

    def _leave(self, entry: MovedStorage, storage: torch.UntypedStorage, k: int, state: str) -> None:
        """The storage stops being resident: from now on no op may touch it (see `_guard`)."""
        entry.storage, entry.decision, entry.state = storage, k, state
        self.away[storage._cdata] = entry

    def _resident(self, entry: MovedStorage) -> None:
        if entry.storage is not None:
            self.away.pop(entry.storage._cdata, None)
        entry.state, entry.storage = Residency.RESIDENT, None

    def _bring_back(self, entry: MovedStorage) -> None:
        if entry.state == Residency.LEAVING:
            self.engine.sync(entry.d2h)
            self._resident(entry)
        elif entry.state == Residency.DROPPED:
            self._recompute(entry, entry.decision)
            self._after_rebuild()
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
