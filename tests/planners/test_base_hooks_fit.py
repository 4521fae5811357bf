"""Plans whose hooked form misses the budget are planned again (memplan.planners.base.hooks_fit),
unless the planner is a search that ran to its time limit."""

from __future__ import annotations

import pytest

import memplan
from memplan.planners.base import searched_to_its_limit, get_planner
from memplan.problem import Problem
from memplan.sim.simulate import Simulator
from memplan.sim.validate import validate


@pytest.mark.parametrize("model, batch, planner", [("resnet18-cifar", 8, "tflms"), ("transformer-encoder", 2, "tflms")])
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


def test_a_planner_that_chooses_by_the_simulator_is_not_planned_again(monkeypatch):
    """auto keeps the plan the simulator runs fastest at the level it runs (PlannerSpec.simulated):
    planning it again under smaller loads would only repeat its search. tflms's plan, made at op
    granularity, is fitted to its hooked form as above."""
    from memplan.planners import base

    fitted = []  # the plans fit_hooked was given
    monkeypatch.setattr(base, "fit_hooked", lambda plan_at, problem, first, first_s: fitted.append(first) or first)
    trace = memplan.trace_workload("resnet18-cifar", 8, fake=True)
    problem = Problem.of(trace, 0.9)
    tflms = base.planned_at(get_planner("tflms"), problem, {})
    assert any(p is tflms for p in fitted)
    auto = base.planned_at(get_planner("auto"), problem, {"time_limit_s": 10.0, "milp": False})
    assert not any(p is auto for p in fitted)  # (the planners auto runs inside are fitted, as everywhere)
    assert get_planner("auto").simulated and not get_planner("tflms").simulated


def test_a_recomputation_no_module_call_can_run_again_is_swapped_instead():
    """dqn:pretrained on resnet18-cifar@16 at 80% recomputes the stem convolution's output, which the
    root module's functional code makes: its hooked form kept that storage and missed the budget by 2 MB,
    so the whole plan ran interpreted. Swapped over the same gap, the plan runs at the hooks."""
    from memplan.planners.base.hooks_fit import swapped_where_dropped

    trace = memplan.trace_workload("resnet18-cifar", 16, fake=True)
    problem = Problem.of(trace, "80%")
    simulator = Simulator(trace, problem.cost)
    spec = get_planner("dqn:pretrained")
    first = spec.fn(problem, **spec.defaults)
    lowered = simulator.lower(first.decisions)
    assert lowered.dropped and "no module call can recompute" in lowered.reason
    assert not simulator.hooked(first, problem.budget_bytes).feasible
    swapped = swapped_where_dropped(first, simulator)
    changed = [(a, b) for a, b in zip(first.decisions, swapped.decisions) if a != b]
    assert changed and all(a.action == "recompute" and b.action == "swap" and (a.out_after, a.back_before) ==
                           (b.out_after, b.back_before) for a, b in changed)
    assert not simulator.lower(swapped.decisions).dropped
    final = memplan.plan(problem, planner="dqn:pretrained")
    assert final.level == "hooked" and validate(trace, final, problem.budget_bytes) == []
    assert swapped_where_dropped(final, simulator) is final  # nothing left to swap
