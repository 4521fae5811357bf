"""Finding, at a point of the step, the real storage a trace storage id names.

At the op the program acts after, a storage is among that op's tensors (`storage_roles`
pairs them with the trace's ids); for gaps that start before any op of the step
(wrap-around swaps), it is found through its owner (a parameter, a buffer, a gradient or
optimizer state, `Trace.owners`). A storage found with another size than traced, or not
resizable, is left alone: the action is counted unresolved and the storage stays resident.
"""

from __future__ import annotations

import logging

import torch

from ..model import Trace
from ..model.blocks import allocated_size
from ..tracing.opinfo import storage_roles
from .owners import resolve_owner
from .residency import ExecStats, MovedStorage

log = logging.getLogger(__name__)


class StorageFinder:
    """Finds the storages of one trace in a run of its step.

    Args:
        trace: the traced iteration.
        stats: where unresolved actions are counted.
        model, optimizer: where owned storages are found.
    """

    def __init__(self, trace: Trace, stats: ExecStats, model: torch.nn.Module | None,
                 optimizer: torch.optim.Optimizer | None):
        self.trace = trace
        self.stats = stats
        self.model = model
        self.optimizer = optimizer
        self.owners = {o.storage: o for o in trace.owners}
        self.rounded = trace.meta.get("device_memory", {}).get("rounded_to", 1) > 1  # memplan.cost.device_memory

    def at_op(self, i: int, func, args, kwargs, out) -> dict[int, torch.Tensor]:
        """Op i's tensors by the trace's storage ids (what it read, then what it wrote)."""
        op = self.trace.ops[i]
        reads, writes = storage_roles(func, args, kwargs, out)
        return dict(list(zip(op.reads, reads)) + list(zip(op.writes, writes)))

    def found(self, entry: MovedStorage, found) -> torch.UntypedStorage | None:
        """The entry's storage among `found` tensors (by trace id), if it is as traced."""
        t = found.get(entry.sid) if found else None
        storage = t.untyped_storage() if isinstance(t, torch.Tensor) else None
        return self._usable(entry, storage)

    def owned(self, entry: MovedStorage) -> torch.UntypedStorage | None:
        """The entry's storage through its owner (model or optimizer), if it is as traced."""
        owner = self.owners.get(entry.sid)
        t = resolve_owner(owner, self.model, self.optimizer) if owner is not None else None
        return self._usable(entry, t.untyped_storage() if isinstance(t, torch.Tensor) else None)

    def counted(self, nbytes: int) -> int:
        """`nbytes` as the trace counts it (a device view counts allocator blocks)."""
        return allocated_size(nbytes) if self.rounded else nbytes

    def _usable(self, entry: MovedStorage, storage) -> torch.UntypedStorage | None:
        if storage is None or self.counted(storage.nbytes()) != entry.nbytes or not storage.resizable():
            self.stats.unresolved += 1
            log.debug("storage %d not found as traced: kept resident", entry.sid)
            return None
        entry.real_nbytes = storage.nbytes()
        return storage


def touched_entries(away: dict, args: tuple, kwargs: dict) -> list:
    """The entries of `away` (by storage address) under the tensor arguments of an aten call
    (tensors, or lists of tensors, one level deep), each once. Runs at every op while a storage
    is away: a plain loop, no generators."""
    found: dict[int, object] = {}
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            entry = away.get(value.untyped_storage()._cdata)
            if entry is not None:
                found[entry.sid] = entry
        elif isinstance(value, (list, tuple)):
            for t in value:
                if isinstance(t, torch.Tensor):
                    entry = away.get(t.untyped_storage()._cdata)
                    if entry is not None:
                        found[entry.sid] = entry
    return list(found.values())
