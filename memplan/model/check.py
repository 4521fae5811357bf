"""The one check that a plan belongs to a trace, run wherever a plan meets its trace.

Loading a plan for a trace (`read_plan(path, trace)`), simulating it, laying out its pool
and training under it all call `check_plan` first, so a plan made for another trace, or
naming storages and ops the trace does not have, is refused in one line everywhere
instead of failing somewhere inside. It checks only what every consumer needs to index
the trace safely; whether the plan is *good* (reads while away, overlaps, the budget) is
`memplan.sim.validate`'s job.
"""

from __future__ import annotations

import os

from ..errors import MemplanError
from .plan import Plan
from .trace import Trace


class PlanMismatchError(MemplanError):
    """A plan that was made for another trace, or names storages or ops the trace lacks."""


def check_plan(trace: Trace, plan: Plan, source: str = "plan") -> Plan:
    """Return `plan` if it can belong to `trace`; else raise PlanMismatchError.

    Args:
        trace: the trace the plan is used with.
        plan: the plan.
        source: how errors name the plan (its file name).
    Returns:
        The plan, unchanged.
    Raises:
        PlanMismatchError: another trace's digest, an unknown storage id, an op index
            outside the trace, or a negative pool offset or size.
    """
    if not isinstance(plan, Plan):
        raise MemplanError(f"{source}: expected a memplan Plan, got {type(plan).__name__} "
                           f"(read a plan file with memplan.read_plan)")
    if plan.trace_digest is not None and plan.trace_digest != trace.digest:
        raise PlanMismatchError(f"{source}: was made for another trace (digest {plan.trace_digest}, "
                                f"this trace is {trace.digest})")
    n_storages, n_ops = len(trace.storages), trace.num_steps
    for d in plan.decisions:
        _check_storage(d.storage, n_storages, source)
        for name in ("out_after", "back_before", "trigger"):
            op = getattr(d, name)
            if op is not None and not 0 <= op < n_ops:
                raise PlanMismatchError(f"{source}: decision for storage {d.storage}: {name}={op} is outside "
                                        f"the trace's {n_ops} ops")
    for slot in plan.pool:
        _check_storage(slot.storage, n_storages, source)
        if not 0 <= slot.start < max(n_ops, 1) or slot.offset < 0:
            raise PlanMismatchError(f"{source}: pool slot of storage {slot.storage} (op {slot.start}, offset "
                                    f"{slot.offset}) is outside the trace's {n_ops} ops or negative")
    if plan.pool_bytes is not None and plan.pool_bytes < 0:
        raise PlanMismatchError(f"{source}: pool_bytes is negative ({plan.pool_bytes})")
    _check_microbatches(trace, plan.microbatches, source)
    return plan


def expect_trace(obj, what: str) -> Trace:
    """`obj` if it is a Trace; a file name or anything else gets one clear MemplanError.

    Args:
        obj: what the caller passed as the trace.
        what: the public function's name, for the message.
    """
    if isinstance(obj, Trace):
        return obj
    if isinstance(obj, (str, os.PathLike)):
        raise MemplanError(f"memplan.{what} takes a Trace, not the file name {str(obj)!r}: "
                           f"load it first with memplan.load_any({str(obj)!r})")
    raise MemplanError(f"memplan.{what} takes a Trace, not {type(obj).__name__}")


def _check_microbatches(trace: Trace, microbatches, source: str) -> None:
    """Every conv decision names a kernel its op runs, once, splits the op's batch, and an op
    with any decided kernel has all of them decided (its time is theirs)."""
    decided: dict[int, list[str]] = {}
    for m in microbatches:
        op = trace.ops[m.op] if 0 <= m.op < len(trace.ops) else None
        conv = op.conv if op is not None else None
        if conv is None or m.kernel not in conv.kernels:
            what = "is not a convolution" if conv is None else f"runs {', '.join(conv.kernels)}"
            raise PlanMismatchError(f"{source}: micro-batch decision for kernel {m.kernel} of op {m.op}: "
                                    f"that op {what}")
        if sum(m.sizes) != conv.n:
            raise PlanMismatchError(f"{source}: micro-batches {list(m.sizes)} of op {m.op} do not sum to its "
                                    f"batch of {conv.n}")
        decided.setdefault(m.op, []).append(m.kernel)
    for op, kernels in decided.items():
        if sorted(kernels) != sorted(trace.ops[op].conv.kernels):
            raise PlanMismatchError(f"{source}: op {op} runs {', '.join(trace.ops[op].conv.kernels)}, the plan "
                                    f"decides {', '.join(kernels)}: decide each of its kernels once")


def _check_storage(sid: int, n_storages: int, source: str) -> None:
    if not 0 <= sid < n_storages:
        raise PlanMismatchError(f"{source}: names storage {sid}, but the trace has storages 0..{n_storages - 1}")
