"""Saved activations and the gap each can leave device memory for: one definition for every planner.

A saved activation is made in forward and read again in backward (what autograd saved):
an activation storage with a backward access, that no data-parallel engine owns. Its gap
runs from its last access before its first backward access (`last_forward`) to that
backward access (`back_before`); while away it is on the host (swap) or dropped and rebuilt
before `back_before` (recompute). `save-on-cpu` and `checkpoint-all` take every saved
activation; the planners that choose among them take those with at least one op in the gap
(`saved_gaps`), which HOME and Capuchin call feature maps (`memplan.planners.kit.featuremaps`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ...model import Trace


@dataclass(frozen=True, kw_only=True)
class SavedGap:
    """One saved activation and the widest gap it can leave device memory for."""

    storage: int  # storage id
    nbytes: int  # its size
    last_forward: int  # its last access before back_before: the earliest op it can leave after
    back_before: int  # its first backward access: it must be back before this op

    @property
    def has_room(self) -> bool:
        """At least one op runs inside the gap (an empty gap saves nothing)."""
        return self.back_before - self.last_forward >= 2


def saved_activations(trace: Trace) -> list[SavedGap]:
    """Every saved activation of `trace` (module docstring), by storage id, whatever its gap."""
    out = []
    for s in trace.storages:
        if s.kind != "activation" or s.id in trace.engine_owned:  # DDP/FSDP2 manage those
            continue
        back = first_backward_access(trace, s.id)
        if back is not None:
            out.append(SavedGap(storage=s.id, nbytes=s.nbytes, last_forward=last_access_before(trace, s.id, back),
                                back_before=back))
    return out


def saved_gaps(trace: Trace, min_bytes: int = 0) -> list[SavedGap]:
    """The saved activations of at least `min_bytes` with at least one op in their gap, by id
    (a persistent one stays: it is needed in the next iteration anyway)."""
    return [g for g in saved_activations(trace)
            if g.nbytes >= min_bytes and g.has_room and not trace.storages[g.storage].persistent]


def first_backward_access(trace: Trace, sid: int) -> int | None:
    """The first op of the backward phase that reads or writes `sid` (None when there is none)."""
    return next((i for i in trace.accesses[sid] if trace.ops[i].phase == "backward"), None)


def last_access_before(trace: Trace, sid: int, op: int) -> int:
    """The last op before `op` that reads or writes `sid`."""
    accesses = trace.accesses[sid]
    return accesses[bisect.bisect_left(accesses, op) - 1]


def first_backward_op(trace: Trace) -> int:
    """Index of the first backward op (the number of ops when there is none)."""
    return next((op.index for op in trace.ops if op.phase == "backward"), len(trace.ops))
