"""Whether a plan fits a budget in the simulator, and the smallest budget it fits: the load a planner
names when it refuses a budget (`memplan.planners.base.infeasible`), and the plans of other
planners that fit, for the planners that start from them.
"""

from __future__ import annotations

from ...errors import InfeasibleBudgetError
from ...model import Plan
from ...problem import Problem
from ...sim.simulate import Simulator
from ..base import get_planner, planned_at

MAX_BISECTIONS = 24  # simulator runs of one smallest-budget search after the first two


def smallest_fitting_budget(simulator: Simulator, plan: Plan, lowest: int, *, resolution_share: float = 0.0) -> int:
    """The smallest budget from `lowest` up under which the simulator runs `plan`.

    `lowest` itself when the plan runs there; else a bisection between `lowest` and the plan's
    peak without a cap (where it always runs), to one byte or `resolution_share` of that peak,
    in at most MAX_BISECTIONS runs; its upper end, which the plan fits.

    Args:
        simulator: the trace's simulator.
        plan: the plan.
        lowest: the least budget worth trying (the budget refused, or a lower bound such as the
            plan's static load).
        resolution_share: how closely to bracket the answer, as a share of the peak (0: one byte).
    """
    if simulator.run(plan, lowest).feasible:
        return lowest
    lo, hi = lowest, max(simulator.run(plan).peak_load_bytes, lowest + 1)
    resolution = max(1, int(hi * resolution_share))
    for _ in range(MAX_BISECTIONS):
        if hi - lo <= resolution:
            break
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if simulator.run(plan, mid).feasible else (mid, hi)
    return hi


def fitting_plans(problem: Problem, planners, simulator: Simulator, **params) -> list[Plan]:
    """The plans (seed 0; their defaults, and `params`) of the named planners that the simulator runs
    within the problem's cap, in the order named, each as `memplan.plan` makes it (planned again where
    its hooked form misses the budget: raw, it would run interpreted); a planner refusing the budget
    gives none."""
    out, budget_bytes = [], problem.budget_bytes
    for name in planners:
        spec = get_planner(name)
        try:
            plan = planned_at(spec, problem.with_seed(0), dict(params))
        except InfeasibleBudgetError:
            continue
        result = simulator.run(plan, budget_bytes)
        if result.feasible and result.peak_load_bytes <= budget_bytes:
            out.append(plan)
    return out
