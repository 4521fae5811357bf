"""The `auto` planner: never worse than any planner it runs (each planned here on its own and
judged by the simulator), its report says what it chose and refined and milp's bound, it passes
the conformance suite and the planner property suite (test_planner_property finds it through
the registry), and its plan trains exactly within budget on CPU."""

from __future__ import annotations

import json

import pytest

from memplan.cli import main
from memplan.cost.model import Cost
from memplan.errors import InfeasibleBudgetError
from memplan.planners.auto import FAST
from memplan.planners.base import plan as make_plan
from memplan.sim.simulate import Simulator
from memplan.sim.validate import validate
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import MIB, chain_trace, residual_trace
from memplan.tracing.io import write_trace


class TestAuto(PlannerConformance):
    planner = "auto"
    params = {"time_limit_s": 120.0}  # every step ends on its own well before: the plan does not depend on the clock
    traces = [lambda: chain_trace(6), lambda: chain_trace(9, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(9)]),
              lambda: residual_trace(3, flops_per_block=3e10)]


def _best_other(trace, cost, budget) -> float | None:
    """The least simulated time of the planners auto runs, each planned on its own (milp included)."""
    simulator, times = Simulator(trace, cost), []
    for name in (*FAST, "autoswap:bo", "milp"):
        try:
            p = make_plan(trace, budget, planner=name, cost=cost, simulate_result=False)
        except InfeasibleBudgetError:
            continue
        result = simulator.run(p, budget)
        if result.feasible and result.peak_load_bytes <= budget and not validate(trace, p, budget):
            times.append(result.time_s)
    return min(times, default=None)


@pytest.mark.parametrize("factory, share", [
    (lambda: residual_trace(3, flops_per_block=3e10), 0.8), (lambda: residual_trace(3, flops_per_block=3e10), 0.6),
    (lambda: chain_trace(9, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(9)]), 0.5),
])
def test_auto_is_never_worse_than_a_planner_it_runs(factory, share):
    trace = factory()
    cost = Cost.for_trace(trace, "h100")
    budget = int(share * trace.peak_load_bytes)
    best = _best_other(trace, cost, budget)
    got = make_plan(trace, budget, planner="auto", cost=cost, time_limit_s=60.0)
    result = Simulator(trace, cost).run(got, budget)
    assert validate(trace, got, budget) == [] and result.feasible and result.peak_load_bytes <= budget
    assert best is not None and result.time_s <= best * (1 + 1e-9)
    report = got.report
    assert report["overhead"] == pytest.approx(result.overhead)
    assert report["candidates"][report["chosen"]] == pytest.approx(result.overhead, abs=1e-6)
    if report["refined_from"] is not None:
        assert report["chosen"] == f"refined:{report['refined_from']}"
        assert report["refined_from"] in report["candidates"]
    assert report["bound"] is not None and report["bound"] <= result.overhead  # the bound of every plan
    assert report["gap"] == pytest.approx(result.overhead - report["bound"])


def test_the_local_search_improves_on_the_plans_it_starts_from():
    """On the light residual at 60% the fast planners' plans are not local optima: auto's chosen
    plan is a refined one, strictly better than the plan it started from."""
    trace = residual_trace(3, flops_per_block=3e10)
    got = make_plan(trace, 0.6, planner="auto", milp=False, time_limit_s=60.0)
    report = got.report
    assert report["refined_from"] is not None
    assert report["overhead"] < report["candidates"][report["refined_from"]] - 1e-6


def test_the_best_plan_is_settled_by_an_iterated_search_on_the_plan_itself():
    """Step 8: from the best candidate (here Capuchin's plan, under milp's name), the iterated search on the plan
    itself (`PlanSearch.iterate`) keeps a faster plan as `refined:<its name>`; seeded, and ending on its own
    (its kicks stop finding anything faster), it finds the same plan again."""
    from memplan.planners.auto import _Search
    from memplan.problem import Problem

    trace = residual_trace(3, flops_per_block=3e10)
    problem = Problem.of(trace, 0.8, "h100")
    start = make_plan(trace, problem.budget_bytes, planner="capuchin", cost=problem.cost)
    found = []
    for _ in range(2):
        search = _Search(problem, 60.0, 1)
        search.add("milp from capuchin", start)
        search.settle()
        found.append(search.ranked()[0])
    assert found[0].name == "refined:milp from capuchin" and found[0].time_s < search.ranked()[1].time_s
    assert found[0].plan.decisions == found[1].plan.decisions
    assert validate(trace, found[0].plan, problem.budget_bytes) == []


def test_below_every_planner_auto_names_a_load_it_plans():
    trace = chain_trace(6)
    with pytest.raises(InfeasibleBudgetError) as err:
        make_plan(trace, 0.05, planner="auto", time_limit_s=10.0)
    again = make_plan(trace, err.value.min_feasible_bytes, planner="auto", time_limit_s=10.0)
    assert validate(trace, again) == []


def test_plan_cli_takes_the_time_limit_and_prints_the_report(capsys, tmp_path):
    path = tmp_path / "residual3.jsonl"
    write_trace(residual_trace(3, flops_per_block=3e10), path)
    code = main([str(a) for a in ("plan", path, "--planner", "auto", "--budget", "70%", "--time-limit", "10",
                                  "-o", tmp_path / "p.json", "--json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["params"]["time_limit_s"] == 10.0
    assert summary["report"]["chosen"] in summary["report"]["candidates"]


@pytest.mark.parametrize("param, message", [("time_limit_s=0", "must be positive"),
                                            ("time_limit_s=-1", "must not be negative"),
                                            ("milp=maybe", "must be bool")])
def test_bad_parameters_are_one_error_line(capsys, tmp_path, param, message):
    path = tmp_path / "chain.jsonl"
    write_trace(chain_trace(4), path)
    code = main([str(a) for a in ("plan", path, "--planner", "auto", "--budget", "70%", "--param", param,
                                  "-o", tmp_path / "p.json")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("memplan: error:") and message in err
    assert not (tmp_path / "p.json").exists()


def test_an_auto_plan_trains_exactly_within_its_budget():
    """Executed for real on CPU: the same parameters as plain training, bit for bit, and the
    measured peak within the budget (test_exec's oracle: plain training from the same seed)."""
    from tests.exec.test_interpreted import _kept_budget, _plain, _planned, _same_state, tiny_workload, trace_step  # noqa: I001

    w = tiny_workload()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    plan = make_plan(trace, 0.6, planner="auto", min_bytes=1024, time_limit_s=60.0)
    assert plan.decisions
    got, stats = _planned(tiny_workload, plan=plan, trace=trace)
    _same_state(got, _plain(tiny_workload), tol=0.0)  # bit for bit
    _kept_budget(stats)


def test_when_no_fast_planner_fits_milp_over_every_storage_runs(monkeypatch):
    """Only Capuchin and TFLMS as fast planners (neither moves optimizer state), neither the largest
    storages first nor autoswap:bo (which do), and milp's size gate closed: auto still plans, with
    milp over every storage, which swaps the optimizer state across the iteration boundary."""
    import memplan.planners.auto as auto
    from tests.planners.test_milp import _optimizer_state_chain

    monkeypatch.setattr(auto, "FAST", ("capuchin", "tflms"))
    monkeypatch.setattr(auto, "MILP_MAX_GROUPS", 0)
    monkeypatch.setattr(auto, "BO_SHARE", 0.0)
    monkeypatch.setattr(auto, "largest_first", lambda *args: None)
    trace = _optimizer_state_chain()
    got = make_plan(trace, 0.6, planner="auto", time_limit_s=60.0)
    assert validate(trace, got) == []
    assert got.report["milp_status"] == "optimal" and got.report["chosen"] in ("milp", "refined:milp")
    state = next(s.id for s in trace.storages if s.kind == "optimizer_state")
    assert any(d.storage == state and d.wraps for d in got.decisions)


def test_without_a_time_limit_auto_returns_by_itself():
    """Every step ends on its own (a local optimum, a swarm's iterations, milp's sweeps and its time
    cap), and a time limit no run reaches changes nothing."""
    trace = chain_trace(9, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(9)])
    unbounded = make_plan(trace, 0.5, planner="auto", time_limit_s=1e9)
    bounded = make_plan(trace, 0.5, planner="auto", time_limit_s=120.0)
    assert unbounded.decisions == bounded.decisions
    assert unbounded.report["evaluations"] > 0 and unbounded.report["evaluations_per_s"] > 0

