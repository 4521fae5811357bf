"""TFLMS-like baseline (Le et al. 2018, as paper 002 compares with it): swap the N largest saved activations.

TFLMS rewrites the graph to swap a number of tensors the user chooses. Here the `count`
largest saved activations leave after their last forward use and are prefetched in
backward in the order of paper 002 §4.5, never above the plan's own peak
(`memplan.planners.kit.prefetch`). Without `count`, the smallest count whose plan fits
the budget is used.
"""

from __future__ import annotations

from ..model import Plan, Trace
from ..problem import Problem
from ..sim.simulate import simulator_of
from .base import infeasible, register
from .kit.fitting import smallest_fitting_budget
from .kit.gaps import load_without
from .kit.prefetch import gap_decisions
from .kit.saved import saved_gaps


@register("tflms", "TFLMS-like (paper 002's baseline): swap the `count` largest saved activations",
          decides=("swap",))
def plan_tflms(problem: Problem, *, count: int | None = None,
               min_bytes: int = 0) -> Plan:
    """Swap the `count` largest saved activations (of at least `min_bytes`).

    Args:
        count: how many to swap; default: the fewest whose plan fits the budget.
        min_bytes: smallest activation considered.
    Raises:
        InfeasibleBudgetError: the plan (with every candidate, when `count` is not given)
            needs more than the budget; names what it needs.
    """
    trace, budget_bytes, cost = problem.trace, problem.budget_bytes, problem.cost
    gaps = sorted(saved_gaps(trace, min_bytes), key=lambda g: (-g.nbytes, g.storage))
    triples = [(g.storage, g.last_forward, g.back_before) for g in gaps]
    if count is None:
        count = _fewest(trace, triples, budget_bytes)
    chosen = triples[:count]
    plan = Plan(decisions=gap_decisions(trace, chosen, []))
    needed = smallest_fitting_budget(simulator_of(problem), plan, int(load_without(trace, chosen).max()))
    if needed > budget_bytes:
        raise infeasible(budget_bytes, needed, "tflms")
    return plan


def _fewest(trace: Trace, triples: list, budget_bytes: int) -> int:
    """The fewest leading triples whose load with them away fits the budget (all of them when none does)."""
    lo, hi = 0, len(triples)
    while lo < hi:
        mid = (lo + hi) // 2
        if load_without(trace, triples[:mid]).max() <= budget_bytes:
            hi = mid
        else:
            lo = mid + 1
    return lo
