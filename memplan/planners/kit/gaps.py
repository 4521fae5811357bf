"""Gaps and the load they leave: one definition of when a storage is away, for every planner.

A gap of a storage is the ops strictly between `out_after` (the access it leaves after)
and `back_before` (the access it must be back for); a gap with back_before <= out_after
wraps around the iteration boundary (a weight or optimizer state away from its last access
to its first one in the next iteration). The load without a set of gaps counts each away
over its whole gap, copies and recomputations taking no time: the validator's static load
without prefetches, what no schedule of those gaps goes below.
"""

from __future__ import annotations

import numpy as np

from ...model import Trace


def alive_at(trace: Trace, sid: int, op: int) -> bool:
    """True when the trace holds storage `sid` while `op` runs: its lifetime [alloc_op, free_op) covers
    `op` (before it and after the framework freed it, a recomputation must rebuild it)."""
    s = trace.storages[sid]
    return s.alloc_op <= op < s.free_op


def gap_covers(out_after: int, back_before: int, op: int) -> bool:
    """True when `op` lies strictly inside the gap (the storage is away while it runs)."""
    if back_before > out_after:
        return out_after < op < back_before
    return op > out_after or op < back_before


def away_mask(n_ops: int, out_after: int, back_before: int) -> np.ndarray:
    """Per op, `gap_covers(out_after, back_before, op)`: the ops out_after+1 .. back_before-1,
    wrapping around when back_before <= out_after."""
    mask = np.zeros(n_ops, dtype=bool)
    if back_before > out_after:
        mask[out_after + 1:back_before] = True
    else:
        mask[out_after + 1:] = True
        mask[:back_before] = True
    return mask


def load_without(trace: Trace, gaps) -> np.ndarray:
    """The trace's load per op with each (storage, out_after, back_before) of `gaps` away over its
    whole gap (wrapping around where it does)."""
    n = len(trace.ops)
    delta = np.zeros(n + 1, dtype=np.int64)
    for sid, out_after, back in gaps:
        size = trace.nbytes[sid]
        delta[out_after + 1] -= size
        delta[back] += size
        if back <= out_after:  # away from out_after + 1 to the end, and from the start to back
            delta[n] += size
            delta[0] -= size
    return trace.load + np.cumsum(delta)[:n]

