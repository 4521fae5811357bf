"""Lifetimes of the storages of a generated iteration, derived from their accesses the way the
tracer derives them: a storage is born at its first access (op 0 when it existed before the
step) and freed after its last one, or lives to the end of the iteration."""

from __future__ import annotations


def access_spans(ops) -> tuple[dict[int, int], dict[int, int]]:
    """(first, last): per storage, the index of the first and of the last op (dicts with `reads`
    and `writes`) that reads or writes it."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, op in enumerate(ops):
        for sid in (*op["reads"], *op["writes"]):
            first.setdefault(sid, i)
            last[sid] = i
    return first, last


def lifetime(first: int | None, last: int | None, n_ops: int, *, pre: bool, to_end: bool,
             late: int = 0) -> tuple[int, int]:
    """(alloc_op, free_op) of a storage first and last accessed at ops `first` and `last`.

    Args:
        first, last: its first and last access (None when it has none: then it must be `pre`
            and `to_end`).
        n_ops: the ops of the iteration.
        pre: it exists before the step (born at op 0).
        to_end: it lives to the end of the iteration (persistent state, gradients).
        late: ops it outlives its last access otherwise (the framework's free comes later).
    """
    alloc = 0 if pre else first
    free = n_ops if to_end else min(n_ops, last + 1 + late)
    return alloc, free
