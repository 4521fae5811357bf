"""The conformance tests every registered planner passes.

Subclass `PlannerConformance` in a test module, name the subclass `Test...`, and set at
least `planner`; pytest collects it and runs every test below for that planner::

    from memplan.testing.conformance import PlannerConformance
    from memplan.testing.synthetic import chain_trace

    class TestMyPlanner(PlannerConformance):
        planner = "myplanner:variant"          # a registered name
        params = {"iterations": 20}            # hyper-parameters passed to memplan.planners.plan
        budgets = ["100%", "70%", "50%"]       # budgets tried on every trace
        traces = [lambda: chain_trace(6)]      # zero-arg trace factories (default: two chains)

Do not subclass anything else alongside it (it is a plain class, not a unittest.TestCase).
Each (trace, budget) plan is computed once per class and reused by all tests.

What is checked, for every trace and budget:
- the plan validates (`memplan.sim.validate.validate(trace, plan) == []`, budget included);
- the simulated peak load is within the budget and the simulation is feasible, or the
  planner raised `InfeasibleBudgetError` whose `min_feasible_bytes` exceeds the budget;
- the same seed gives the same plan (decisions, pool and micro-batches equal);
- the plan's metadata (planner, budget_bytes, trace_digest, seed) is filled in;
- budgets listed in `must_fit` (default "100%", the unconstrained peak) never raise.
"""

from __future__ import annotations

from typing import Callable, ClassVar

from ..budget import parse_budget
from ..cost.model import Cost
from ..errors import InfeasibleBudgetError
from ..model import Plan, Trace
from ..planners.base import plan as make_plan
from ..problem import DEFAULT_PROFILE, cost_of
from ..sim.stage import simulate
from ..sim.validate import validate
from .synthetic import MIB, chain_trace


def _uniform_chain() -> Trace:
    return chain_trace(6)


def _uneven_chain() -> Trace:
    return chain_trace(9, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(9)], param_bytes=2 * MIB)


class PlannerConformance:
    """Shared tests for one planner; set the class attributes in a `Test*` subclass."""

    planner: ClassVar[str] = "none"  # registered planner name
    params: ClassVar[dict] = {}  # hyper-parameters for memplan.planners.plan
    traces: ClassVar[list[Callable[[], Trace]]] = [_uniform_chain, _uneven_chain]  # trace factories
    budgets: ClassVar[list] = ["100%", "80%", "60%", "40%"]  # budgets tried on every trace
    must_fit: ClassVar[tuple] = ("100%",)  # budgets at which the planner must not raise
    profile: ClassVar[str] = DEFAULT_PROFILE  # the cost model's device profile
    seed: ClassVar[int] = 0  # seed for the plans

    # --- helpers (not tests) ---------------------------------------------------------------

    @classmethod
    def _cache(cls) -> dict:
        if "_conformance_cache" not in cls.__dict__:
            cls._conformance_cache = {}
        return cls._conformance_cache

    @classmethod
    def trace_at(cls, index: int) -> tuple[Trace, Cost]:
        """The trace of factory `index` and its cost model, built once per class."""
        key = ("trace", index)
        cache = cls._cache()
        if key not in cache:
            trace = cls.traces[index]()
            cache[key] = (trace, cost_of(trace, cls.profile))
        return cache[key]

    @classmethod
    def plan_for(cls, index: int, budget, seed: int | None = None) -> Plan | InfeasibleBudgetError:
        """The plan for trace `index` at `budget`, or the InfeasibleBudgetError the planner raised."""
        seed = cls.seed if seed is None else seed
        key = ("plan", index, budget, seed)
        cache = cls._cache()
        if key not in cache:
            trace, cost = cls.trace_at(index)
            try:
                cache[key] = make_plan(trace, budget, planner=cls.planner, seed=seed, cost=cost,
                                       simulate_result=False, **cls.params)
            except InfeasibleBudgetError as exc:
                cache[key] = exc
        return cache[key]

    def cases(self):
        """Every (trace index, budget, trace, cost, plan-or-error)."""
        for index in range(len(self.traces)):
            trace, cost = self.trace_at(index)
            for budget in self.budgets:
                yield index, budget, trace, cost, self.plan_for(index, budget)

    def plans(self):
        """The (budget label, trace, cost, plan) cases where the planner returned a plan."""
        for _, budget, trace, cost, result in self.cases():
            if isinstance(result, Plan):
                yield budget, trace, cost, result

    # --- tests -----------------------------------------------------------------------------

    def test_every_plan_validates(self):
        for budget, trace, _, plan in self.plans():
            found = validate(trace, plan, plan.budget_bytes)
            assert found == [], f"{self.planner} at {budget}: {[str(v) for v in found[:5]]}"

    def test_infeasible_names_a_larger_minimum(self):
        for _, budget, trace, _, result in self.cases():
            if isinstance(result, InfeasibleBudgetError):
                asked = parse_budget(budget).bytes_for(trace.peak_load_bytes)
                assert result.budget_bytes == asked
                assert result.min_feasible_bytes > asked, f"{self.planner} at {budget}: {result}"

    def test_must_fit_budgets_are_planned(self):
        for index in range(len(self.traces)):
            for budget in self.must_fit:
                result = self.plan_for(index, budget)
                assert isinstance(result, Plan), f"{self.planner} at {budget}: {result}"

    def test_simulated_peak_within_budget(self):
        for budget, trace, cost, plan in self.plans():
            result = simulate(trace, plan, cost=cost, budget=plan.budget_bytes)
            assert result.feasible, f"{self.planner} at {budget}: infeasible at op {result.infeasible_op}"
            assert result.peak_load_bytes <= plan.budget_bytes, f"{self.planner} at {budget}"

    def test_same_seed_same_plan(self):
        for index in range(len(self.traces)):
            budget = self.budgets[-1]
            trace, cost = self.trace_at(index)
            first = self.plan_for(index, budget)
            try:
                again = make_plan(trace, budget, planner=self.planner, seed=self.seed, cost=cost,
                                  simulate_result=False, **self.params)
            except InfeasibleBudgetError as exc:
                assert isinstance(first, InfeasibleBudgetError)
                assert exc.min_feasible_bytes == first.min_feasible_bytes
                continue
            assert isinstance(first, Plan)
            assert sorted_decisions(again) == sorted_decisions(first)
            assert (again.pool, again.pool_bytes, again.microbatches) == \
                (first.pool, first.pool_bytes, first.microbatches)

    def test_metadata_is_filled(self):
        for budget, trace, _, plan in self.plans():
            assert plan.planner == self.planner
            assert plan.budget_bytes == parse_budget(budget).bytes_for(trace.peak_load_bytes)
            assert plan.trace_digest == trace.digest
            assert plan.seed == self.seed
            assert plan.params == dict(self.params)


def sorted_decisions(plan: Plan) -> list:
    """A plan's decisions in a canonical order, for comparing two plans."""
    return sorted(plan.decisions, key=lambda d: (d.storage, d.out_after, d.back_before, d.action))
