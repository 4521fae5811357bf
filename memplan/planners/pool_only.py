"""Planners that decide only the pool: `smartpool`, `smartpool-bestfit`, `smartpool-firstfit`.

They keep every storage resident (no swaps) and lay all buffers out in one offline-planned
pool. `X+smartpool` lays the pool out over any swap or recompute planner X's plan
(`memplan.planners.base.compositions.compose_pool`).
"""

from __future__ import annotations

from .base import infeasible, register
from ..model import Plan
from ..pool.api import DEFAULT_TIME_LIMIT_S, layout
from ..problem import Problem


def _pool_plan(problem: Problem, *, allocator, time_limit_s=DEFAULT_TIME_LIMIT_S) -> Plan:
    # The layout does not depend on the budget, so its footprint (at least the peak load,
    # more where the allocator fragments) is the smallest load this planner fits: a budget
    # under the peak is refused with that footprint, not the peak, so that the load the
    # error names does plan. A footprint over a budget above the peak is refused by
    # `memplan.planners.base.plan`, which knows whether a budget was asked for at all.
    trace, budget_bytes = problem.trace, problem.budget_bytes
    result = layout(trace, None, allocator=allocator, time_limit_s=time_limit_s, seed=problem.seed, cost=problem.cost)
    if budget_bytes < trace.peak_load_bytes:
        raise infeasible(budget_bytes, max(result.footprint_bytes, trace.peak_load_bytes), allocator)
    return Plan(pool=result.slots, pool_bytes=result.footprint_bytes)


@register("smartpool", "offline pool: orderings portfolio + exact search (beyond paper 000)", decides=("pool",),
          allocator="smartpool")
def smartpool_planner(problem: Problem, *, allocator="smartpool",
                      time_limit_s: float = DEFAULT_TIME_LIMIT_S) -> Plan:
    """Keep everything resident; lay buffers out with `smartpool` under `time_limit_s`."""
    return _pool_plan(problem, allocator=allocator, time_limit_s=time_limit_s)


@register("smartpool-bestfit", "offline pool, paper 000: size-descending best-fit", decides=("pool",),
          allocator="smartpool-bestfit")
@register("smartpool-firstfit", "offline pool, paper 000: size-descending first-fit", decides=("pool",),
          allocator="smartpool-firstfit")
def paper_pool_planner(problem: Problem, *, allocator="smartpool-bestfit") -> Plan:
    """Keep everything resident; lay buffers out with the paper's greedy."""
    return _pool_plan(problem, allocator=allocator)
