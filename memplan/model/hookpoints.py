"""Where a step can be acted on without a dispatch mode: the hooks PyTorch calls during a step.

The tracer records, beside the ops, every tensor autograd saved for backward (a pack of
`torch.autograd.graph.saved_tensors_hooks`) in the order it was packed, with the point it was
packed and unpacked at; every module call of the forward (its forward pre-hook and forward hook
fire at its first op and after its last); and the other hooks of a training step (`Mark`): a
parameter's gradient accumulated (`register_post_accumulate_grad_hook`), the optimizer's step
beginning and ending (its step pre- and post-hooks) and, where its step updates one parameter at a
time, beginning each parameter's update (memplan.tracing.stepwise). A point is the number of ops completed:
point p lies between op p-1 and op p. The hooked executor (memplan.exec.hooked) knows where the
step is at each of these hooks (the n-th pack of a step is `Trace.saved[n]`, the k-th call of a
module is its k-th `Call`), so they are the moments it acts at (memplan.model.hooksites), and a
module call is a region it can run again to recompute what the call saved (memplan.sim.lowering).
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


# a gradient accumulated; the optimizer's step begins; it begins updating a parameter (a step run a
# parameter at a time: memplan.tracing.stepwise); it ended
MARK_KINDS = ("accumulated", "step", "update", "stepped")


@dataclass(frozen=True, kw_only=True)
class Mark:
    """One call of a training step's hook other than a saved tensor's or a module's, where it fired."""

    kind: str  # one of MARK_KINDS
    key: str  # the parameter's name (accumulated, update); "" for the optimizer's step
    occurrence: int  # earlier calls of the same hook (kind and key) in the step
    point: int  # the point it fired at

    def __post_init__(self):
        if self.kind not in MARK_KINDS or self.point < 0 or self.occurrence < 0:
            raise ValueError(f"mark {self.kind!r} of {self.key!r}: an unknown kind or a negative point")


def first_packs(saved: tuple[Saved, ...]) -> dict[int, int]:
    """Storage -> the index in `saved` of its first pack (the earliest: `saved` is in pack order)."""
    out: dict[int, int] = {}
    for k, s in enumerate(saved):
        if s.storage is not None:
            out.setdefault(s.storage, k)
    return out
