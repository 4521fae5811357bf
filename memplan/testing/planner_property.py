"""The property every registered planner keeps on every trace, at every budget (issue 19).

`check_planner(trace, planner, budget)` plans and checks one case. The planner must either

- return a plan that the independent validator accepts (budget included) and whose
  simulated peak (`memplan.sim.simulate.simulate(trace, plan)`, capped by the plan's own
  budget) fits that budget, or
- raise `InfeasibleBudgetError` for exactly that budget, naming a smallest feasible load
  above it, at which the same planner does return such a plan (the load a user is told
  to ask for plans), or
- for a trace without ops (a minimalloc pool problem), raise `NeedsOpsError` when it
  decides swaps, recomputes or micro-batches (`PlannerSpec.needs_ops`).

Anything else (an invalid plan, a plan over its budget, another exception) is a planner
bug: an invalid plan fails an assertion, another exception propagates with its traceback.

`FAST_PARAMS` keeps slow planners fast in property tests (a planner without an entry runs
with its defaults), so a planner registered later is covered without editing anything.
"""

from __future__ import annotations

from ..budget import parse_budget
from ..cost.model import Cost
from ..errors import InfeasibleBudgetError, NeedsOpsError
from ..model import Plan, Trace
from ..planners.base import get_planner, known_planners, plan
from ..problem import cost_of
from ..sim.stage import simulate
from ..sim.validate import validate

POOL_LIMIT_S = 0.2  # time limit of a pool search in property tests: small traces, any valid layout will do
BO_TRIALS = 4  # AutoSwap's Bayesian optimisation: only the four pure scores, no sampled weights
AUTO_LIMIT_S = 5.0  # auto's time limit in property tests: generated traces are small, every step finishes
FAST_PARAMS: dict[str, dict] = {
    "smartpool": {"time_limit_s": POOL_LIMIT_S},
    "auto": {"time_limit_s": AUTO_LIMIT_S},
    "autoswap:bo": {"n_trials": BO_TRIALS},
}
# Compositions X+Y (not registered names) the property is checked on besides every registered planner.
COMPOSED = ("autoswap:doa+smartpool", "capuchin+smartpool", "dtr+smartpool", "sqrt-n+smartpool-bestfit")
PLANNED, INFEASIBLE, REFUSED = "planned", "infeasible", "refused"  # the outcomes that keep the property


def fast_params(planner: str) -> dict:
    """The parameters property tests pass to `planner` ({} for a planner without an entry); a
    composition `X+Y` gets X's, and Y's under the names the composition gives them."""
    base, sep, other = planner.rpartition("+")
    if not sep or planner in known_planners():
        return dict(FAST_PARAMS.get(planner, {}))
    prefix = "pool_" if get_planner(other).decides == {"pool"} else ""
    return {**fast_params(base), **{prefix + k: v for k, v in fast_params(other).items()}}


def check_planner(trace: Trace, planner: str, budget, *, cost: Cost | None = None, seed: int = 0,
                  named_load_plans: bool = True) -> str:
    """Plan `trace` at `budget` with `planner` and check the property (module docstring).

    Args:
        trace: any trace (traced, generated or imported).
        planner: a registered planner name; it runs with `fast_params(planner)`.
        budget: what `memplan.planners.base.plan` takes ("60%", bytes).
        cost: the trace's cost model (default: the h100 profile).
        seed: the planner's seed.
        named_load_plans: on InfeasibleBudgetError, also plan at the load the error names
            and require a plan that keeps the property there.
    Returns:
        PLANNED, INFEASIBLE or REFUSED.
    Raises:
        AssertionError: the property is broken (the message says how).
        Exception: whatever the planner raised besides the documented errors.
    """
    cost = cost_of(trace, cost=cost)
    budget_bytes = parse_budget(budget).bytes_for(trace.peak_load_bytes)
    try:
        result = plan(trace, budget, planner=planner, cost=cost, seed=seed, simulate_result=False,
                      **fast_params(planner))
    except InfeasibleBudgetError as exc:
        assert exc.budget_bytes == budget_bytes, f"{planner}: infeasible names budget {exc.budget_bytes}, " \
                                                 f"asked {budget_bytes}"
        assert exc.min_feasible_bytes > budget_bytes, f"{planner} at {budget}: {exc}"
        if named_load_plans:
            again = check_planner(trace, planner, exc.min_feasible_bytes, cost=cost, seed=seed,
                                  named_load_plans=False)
            assert again == PLANNED, f"{planner} at {budget}: the load its error names does not plan: {exc}"
        return INFEASIBLE
    except NeedsOpsError:
        assert not trace.ops and get_planner(planner).needs_ops, f"{planner} refused a trace with ops"
        return REFUSED
    _check_plan(trace, planner, budget, budget_bytes, result, cost)
    return PLANNED


def _check_plan(trace: Trace, planner: str, budget, budget_bytes: int, result: Plan, cost: Cost) -> None:
    assert result.budget_bytes == budget_bytes, f"{planner}: the plan records budget {result.budget_bytes}"
    violations = validate(trace, result)
    assert violations == [], f"{planner} at {budget}: invalid plan: {[str(v) for v in violations[:5]]}"
    sim = simulate(trace, result, cost=cost)
    assert sim.feasible, f"{planner} at {budget}: the simulation is infeasible at op {sim.infeasible_op} " \
                         f"(short by {sim.shortfall_bytes} bytes)"
    assert sim.peak_load_bytes <= budget_bytes, f"{planner} at {budget}: simulated peak {sim.peak_load_bytes} " \
                                                f"over the budget {budget_bytes}"
