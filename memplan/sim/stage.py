"""The simulate stage: a Problem (or a trace priced on a profile) and a plan in, a SimResult out.

`simulate` is `memplan.simulate`; the simulator it runs is the problem's own
(memplan.sim.simulate.simulator_of), so simulating a plan the planner has simulated prepares
nothing again. The semantics are memplan.sim.simulate's.
"""

from __future__ import annotations

from dataclasses import replace

from ..budget import NO_LIMIT, Budget, budget_given, budget_in_force, limited
from ..cost.model import Cost
from ..cost.profiles import DeviceProfile, profile_from_json
from ..errors import MemplanError
from ..model import Plan, Trace, check_plan, expect_trace
from ..problem import DEFAULT_PROFILE, Problem, cost_of
from .result import SimResult
from .simulate import simulator_of


def simulate(source: Problem | Trace, plan: Plan | None = None, profile: str | DeviceProfile | None = None,
             budget: Budget | str | int | float | None = None, cost: Cost | None = None,
             timeline: bool = False) -> SimResult:
    """Simulate one iteration under `plan` and `budget`.

    Args:
        source: the Problem (its trace, costs and cap), or the traced iteration alone.
        plan: the plan (checked to belong to the trace); None keeps everything resident.
        profile: with a trace, the cost model's profile, a name, file or DeviceProfile (ignored when
            `cost` is given); None: the profile the plan was made for, else DEFAULT_PROFILE.
        budget: None: the plan's own budget (else the problem's cap; no cap without either); "none":
            no cap; else bytes, "8GiB", "60%" or a share in (0, 1].
        cost: with a trace, precomputed durations for it.
        timeline: also return the load timeline, op start times and stream lanes.
    Returns:
        The SimResult; its `budget_bytes` and `budget_source` say which cap was used.
    Raises:
        PlanMismatchError: the plan is for another trace or names what it does not have.
        MemplanError: a bad budget, or a profile or cost given with a Problem (it has its own).
    """
    problem = problem_of(source, plan, profile, cost)
    trace = problem.trace
    if plan is not None:
        check_plan(trace, plan)
    own = NO_LIMIT if plan is None else plan.budget_bytes
    given = budget_given(budget)
    if given is None and not limited(own) and problem.limited:
        given = Budget.of_bytes(problem.budget_bytes)
    budget_bytes, source_of_cap = budget_in_force(given, own, trace.peak_load_bytes)
    result = simulator_of(problem).run(plan, budget_bytes, timeline=timeline)
    return replace(result, budget_bytes=budget_bytes, budget_source=source_of_cap)


def problem_of(source: Problem | Trace, plan: Plan | None, profile, cost: Cost | None = None,
               stage: str = "simulate") -> Problem:
    """The problem `simulate` and `memplan.compile` work on: `source`, or a trace priced by `plan_cost`.

    Raises:
        MemplanError: a profile or cost given with a Problem (it has its own), or `source` is neither.
    """
    if isinstance(source, Problem):
        if profile is not None or cost is not None:
            raise MemplanError("a Problem has its own costs: give profile or cost with a trace only")
        return source
    expect_trace(source, stage)
    return Problem(source, plan_cost(source, plan, profile, cost))


def plan_cost(trace: Trace, plan: Plan | None, profile: str | DeviceProfile | None = None,
              cost: Cost | None = None) -> Cost:
    """What `plan` is timed on: `cost` when given, else `trace` priced on the profile
    `simulation_profile` picks (the one given, else the plan's own, else DEFAULT_PROFILE).

    Raises:
        MemplanError: the plan's recorded profile is damaged; UnknownNameError: an unknown profile.
    """
    if cost is not None:
        return cost
    return cost_of(trace, simulation_profile(plan, profile)[0])


def simulation_profile(plan: Plan | None, profile: str | DeviceProfile | None) -> tuple[str | DeviceProfile, str]:
    """(profile, where it came from: "given", "plan" or "default") for `simulate`: `profile`,
    else the profile the plan was made for, else DEFAULT_PROFILE.

    Raises:
        MemplanError: the plan's recorded profile is damaged.
    """
    if profile is not None:
        return profile, "given"
    if plan is not None and plan.profile:
        return profile_from_json(plan.profile, "the plan's device profile"), "plan"
    return DEFAULT_PROFILE, "default"


