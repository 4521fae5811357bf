"""Saved activations' forward-to-backward gaps, the load with gaps taken away, and the
prefetch order of paper 002 §4.5; shared by `dqn`, `tflms` and `superneurons-modes`.

A saved activation is made in forward and read again in backward (what autograd saved).
Its gap runs from an op at or after its last forward access (`out_after`) to its first
backward access (`back_before`); while away it is on the host (swap) or dropped and
rebuilt before `back_before` (recompute).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import Decision, Trace


@dataclass(frozen=True, kw_only=True)
class SavedGap:
    """One saved activation and the widest gap it can leave device memory for."""

    storage: int  # storage id
    nbytes: int  # its size
    last_forward: int  # its last forward access: the earliest op it can leave after
    back_before: int  # its first backward access: it must be back before this op


def first_backward_op(trace: Trace) -> int:
    """Index of the first backward op (the number of ops when there is none)."""
    return next((op.index for op in trace.ops if op.phase == "backward"), len(trace.ops))


def saved_gaps(trace: Trace, min_bytes: int = 0) -> list[SavedGap]:
    """The saved activations of at least `min_bytes` with at least one op in their gap, by id."""
    phases = [op.phase for op in trace.ops]
    out = []
    for s in trace.storages:
        if s.kind != "activation" or s.nbytes < min_bytes or s.persistent or s.id in trace.engine_owned:
            continue
        accesses = trace.accesses[s.id]
        back = next((i for i in accesses if phases[i] == "backward"), None)
        forward = [i for i in accesses if phases[i] == "forward" and (back is None or i < back)]
        if back is not None and forward and back - forward[-1] >= 2:
            out.append(SavedGap(storage=s.id, nbytes=s.nbytes, last_forward=forward[-1], back_before=back))
    return out


def load_without(trace: Trace, gaps) -> np.ndarray:
    """The trace's load per op with each (storage, out_after, back_before) away over
    [out_after + 1, back_before) (copies and recomputes taking no time: the validator's
    static load without prefetches)."""
    n = len(trace.ops)
    delta = np.zeros(n + 1, dtype=np.int64)
    for sid, out_after, back in gaps:
        delta[out_after + 1] -= trace.nbytes[sid]
        delta[back] += trace.nbytes[sid]
    return trace.load + np.cumsum(delta)[:n]


def prefetch_triggers(trace: Trace, swaps, load: np.ndarray, cap: int) -> list[int]:
    """Paper 002 §4.5: prefetch the earliest reused absent storage first, each as soon as it fits.

    Swaps are issued in order of next use (one FIFO host-to-device engine); each is
    issued at the first backward op, not before the previous one's, from which holding
    its bytes until its use keeps the load within `cap`.

    Args:
        trace: the trace.
        swaps: (storage, out_after, back_before) of the swaps, in order of back_before.
        load: the load with every gap away (`load_without`); not modified.
        cap: the bytes the load must stay within.
    Returns:
        The trigger op of each swap, in the order given.
    """
    load = load.copy()
    earliest = first_backward_op(trace)
    triggers, previous = [], 0
    for sid, out_after, back in swaps:
        size = int(trace.nbytes[sid])
        lo = min(back, max(out_after + 1, earliest, previous))
        over = np.flatnonzero(load[lo:back] + size > cap)
        trigger = lo + int(over[-1]) + 1 if over.size else lo
        load[trigger:back] += size
        triggers.append(trigger)
        previous = trigger
    return triggers


def gap_decisions(trace: Trace, swaps, recomputes, cap: int | None = None,
                  load: np.ndarray | None = None) -> tuple[Decision, ...]:
    """Decisions for swapped and recomputed gaps, swaps prefetched in the §4.5 order.

    Args:
        trace: the trace.
        swaps, recomputes: (storage, out_after, back_before) triples.
        cap: the load the prefetches must keep within; None: the peak of the load with
            every gap away (prefetches never raise the plan's own peak).
        load: the load with every gap away, when the caller has a better one (with the
            memory recomputations take for a while); default `load_without`.
    Returns:
        The decisions ordered by (back_before, storage), the order the simulator issues
        swap-outs and prefetches of one op in.
    """
    load = load_without(trace, list(swaps) + list(recomputes)) if load is None else load
    cap = int(load.max()) if cap is None else cap
    order = sorted(swaps, key=lambda g: (g[2], g[0]))
    triggers = prefetch_triggers(trace, order, load, cap)
    out = [Decision(storage=s, action="swap", out_after=o, back_before=b, trigger=t)
           for (s, o, b), t in zip(order, triggers)]
    out += [Decision(storage=s, action="recompute", out_after=o, back_before=b) for s, o, b in recomputes]
    return tuple(sorted(out, key=lambda d: (d.back_before, d.storage)))


MAX_RAISES = 8  # simulator runs `smallest_budget` tries before it gives up raising the cap


def smallest_budget(simulator, plan, start: int) -> int:
    """The smallest budget from `start` up at which the simulator runs `plan`: the cap is raised by each
    shortfall it reports (recomputation temporaries and prefetches in flight can need more than the
    planned load); the last cap tried when that does not settle."""
    budget = start
    for _ in range(MAX_RAISES):
        result = simulator.run(plan, budget)
        if result.feasible:
            break
        budget += max(result.shortfall_bytes, 1)
    return budget
