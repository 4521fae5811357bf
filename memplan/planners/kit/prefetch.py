"""When a swapped storage is prefetched: the rules planners share.

- Layer lead (vDNN, paper 001; HOME, paper 004 Fig. 4): the prefetch is issued when the
  backward layer `lead` layers before the one that needs the storage starts
  (`lead_trigger` over `backward_layer_starts`).
- Paper 002 §4.5 (the DQN planner, TFLMS, SuperNeurons' modes): the earliest reused absent
  storage first, each as soon as it fits (`prefetch_triggers`, `gap_decisions`); `retimed` applies
  it to any plan's swaps, at the hooked executor's points.

Every planner lists its decisions in the simulator's issue order (`in_issue_order`).
"""

from __future__ import annotations

import bisect
from dataclasses import replace

import numpy as np

from ...model import Decision, Trace
from .gaps import load_without
from .saved import first_backward_op

DEFAULT_LEAD = 1  # backward layers between a prefetch and the layer that needs it (HOME Fig. 4, vDNN)


def issue_key(gap) -> tuple[int, int]:
    """(back_before, storage) of a decision (or of any gap with those fields): the order the
    simulator issues the swap-outs and prefetches of one op in, its FIFO prefetch order."""
    return gap.back_before, gap.storage


def in_issue_order(decisions) -> tuple[Decision, ...]:
    """`decisions` sorted by `issue_key`: the order every planner lists its decisions in."""
    return tuple(sorted(decisions, key=issue_key))


def backward_layer_starts(trace: Trace) -> tuple[int, ...]:
    """First op of every backward layer (`Trace.layers`), ascending."""
    return tuple(sorted(layer.ops[0] for layer in trace.layers if layer.phase == "backward"))


def lead_trigger(starts, out_after: int, back_before: int, lead: int = DEFAULT_LEAD) -> int:
    """The prefetch op of a storage away over (out_after, back_before): the start of the backward
    layer `lead` layers before the one holding `back_before` (`starts`: `backward_layer_starts`),
    kept inside the gap; `back_before` itself without such a layer."""
    here = bisect.bisect_right(starts, back_before) - 1  # the backward layer holding back_before
    op = starts[here - lead] if here - lead >= 0 else back_before
    return int(min(max(op, out_after + 1), back_before))


def prefetch_triggers(trace: Trace, swaps, load: np.ndarray, cap: int) -> list[int]:
    """Paper 002 §4.5: prefetch the earliest reused absent storage first, each as soon as it fits.

    Swaps are issued in order of next use (one FIFO host-to-device engine); each is
    issued at the first backward op, not before the previous one's, from which holding
    its bytes until its use keeps the load within `cap`. A swap across the iteration
    boundary (a weight or optimizer state: back_before <= out_after) is prefetched in the
    head of the next iteration, from its first op on.

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
        lo = min(back, max(out_after + 1, earliest, previous) if back > out_after else previous)
        over = np.flatnonzero(load[lo:back] + size > cap)
        trigger = lo + int(over[-1]) + 1 if over.size else lo
        load[trigger:back] += size
        triggers.append(trigger)
        previous = trigger
    return triggers


def retimed(trace: Trace, decisions, cap: int, points: np.ndarray | None = None) -> tuple[Decision, ...]:
    """`decisions` with every swap's prefetch issued again by §4.5 (`prefetch_triggers`): in order of
    need, each as soon as it fits under `cap`, and onto the first hook point at or after that op
    (`points`: the first point at or after each op, `HookSites.after_of`; None: any op), where the
    hooked executor issues it (lowered to the last point before it, a prefetch may land before a peak
    it should wait out). A swap across the iteration boundary holds its bytes from its swap-out to
    the step's end in that load: its copy out (a large optimizer state's, after its update) outlasts
    the rest of the step, and the bytes are freed only when it is done. Other decisions are kept."""
    swaps = [(d.storage, d.out_after, d.back_before) for d in decisions if d.action == "swap"]
    if not swaps:
        return tuple(decisions)
    load = load_without(trace, [(d.storage, d.out_after, d.back_before) for d in decisions])
    for sid, out_after, back in swaps:
        if back <= out_after:
            load[out_after + 1:] += trace.nbytes[sid]
    order = sorted(set(swaps), key=lambda g: (g[2], g[0]))
    trigger = dict(zip(order, prefetch_triggers(trace, order, load, cap)))
    if points is not None:
        trigger = {g: _at_point(points, t, g[2]) for g, t in trigger.items()}
    return in_issue_order(replace(d, trigger=trigger[d.storage, d.out_after, d.back_before]) if d.action == "swap"
                          else d for d in decisions)


def _at_point(points: np.ndarray, trigger: int, back_before: int) -> int:
    """`trigger` moved onto the first point at or after it, where that is still no later than the op
    that needs the storage (else left where it is)."""
    later = int(points[trigger])
    return later if later <= back_before else trigger


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
    return in_issue_order(out)
