"""What `milp` returns around the MILP's plan: never slower than the plans it could fall back on
(the fast planners', each improved by local search in the simulator, so fitted to the level it
runs at), and with the lower bound of every plan (`memplan.planners.bound`) and its gap to it."""

from __future__ import annotations

import math
import time

from ...cost.model import Cost
from ...errors import InfeasibleBudgetError
from ...model import Decision, Plan, Trace
from ...problem import Problem
from ...sim.simulate import Simulator
from ...sim.validate import validate
from ..dtr import dtr_within
from ..bound import Bound
from ..kit.candidates import DEFAULT_MIN_BYTES
from ..kit.cover import largest_first
from ..kit.fitting import fitting_plans
from ..kit.polish import Polisher

START_PLANNERS = ("autoswap:doa", "autoswap:swdoa", "capuchin", "tflms")  # the decomposition starts from their best
FALLBACK_DTR_S = 5.0  # DTR's search for a plan within the budget, among the fallbacks when HiGHS proved nothing
# and autoswap:bo's, with this time limit (its four pure scores whatever the limit), where milp's own
# time limit is at least as long (a shorter one is the user asking for a quick answer; and Optuna's
# sampler imports torch, which a command that does not train must not load)
FALLBACK_BO_S = 10.0
POLISH_S = 10.0  # the fallback's local search from each of those plans, all of them together (at a local
# optimum sooner: under a second on resnet18-cifar@128, where it took the best of them from 111% to 46%);
# the decomposition's start is not polished (that time is the solver's)


def fast_start(trace: Trace, budget_bytes: int, cost: Cost, simulator: Simulator, dtr_s: float = 0.0,
               bo_s: float = 0.0, polish_s: float = 0.0) -> tuple[Decision, ...] | None:
    """The decisions of the fitting plan of least simulated time among START_PLANNERS', the largest
    storages first (`memplan.planners.kit.cover`) and, with `dtr_s` and `bo_s`, DTR's (its caps
    tried within that many seconds) and autoswap:bo's (with that time limit), with `polish_s` each
    polished by the local search (`memplan.planners.kit.polish`, that many seconds in all); None when
    none fits."""
    problem = Problem(trace, cost, budget_bytes)
    plans = fitting_plans(problem, START_PLANNERS, simulator)
    decisions = largest_first(trace, budget_bytes, DEFAULT_MIN_BYTES)
    few = None if decisions is None else Plan(decisions=decisions)
    if few is not None and math.isfinite(_time_s(simulator, few, budget_bytes)) and not validate(trace, few,
                                                                                               budget_bytes):
        plans.append(few)
    if bo_s > 0:
        plans += fitting_plans(problem, ("autoswap:bo",), simulator, time_limit_s=bo_s)
    if dtr_s > 0:
        found = dtr_within(trace, cost, simulator, budget_bytes, time.monotonic() + dtr_s)
        plans += [found] if found is not None and not validate(trace, found, budget_bytes) else []
    if not plans:
        return None
    polisher = Polisher.of(trace, cost, budget_bytes, simulator, DEFAULT_MIN_BYTES) if polish_s > 0 else None
    if polisher is not None:
        plans = [polisher.polish(p, time.monotonic() + polish_s / len(plans)) for p in plans]
    return min(plans, key=lambda p: simulator.run(p, budget_bytes).time_s).decisions


def never_worse(trace: Trace, budget_bytes: int, cost: Cost, plan: Plan, start: tuple[Decision, ...] | None,
                fallback_s: float | None) -> Plan:
    """`plan`, or the given start or (when HiGHS proved nothing and `fallback_s` is given) the best plan of
    the fast planners, DTR and autoswap:bo, polished (the last two within FALLBACK_DTR_S and FALLBACK_BO_S,
    no longer than `fallback_s`, milp's time limit) when one of them simulates faster within the budget and
    validates; `chosen` in the report says which."""
    report = dict(plan.report or {})
    if report.get("status") == "optimal" and not start:
        return plan
    simulator = Simulator(trace, cost)
    named = [(report.get("chosen", "the MILP's plan"), plan)]
    if start:
        named.append(("the given start", Plan(decisions=tuple(start))))
    if report.get("status") != "optimal" and fallback_s is not None:
        fast = _fallback(trace, budget_bytes, cost, simulator, fallback_s)
        if fast is not None:
            named.append(("the best plan of the fast planners, DTR and autoswap:bo", Plan(decisions=fast)))
    best_name, best, best_s = named[0][0], plan, _time_s(simulator, plan, budget_bytes)
    for name, other in named[1:]:
        other_s = _time_s(simulator, other, budget_bytes)
        if other_s < best_s and not validate(trace, other, budget_bytes):
            best_name, best, best_s = name, other, other_s
    if best is plan:
        return plan
    report.update(chosen=best_name, simulated_overhead=simulator.run(best, budget_bytes).overhead)
    return best.with_meta(report=report)


def below_the_floor(trace: Trace, budget_bytes: int, cost: Cost, time_limit_s: float,
                    refused: InfeasibleBudgetError) -> Plan:
    """Under a budget below the floor of milp's model (its units leave out small storages, and on a
    large trace all but saved activations), the best plan of the fast planners, DTR and autoswap:bo
    (as `never_worse` tries them) when one fits; else `refused` is raised."""
    simulator = Simulator(trace, cost)
    fast = _fallback(trace, budget_bytes, cost, simulator, time_limit_s)
    if fast is None:
        raise refused
    plan = Plan(decisions=fast)
    return plan.with_meta(report={"status": "below the model's floor", "floor_bytes": refused.min_feasible_bytes,
                                  "chosen": "the best plan of the fast planners, DTR and autoswap:bo",
                                  "simulated_overhead": simulator.run(plan, budget_bytes).overhead})


def with_bound(plan: Plan, bound: Bound) -> Plan:
    """`plan` with the bound's entries in its report and `gap`: its simulated overhead minus the bound."""
    report = {**(plan.report or {}), **bound.report()}
    overhead = report.get("simulated_overhead")
    finite = bound.overhead is not None and math.isfinite(bound.overhead)
    report["gap"] = overhead - bound.overhead if finite and overhead is not None else None
    return plan.with_meta(report=report)


def _fallback(trace: Trace, budget_bytes: int, cost: Cost, simulator: Simulator,
              time_limit_s: float) -> tuple[Decision, ...] | None:
    """`fast_start` with DTR and autoswap:bo, within FALLBACK_DTR_S and FALLBACK_BO_S and no longer
    than milp's `time_limit_s`, each plan polished (POLISH_S, no longer than that limit either)."""
    return fast_start(trace, budget_bytes, cost, simulator, dtr_s=min(FALLBACK_DTR_S, time_limit_s),
                      bo_s=FALLBACK_BO_S if time_limit_s >= FALLBACK_BO_S else 0.0,
                      polish_s=min(POLISH_S, time_limit_s))


def _time_s(simulator: Simulator, plan: Plan, budget_bytes: int) -> float:
    result = simulator.run(plan, budget_bytes)
    return result.time_s if result.feasible and result.peak_load_bytes <= budget_bytes else float("inf")
