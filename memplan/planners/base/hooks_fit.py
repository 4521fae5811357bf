"""Plans that run at autograd's hooks: a plan whose hooked form misses its budget is planned again.

A planner decides at op granularity; the hooked executor acts only at saved-tensor packs and
unpacks and recomputes whole module calls (memplan.sim.lowering), which can hold a little more
memory than the plan assumed. Where that makes the hooked form miss the budget, the step would
run interpreted (a dispatch mode at every op: several times the host's work). So the planner
plans again under a load cut by the shortfall (twice as deep when the plan did not change), a
few times while that stays cheap, and the first plan whose hooked form fits is taken if it simulates
faster than the planner's own plan run interpreted; else that plan stands (on a device-bound step,
a dispatch mode's host work can cost less than the moves a smaller load needs: resnet50@256). A
recomputation no module call can run again (its hooked form would keep the storage) is swapped over
the same gap instead, in the first plan and in each planned again. A search that took half its time
limit or more is not planned again (each try would take as long again; `plan` checks it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from ...errors import InfeasibleBudgetError
from ...model import Plan
from ...problem import Problem
from ...sim.simulate import simulator_of

log = logging.getLogger(__name__)

MAX_TRIES = 6  # plans made again at most (dqn:pretrained on resnet18-cifar@16 at 80% fits at the fifth: a cut 3.7% deep)
TIME_FACTOR = 3.0  # ... and for at most this many times the first plan's planning time (plus a second)


def fit_hooked(plan_at, problem: Problem, first: Plan, first_s: float) -> Plan:
    """`first`, or a plan `plan_at(load)` made under a smaller load whose hooked form fits the budget.

    Args:
        plan_at: load -> the planner's plan there (raises InfeasibleBudgetError when it has none).
        first: the plan made under the problem's budget, which took `first_s` seconds.
    """
    budget_bytes = problem.budget_bytes
    sim = simulator_of(problem)
    result = sim.hooked(first, budget_bytes)
    if result is None or result.feasible:
        return first
    plan, load, cut, previous = swapped_where_dropped(first, sim), budget_bytes, 0, first.decisions
    started = time.perf_counter()
    for tries in range(MAX_TRIES + 1):
        result = sim.hooked(plan, budget_bytes)
        if result is None:
            break
        if result.feasible:
            own = sim.run(first, budget_bytes)
            if own.feasible and result.time_s >= own.time_s:
                break  # interpreted, the planner's own plan is the faster
            log.info("planned under %d bytes: its hooked form fits %d", load, budget_bytes)
            return plan
        if plan.decisions == previous:
            cut *= 2
        previous = plan.decisions
        cut = max(result.shortfall_bytes, 2 * cut if cut else 1)
        load -= cut
        if tries == MAX_TRIES or load <= 0 or time.perf_counter() - started > TIME_FACTOR * first_s + 1.0:
            break
        try:
            plan = swapped_where_dropped(plan_at(load), sim)
        except InfeasibleBudgetError:
            break
    return first


def swapped_where_dropped(plan: Plan, sim) -> Plan:
    """`plan` with each recomputation its hooked form drops (no module call can run it again: a root
    module's functional op made the storage) swapped over the same gap instead, which a saved-tensor
    hook can run; `plan` itself where none is dropped."""
    lowered = sim.lower(plan.decisions)
    if not lowered.dropped or lowered.kept is None:
        return plan
    kept = set(lowered.kept.tolist())
    swapped = tuple(replace(d, action="swap") if k not in kept and d.action == "recompute" else d
                    for k, d in enumerate(plan.decisions))
    return plan if swapped == plan.decisions else replace(plan, decisions=swapped)
