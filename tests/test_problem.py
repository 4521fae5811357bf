"""memplan.problem: the Problem made once at the edge, and "no limit" spelled once (memplan.budget)."""

from __future__ import annotations

import json

import pytest

import memplan
import memplan.services
from memplan.budget import NO_LIMIT, UNLIMITED, Budget, bytes_from_json, bytes_label, bytes_to_json, limited
from memplan.errors import MemplanError, UnknownNameError
from memplan.problem import DEFAULT_PROFILE, Problem
from memplan.testing.synthetic import chain_trace


def test_a_share_is_resolved_against_the_traces_peak_and_none_is_no_limit():
    trace = chain_trace(6)
    assert Problem.of(trace, "50%").budget_bytes == trace.peak_load_bytes // 2
    assert Problem.of(trace, 0.5).budget_bytes == trace.peak_load_bytes // 2
    for no_cap in (UNLIMITED, "none", None):
        problem = Problem.of(trace, no_cap)
        assert problem.budget_bytes == NO_LIMIT and not problem.limited
    assert Problem.of(trace, "8GiB").limited and Problem.of(trace, "8GiB").budget_bytes == 8 * 2**30


def test_the_profile_prices_the_trace_once_and_a_given_cost_wins():
    trace = chain_trace(6)
    default, slow = Problem.of(trace), Problem.of(trace, profile="gtx1080ti")
    assert default.profile.name == DEFAULT_PROFILE and slow.profile.name == "gtx1080ti"
    assert slow.cost.baseline_compute_s > default.cost.baseline_compute_s  # a slower card, slower ops
    assert Problem.of(trace, profile="gtx1080ti", cost=default.cost).cost is default.cost
    smaller = default.at(trace.peak_load_bytes // 3).with_seed(7)
    assert smaller.cost is default.cost and smaller.trace is trace and smaller.seed == 7
    assert smaller.budget_bytes == trace.peak_load_bytes // 3 and default.budget_bytes == NO_LIMIT


def test_bad_budgets_and_profiles_are_one_clear_error():
    trace = chain_trace(4)
    with pytest.raises(MemplanError, match="not a budget"):
        Problem.of(trace, "lots%")
    with pytest.raises(UnknownNameError, match="tpu9"):
        Problem.of(trace, profile="tpu9")


def test_no_limit_is_written_null_and_read_back():
    assert bytes_to_json(NO_LIMIT) is None and bytes_from_json(None) == NO_LIMIT
    assert bytes_to_json(1000) == 1000 and bytes_from_json(1000) == 1000
    assert bytes_label(NO_LIMIT) == "none" and bytes_label(2**30) == "1.00 GiB"
    assert not limited(NO_LIMIT) and limited(NO_LIMIT - 1)
    assert Budget.of_bytes(5).bytes_for(10) == 5 and UNLIMITED.bytes_for(10) == NO_LIMIT


def test_a_trace_and_its_problem_plan_alike(tmp_path):
    trace = chain_trace(8)
    problem = Problem.of(trace, "60%", "a100", seed=3)
    made = memplan.plan(trace, "60%", planner="autoswap:doa", profile="a100", seed=3)
    again = memplan.plan(problem, planner="autoswap:doa")
    assert memplan.services.plan_problem(problem, "autoswap:doa").decisions == again.decisions
    with pytest.raises(MemplanError, match="its own budget"):
        memplan.plan(problem, "50%", planner="autoswap:doa")
    assert made.decisions == again.decisions and made.decisions
    assert made.budget_bytes == again.budget_bytes == problem.budget_bytes
    assert made.profile["name"] == "a100" and made.seed == 3
    unlimited = memplan.plan(trace, planner="none")
    assert unlimited.budget_bytes == NO_LIMIT
    path = tmp_path / "p.json"
    memplan.write_plan(unlimited, path)
    assert json.loads(path.read_text())["budget_bytes"] is None
    assert memplan.read_plan(path, trace).budget_bytes == NO_LIMIT


def test_a_plan_file_written_before_profile_was_named_so_still_loads(tmp_path):
    trace = chain_trace(6)
    made = memplan.plan(trace, "80%", planner="sqrt-n", profile="v100")
    data = made.to_json()
    data["device"] = data.pop("profile")  # as plan files were written before
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert memplan.read_plan(path, trace).profile["name"] == "v100"
    assert memplan.simulate(trace, memplan.read_plan(path, trace)).time_s == made.predicted["time_s"]


def test_simulate_and_compile_take_the_problem_whole_and_share_its_simulator():
    from memplan.sim.simulate import simulator_of

    trace = chain_trace(8)
    problem = Problem.of(trace, "80%", "a100")
    assert simulator_of(problem) is simulator_of(problem.at(1)) is simulator_of(problem.with_seed(4))
    assert simulator_of(problem.on(trace, problem.cost)) is not simulator_of(problem)  # another trace or cost: its own
    plan = memplan.plan(problem, planner="sqrt-n")
    assert memplan.simulate(problem, plan).summary() == memplan.simulate(trace, plan, profile="a100").summary()
    assert memplan.compile(problem, plan).predicted == memplan.compile(trace, plan, "a100").predicted
    assert memplan.simulate(problem).budget_bytes == problem.budget_bytes  # no plan: the problem's cap
    with pytest.raises(MemplanError, match="own costs"):
        memplan.simulate(problem, plan, profile="v100")


def test_cost_of_is_the_one_way_to_price_a_trace():
    trace = chain_trace(6)
    assert memplan.cost_of(trace, "v100").profile.name == "v100"
    assert memplan.cost_of(trace).durations.tolist() == Problem.of(trace).cost.durations.tolist()
    given = Problem.of(trace).cost
    assert memplan.cost_of(trace, "v100", given) is given
