"""AutoSwap selection (§IV-D), load_min (§VI-B1) and swap scheduling (§IV-E).

Selection walks the candidates in priority order, taking each one off the load curve
over its gap, until the peak is within the budget. The load used here is the paper's
LOAD': a storage is counted absent from the op after its swap-out access to the op of
its next access. Scheduling then turns each chosen gap into a Decision whose prefetch
trigger lands the swap-in just in time on the FIFO host-to-device engine, moved later
where an early prefetch would push the planned load over the budget (Fig. 7: a swap-in
starts only after enough memory is free).
"""

from __future__ import annotations

import numpy as np

from ...cost.model import Cost
from ...model import Decision, Trace
from ..kit.candidates import Candidates
from ..kit.gaps import away_mask, load_without
from ..kit.ops import op_starts


def load_min(trace: Trace, cand: Candidates) -> int:
    """The lowest peak reachable by swapping every gap of `cand` once (§VI-B1): LOAD' with all of them away."""
    gaps = zip(cand.storage.tolist(), cand.out_after.tolist(), cand.back_before.tolist())
    return int(load_without(trace, gaps).max()) if trace.ops else 0


def priority_order(priority: np.ndarray, primary: np.ndarray) -> np.ndarray:
    """Candidate indices by descending priority, primary candidates before multi-swap extras.

    Ties keep candidate order, so equal scores give the same plan every time.
    """
    index = np.arange(len(priority))
    return np.lexsort((index, -priority, ~primary))


def select(load: np.ndarray, cand: Candidates, order: np.ndarray, budget_bytes: int) -> tuple[list[int], np.ndarray]:
    """Greedy selection of §IV-D.

    Args:
        load: the original load per op.
        cand: the candidates.
        order: candidate indices, highest priority first.
        budget_bytes: the memory load limit.
    Returns:
        (chosen candidate indices in selection order, the load with them swapped). The
        list holds every candidate when even that does not reach the budget.
    """
    current = load.astype(np.int64).copy()
    chosen: list[int] = []
    n = len(load)
    if current.max(initial=0) <= budget_bytes:
        return chosen, current
    for i in order:
        current[away_mask(n, int(cand.out_after[i]), int(cand.back_before[i]))] -= cand.nbytes[i]
        chosen.append(int(i))
        if current.max() <= budget_bytes:
            break
    return chosen, current


def _unrolled_need(cand: Candidates, n_ops: int) -> np.ndarray:
    """Next-access op on a two-iteration axis: a wrap-around gap's access is in the next one."""
    return np.where(cand.wraps, cand.back_before + n_ops, cand.back_before)


def just_in_time_triggers(cand: Candidates, cost: Cost) -> np.ndarray:
    """Prefetch trigger ops that land each swap-in just before its next access.

    Swap-ins run one after another on the host-to-device engine in order of their next
    access; walking that order backwards, each must finish before its access and before
    the next one in the queue starts. The trigger is the last op starting no later than
    that start time, and after the swap-out access. Times are on a two-iteration axis, so
    a cross-iteration prefetch may be issued in the tail of the iteration before (the
    simulator's steady state), or in the head of its own.

    Returns:
        Trigger per candidate on the two-iteration axis (op index, plus n_ops when it
        lies in the next iteration's head).
    """
    n = len(cost.durations)
    starts = op_starts(cost)
    starts2 = np.concatenate([starts[:-1], starts[-1] + starts[:-1]])
    need = _unrolled_need(cand, n)
    deadline = starts2[need]
    order = np.lexsort((cand.storage, deadline))
    start = np.empty(len(cand), dtype=np.float64)
    next_start = np.inf
    for i in order[::-1]:
        next_start = min(deadline[i], next_start) - cost.h2d_s(int(cand.nbytes[i]))
        start[i] = next_start
    trigger = np.searchsorted(starts2, start, side="right") - 1
    return np.clip(trigger, cand.out_after + 1, need)


def fit_triggers(planned: np.ndarray, cand: Candidates, trigger: np.ndarray, budget_bytes: int) -> np.ndarray:
    """Move prefetch triggers later until the planned load stays within the budget.

    Args:
        planned: the load with every chosen gap away for its whole length (LOAD').
        cand: the chosen gaps.
        trigger: their just-in-time triggers on the two-iteration axis.
        budget_bytes: the memory load limit.
    Returns:
        Op indices of the triggers (in (out_after, back_before], wrapping around), each
        at or after its just-in-time op and non-decreasing in order of next access (the
        FIFO issue order). A prefetch that arrives early holds memory from its trigger to
        its access; the latest-needed prefetches give way first.
    """
    n = len(planned)
    trigger = trigger.copy()
    need = _unrolled_need(cand, n)
    early = np.zeros(n, dtype=np.int64)
    for t, b, size in zip(trigger, need, cand.nbytes):
        np.add.at(early, np.arange(t, b) % n, size)
    by_need = np.lexsort((cand.storage, need))
    for i in by_need[::-1]:
        ops = np.arange(trigger[i], need[i]) % n
        over = np.nonzero(planned[ops] + early[ops] > budget_bytes)[0]
        if len(over):
            np.subtract.at(early, ops[:over[-1] + 1], cand.nbytes[i])
            trigger[i] += over[-1] + 1
    return np.maximum.accumulate(trigger[by_need])[np.argsort(by_need)] % n


def decisions(cand: Candidates, trigger: np.ndarray) -> tuple[Decision, ...]:
    """Swap decisions for the chosen gaps, in order of next access."""
    order = np.lexsort((cand.storage, cand.back_before, cand.wraps))
    return tuple(Decision(storage=int(cand.storage[i]), action="swap", out_after=int(cand.out_after[i]),
                          back_before=int(cand.back_before[i]), trigger=int(trigger[i])) for i in order)
