"""`dtr`: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021) as a peer planner.

DTR is an online rematerializer: it runs the program under a memory cap and, when an
allocation does not fit, evicts the activation with the smallest h_DTR = cost / (size x
staleness), rematerializing an evicted tensor when it is used again
(`memplan.planners.dtr.eviction` has the policy). Replayed over the trace with the cost
model's op times, its evictions become an ordinary plan of recompute decisions that the
validator checks, the simulator times and the executor runs.

DTR's own bookkeeping counts what is resident, not the transient memory of a replay (a
replayed op's discarded outputs, inputs rebuilt along the way), so its plan at cap c can
need more than c in the simulator. The planner therefore runs DTR at the budget and,
while the simulator does not fit the plan under the budget, again at lower caps (a fixed
grid of shares of the trace's peak, at most MAX_TRIES runs). Evictions whose replay cannot run (an input gone
or overwritten by then: `memplan.planners.kit.replayable`) are kept instead.
Where the first plan that fits runs interpreted (DTR frees between the hooks' points or evicts what
no hook takes away), a few lower caps are tried for one that fits at the hooks, the faster kept.
"""

from __future__ import annotations

import time

from ...cost.model import Cost
from ...model import Decision, Plan, Trace
from ...model.program import INTERPRETED
from ...problem import Problem
from ...sim.simulate import Simulator, simulator_of
from ...sim.validate import static_load
from ..base import infeasible, register
from ..kit.prefetch import in_issue_order
from ..kit.replayable import replayable
from .eviction import DtrRun

MAX_TRIES = 10  # DTR runs (the budget, then lower caps) before the budget counts as out of reach
GRID_STEP = 0.025  # the lower caps: multiples of this share of the trace's peak
HOOKED_TRIES = 3  # caps tried below an interpreted plan for one that runs at the hooks
NAMING_CAPS = 3  # caps tried per load while searching the smallest feasible load an infeasible budget names


@register("dtr", "Dynamic Tensor Rematerialization (ICLR'21): greedy online eviction by h_DTR = cost / "
                 "(size x staleness), rematerialized on access", decides=("recompute",))
def plan_dtr(problem: Problem) -> Plan:
    """DTR's evictions under `budget_bytes`, as recompute decisions.

    Args:
        problem: the trace, its cap and its costs (memplan.problem; DTR is deterministic: no seed).
    Raises:
        InfeasibleBudgetError: no DTR run fits under the budget; names a load at which it does.
    """
    trace, budget_bytes, cost = problem.trace, problem.budget_bytes, problem.cost
    if budget_bytes >= trace.peak_load_bytes:
        return Plan()
    simulator = simulator_of(problem)
    found = _fitting(trace, cost, simulator, budget_bytes)
    if found is not None:
        return found
    raise infeasible(budget_bytes, _feasible_load(trace, cost, simulator, budget_bytes), "dtr")


def dtr_within(trace: Trace, cost: Cost, simulator: Simulator, budget_bytes: int, deadline: float) -> Plan | None:
    """`dtr`'s plan, trying no cap after `deadline` (time.monotonic()); None where it finds none by then
    (without naming the load it would reach: that search is what makes DTR slow to refuse a budget)."""
    return _fitting(trace, cost, simulator, budget_bytes, deadline=deadline)


def dtr_decisions(trace: Trace, cost: Cost, cap_bytes: int) -> tuple[Decision, ...]:
    """The replayable recompute decisions of one DTR run at `cap_bytes`."""
    gaps = DtrRun(trace, cost.durations, cap_bytes).gaps()
    decisions = [Decision(storage=s, action="recompute", out_after=o, back_before=b) for s, o, b in gaps]
    return in_issue_order(replayable(trace, decisions))


def _caps(budget: int, peak: int) -> list[int]:
    """The caps DTR runs at for `budget`: the budget, then a grid of shares of the trace's peak below it.

    The grid does not depend on the budget, so a plan found for one budget comes from a cap
    that a higher budget tries too (what makes the load an infeasible budget names plannable).
    """
    step = max(1, int(peak * GRID_STEP))
    below = [peak - k * step for k in range(1, int(1 / GRID_STEP) + 1) if 0 < peak - k * step < budget]
    return [budget] + below[:MAX_TRIES - 1]


def _fitting(trace: Trace, cost: Cost, simulator: Simulator, budget: int, tries: int = MAX_TRIES,
             deadline: float | None = None) -> Plan | None:
    """The first DTR plan over the first `tries` of `_caps` that fits `budget` (trying no cap after
    `deadline`, a time.monotonic() value), or None. Where that plan runs interpreted (DTR frees
    between the hooks' points or evicts what no hook can take away), a lower cap's plan may fit at
    the hooks: the faster of the first and the first hooked one within HOOKED_TRIES more caps."""
    first, left = None, HOOKED_TRIES
    for cap in _caps(budget, trace.peak_load_bytes)[:tries]:
        if (deadline is not None and time.monotonic() >= deadline) or (first is not None and left == 0):
            break  # out of time, or HOOKED_TRIES caps tried past an interpreted plan
        plan = Plan(decisions=dtr_decisions(trace, cost, cap))
        result = simulator.run(plan, budget)
        if first is not None:
            left -= 1
        if not result.feasible or static_load(trace, plan.decisions).max() > budget:
            continue
        if result.level != INTERPRETED:
            return plan if first is None or result.time_s < first[0] else first[1]
        first = first or (result.time_s, plan)
    return first[1] if first else None


def _feasible_load(trace: Trace, cost: Cost, simulator: Simulator, budget: int) -> int:
    """A load above `budget` at which this planner returns a plan (its promise when refusing `budget`).

    DTR's plans do not change monotonically with the cap, so loads are scanned upward from
    the budget in steps of the grid (GRID_STEP of the peak); a load counts when DTR at its first
    NAMING_CAPS caps fits it, which the planner, trying the same caps first, then finds too.
    The trace's own peak (nothing evicted) always does.
    """
    peak = trace.peak_load_bytes
    step = max(1, int(peak * GRID_STEP))
    for load in range(budget + step, peak, step):
        if _fitting(trace, cost, simulator, load, NAMING_CAPS) is not None:
            return load
    return peak
