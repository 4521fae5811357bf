"""Where a step can be acted on without a dispatch mode: autograd's saved tensors and module calls.

The tracer records, beside the ops, every tensor autograd saved for backward (a pack of
`torch.autograd.graph.saved_tensors_hooks`) in the order it was packed, with the point it was
packed and unpacked at, and every module call of the forward. A point is the number of ops
completed: point p lies between op p-1 and op p. The hooked executor (memplan.exec.hooked)
counts packs as the step runs, so the n-th pack of a step is `Trace.saved[n]`; its packs and
unpacks are the moments it acts at, and a module call is a region it can run again to
recompute what the call saved (memplan.sim.lowering).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Saved:
    """One tensor autograd saved for backward, in pack order."""

    storage: int | None  # the storage it views (None: one the trace does not know)
    packed_at: int  # the point it was packed at
    unpacked_at: int | None = None  # the point backward first unpacked it at (None: never)

    def __post_init__(self):
        if self.packed_at < 0 or (self.unpacked_at is not None and self.unpacked_at < self.packed_at):
            raise ValueError(f"saved tensor of storage {self.storage}: a negative point, or unpacked before packed")


@dataclass(frozen=True, kw_only=True)
class Call:
    """One call of a module's forward while autograd records: a region that can run again."""

    module: str  # the module's path ("" for the root)
    occurrence: int  # calls of that module earlier in the step
    first_op: int  # its first op
    end_op: int  # one past its last op
    first_saved: int  # index into Trace.saved of its first pack
    end_saved: int  # one past its last pack
    args: tuple[int, ...] = ()  # storages of its tensor arguments (the executor holds them to run it again)

    def __post_init__(self):
        if not (0 <= self.first_op <= self.end_op and 0 <= self.first_saved <= self.end_saved):
            raise ValueError(f"call {self.occurrence} of module {self.module!r}: bad op or pack range")


def hook_points(saved: tuple[Saved, ...], n_ops: int) -> list[int]:
    """The points a hooked executor acts at, ascending: every pack and unpack, the step's start and end."""
    marks = {0, n_ops} | {s.packed_at for s in saved} | {s.unpacked_at for s in saved if s.unpacked_at is not None}
    return sorted(marks)


def first_packs(saved: tuple[Saved, ...]) -> dict[int, int]:
    """Storage -> the index in `saved` of its first pack (the earliest: `saved` is in pack order)."""
    out: dict[int, int] = {}
    for k, s in enumerate(saved):
        if s.storage is not None:
            out.setdefault(s.storage, k)
    return out
