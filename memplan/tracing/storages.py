"""The tracer's table of storages: identity, birth and death of every buffer it sees.

Storages are identified by their StorageImpl (views and in-place results share it), for
real and fake tensors alike. Only weak references are held, so tracing never extends a
lifetime; a storage whose weak reference has expired was freed by the framework, and
the tracer sweeps for those between ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .opinfo import storage_key


@dataclass(kw_only=True)
class StorageEntry:
    """What the tracer knows about one storage (mutable while tracing)."""

    sid: int  # dense id, in order of first sight
    ref: StorageWeakRef  # weak reference: expired once the framework frees the buffer
    nbytes: int  # size of the buffer
    alloc_op: int  # op that wrote it first (0 if it pre-existed)
    born_phase: str | None  # phase of that op; None if it pre-existed
    dtype: str  # dtype of the tensor that created it
    shape: tuple[int, ...]  # shape of the tensor that created it
    free_op: int | None = None  # first op after the framework freed it; None while alive
    hint: str | None = None  # kind known from outside (param, optimizer_state, input, grad)
    name: str | None = None  # parameter or state name, where known


class StorageTable:
    """Storages seen so far, with the live ones indexed by storage identity."""

    def __init__(self):
        self.entries: list[StorageEntry] = []
        self._live: dict[int, StorageEntry] = {}  # swept between ops
        self._pinned: dict[int, StorageEntry] = {}  # held by the caller for the whole step: never swept

    def lookup(self, t: torch.Tensor) -> StorageEntry | None:
        """The live entry of `t`'s storage, or None if unseen."""
        t = local_tensor(t)
        key = storage_key(t)
        return self._live.get(key) or self._pinned.get(key)

    def add(self, t: torch.Tensor, op: int, phase: str | None, *, pinned: bool = False, **extra) -> StorageEntry:
        """Register the storage of `t`, born at `op` (phase None: it pre-existed).

        Args:
            pinned: the caller holds a reference for the whole step (model parameters,
                optimizer state, the inputs), so the storage is never swept: sweeping
                costs one check per live storage per op.
        """
        t = local_tensor(t)
        storage = t.untyped_storage()
        entry = StorageEntry(sid=len(self.entries), ref=StorageWeakRef(storage), nbytes=int(storage.nbytes()),
                             alloc_op=op, born_phase=phase, dtype=str(t.dtype).removeprefix("torch."),
                             shape=tuple(int(d) for d in t.shape), **extra)
        self.entries.append(entry)
        (self._pinned if pinned else self._live)[storage_key(t)] = entry
        return entry

    def resized(self, storage: torch.UntypedStorage, nbytes: int, op: int, phase: str | None) -> None:
        """A storage was resized in place (FSDP2 frees and re-allocates unsharded parameters so).

        Each allocation is one storage of the trace: the live entry ends at `op`, and a new one
        of `nbytes` is born at `op` unless the new size is 0.
        """
        key = storage._cdata
        if key in self._pinned:
            return  # held for the whole step: its size at registration stands
        entry = self._live.pop(key, None)
        if entry is not None:
            entry.free_op = op
        if nbytes > 0:
            born = StorageEntry(sid=len(self.entries), ref=StorageWeakRef(storage), nbytes=int(nbytes), alloc_op=op,
                                born_phase=phase, dtype="uint8", shape=(int(nbytes),))
            self.entries.append(born)
            self._live[key] = born

    def get_or_add(self, t: torch.Tensor, op: int, phase: str | None) -> StorageEntry:
        """The live entry of `t`'s storage, registering it if unseen."""
        return self.lookup(t) or self.add(t, op, phase)

    def sweep(self, op: int) -> None:
        """Mark storages freed since the last sweep as gone from op `op` on."""
        expired = _expired
        dead = [key for key, entry in self._live.items() if expired(entry.ref.cdata)]
        for key in dead:
            self._live.pop(key).free_op = op

    def alive(self) -> list[StorageEntry]:
        """Entries still alive now."""
        live = [e for e in self._live.values() if not e.ref.expired()]
        return live + [e for e in self._pinned.values() if not e.ref.expired()]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard (FSDP2 parameters, their state), else `t`."""
    return getattr(t, "_local_tensor", t)


# StorageWeakRef.expired() without its Python wrapper: the sweep is the tracer's hot loop.
_expired = torch.UntypedStorage._expired
