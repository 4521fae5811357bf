"""Turn the tracer's storage entries into `Storage` records: kind, persistence, lifetime.

Kinds:
- param: model parameters and buffers (and other pre-existing storages alive at the end);
- optimizer_state: tensors in `optimizer.state` after the step (and, without an optimizer
  at hand, storages that only the optimizer step touches or creates and that outlive it);
- input: the example inputs (and pre-existing storages freed during the iteration);
- grad: `.grad` of a parameter after the step (or: born in backward, alive at the end);
- activation: made in forward, still alive when backward starts;
- temp: everything else.
Params and optimizer state are persistent: lifetime [0, n_ops).
"""

from __future__ import annotations

from ..model import Storage
from .storages import StorageEntry

PERSISTENT_KINDS = frozenset({"param", "optimizer_state"})


def kind_of(entry: StorageEntry, *, alive_at_end: bool, first_backward: int | None,
            touched_in: frozenset = frozenset()) -> str:
    """The kind of one storage.

    Args:
        entry: the tracer's entry (its `hint` wins when set).
        alive_at_end: whether the storage was still alive after the step.
        first_backward: index of the first backward op (None if there is none).
        touched_in: the phases whose ops read or wrote it.
    Returns:
        One of the trace model's KINDS.
    """
    if entry.hint:
        return entry.hint
    if entry.born_phase is None:
        if not alive_at_end:
            return "input"
        # Without the optimizer at hand: state is what only the optimizer step touches.
        return "optimizer_state" if touched_in == {"optimizer"} else "param"
    if entry.born_phase == "backward" and alive_at_end:
        return "grad"
    if entry.born_phase == "optimizer" and alive_at_end:
        return "optimizer_state"
    if entry.born_phase == "forward" and first_backward is not None \
            and (entry.free_op is None or entry.free_op > first_backward):
        return "activation"
    return "temp"


def to_storage(entry: StorageEntry, kind: str, n_ops: int) -> Storage:
    """The immutable record of one entry; persistent kinds span the whole iteration."""
    persistent = kind in PERSISTENT_KINDS
    alloc = 0 if persistent else entry.alloc_op
    free = n_ops if persistent or entry.free_op is None else entry.free_op
    return Storage(id=entry.sid, nbytes=entry.nbytes, kind=kind, alloc_op=alloc, free_op=max(free, alloc),
                   persistent=persistent, dtype=entry.dtype, shape=entry.shape, name=entry.name)
