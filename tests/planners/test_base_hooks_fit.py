"""Plans whose hooked form misses the budget are planned again (memplan.planners.base.hooks_fit),
unless the planner is a search that ran to its time limit."""

from __future__ import annotations

import pytest

import memplan
from memplan.planners.base import searched_to_its_limit, get_planner
from memplan.problem import Problem
from memplan.sim.simulate import Simulator
from memplan.sim.validate import validate


@pytest.mark.parametrize("model, batch, planner", [("resnet18-cifar", 8, "tflms"), ("transformer-encoder", 2, "dtr")])
def test_a_plan_whose_hooked_form_misses_its_budget_is_planned_again_until_it_fits(model, batch, planner):
    trace = memplan.trace_workload(model, batch, fake=True)
    cost = Problem.of(trace, profile="h100").cost
    cap = int(0.9 * trace.peak_load_bytes)
    simulator = Simulator(trace, cost)
    spec = get_planner(planner)
    first = spec.fn(Problem(trace, cost, cap), **spec.defaults)
    assert not simulator.hooked(first, cap).feasible  # as the planner made it, it would run interpreted
    final = memplan.plan(trace, cap, planner=planner, cost=cost)
    assert simulator.hooked(final, cap).feasible and final.predicted["level"] == "hooked"
    assert validate(trace, final, cap) == []


def test_the_plans_other_planners_start_from_are_fitted_as_memplan_plan_fits_them():
    """milp's fallbacks and HOME's seeds: raw, tflms's plan here would run interpreted."""
    from memplan.planners.kit.fitting import fitting_plans

    trace = memplan.trace_workload("resnet18-cifar", 8, fake=True)
    cost = Problem.of(trace, profile="h100").cost
    cap = int(0.9 * trace.peak_load_bytes)
    simulator = Simulator(trace, cost)
    (fitted,) = fitting_plans(Problem(trace, cost, cap), ("tflms",), simulator)
    assert simulator.hooked(fitted, cap).feasible
    assert fitted.decisions == memplan.plan(trace, cap, planner="tflms", cost=cost).decisions


def test_a_search_that_ran_to_its_time_limit_is_not_planned_again():
    auto, sqrt_n = get_planner("auto"), get_planner("sqrt-n")
    assert searched_to_its_limit(auto, {"time_limit_s": 2.0}, 1.5)
    assert not searched_to_its_limit(auto, {"time_limit_s": 2.0}, 0.5)
    assert searched_to_its_limit(auto, {}, 60.0)  # its default limit
    assert not searched_to_its_limit(sqrt_n, {}, 1e6)  # no time limit: never a search cut short
