"""Issue 26: `X+smartpool` for any swap or recompute planner X (paper 000 §V: plan, then pool).

The pool is device memory too, so it must fit the budget. A layout is larger than the load
it lays out where buffers fragment it: the composition plans X again under the budget less
that excess until the pool fits, and otherwise names a load at which it does.
"""

from __future__ import annotations

import pytest

import memplan
from memplan.errors import InfeasibleBudgetError, MemplanError, UnknownNameError
from memplan.model import Plan
from memplan.planners.base.compositions import LOAD_MARGINS, POOL_TRIES, _fit, _fitted_pool
from memplan.planners.base import get_planner
from memplan.testing.planner_property import fast_params
from memplan.testing.synthetic import chain_trace

PEAK = 1000


class _Trace:
    peak_load_bytes = PEAK


def _pooled(floor: int, waste: float, calls: list):
    """A stand-in for X+pool: X reaches no load under `floor`; its pool wastes `waste` of the load."""

    def pooled(load: int, budget: int) -> Plan:
        calls.append((load, budget))
        if load < floor:
            raise InfeasibleBudgetError("below the floor", budget_bytes=load, min_feasible_bytes=floor)
        return Plan(pool_bytes=int(min(load, PEAK) * (1 + waste)))

    return pooled


def test_a_pool_over_the_budget_is_planned_again_under_a_smaller_load():
    calls = []
    result = _fitted_pool(_Trace(), 800, _pooled(floor=100, waste=0.1, calls=calls), "x+pool")
    assert result.pool_bytes <= 800 and result.report == {"pool_tries": len(calls), "planned_load_bytes": calls[-1][0]}
    assert calls[0] == (800, 800) and calls[1][0] == 720  # cut by the overflow
    assert {budget for _, budget in calls} == {800}  # always laid out as the program at the asked budget runs


def test_a_plan_that_moves_too_little_is_cut_deeper_each_time():
    calls = []

    def stubborn(load: int, budget: int) -> Plan:  # a pool 0.1% over the budget until the load is 90% of it
        calls.append(load)
        return Plan(pool_bytes=budget + 1 if load > 0.9 * budget else budget)

    assert _fitted_pool(_Trace(), 800, stubborn, "x+pool").pool_bytes <= 800
    assert calls == [800, 796, 789, 774, 744, 685]  # each load 0.5% (MIN_CUT), 1%, 2%, 4%, 8% under the last


def test_a_load_out_of_the_base_planners_reach_is_bisected():
    calls = []

    def narrow(load: int, budget: int) -> Plan:  # out of reach under 750, the pool fits from 760 down
        calls.append(load)
        if load < 750:
            raise InfeasibleBudgetError("out of reach", budget_bytes=load, min_feasible_bytes=750)
        return Plan(pool_bytes=budget + 1 if load > 760 else budget)

    assert _fitted_pool(_Trace(), 800, narrow, "x+pool").report["planned_load_bytes"] == 759
    assert calls == [800, 796, 789, 774, 744, 759]  # 744 out of reach: halfway back to 774


def test_when_no_smaller_load_fits_the_error_names_a_load_that_does():
    calls = []
    pooled = _pooled(floor=780, waste=0.1, calls=calls)
    with pytest.raises(InfeasibleBudgetError, match="pool it laid out needs") as err:
        _fitted_pool(_Trace(), 800, pooled, "x+pool")
    found = err.value.min_feasible_bytes
    assert err.value.budget_bytes == 800 and found > 800
    assert isinstance(_fit(_Trace(), found, pooled), Plan)  # what `plan` at that budget does
    assert len(calls) <= POOL_TRIES * (1 + len(LOAD_MARGINS))


def test_a_budget_out_of_the_base_planners_reach_names_a_load_for_both():
    pooled = _pooled(floor=500, waste=0.5, calls=[])
    with pytest.raises(InfeasibleBudgetError, match="below the floor") as err:
        _fitted_pool(_Trace(), 400, pooled, "x+pool")
    found = err.value.min_feasible_bytes
    assert found >= 500 and isinstance(_fit(_Trace(), found, pooled), Plan)


@pytest.fixture(scope="module")
def trace():
    return chain_trace(6, flops_per_layer=1e9)


@pytest.mark.parametrize("planner", ["capuchin+smartpool", "dtr+smartpool", "autoswap:doa+smartpool",
                                     "sqrt-n+smartpool-bestfit"])
def test_any_swap_or_recompute_planner_takes_a_pool(trace, planner):
    budget = int(trace.peak_load_bytes * 0.7)
    try:
        result = memplan.plan(trace, budget, planner=planner, **fast_params(planner))
    except InfeasibleBudgetError as exc:  # then the load it names plans
        budget = exc.min_feasible_bytes
        result = memplan.plan(trace, budget, planner=planner, **fast_params(planner))
    assert result.pool and result.pool_bytes <= budget
    assert memplan.validate(trace, result) == []
    assert "pool" in get_planner(planner).decides


def test_what_cannot_take_a_pool_is_refused():
    with pytest.raises(MemplanError, match="cannot compose 'smartpool\\+smartpool'"):
        get_planner("smartpool+smartpool")
    with pytest.raises(UnknownNameError):
        get_planner("nosuch+smartpool")
    with pytest.raises(MemplanError, match="no parameter 'time_limit_s'"):
        memplan.plan(chain_trace(3), "90%", planner="capuchin+smartpool", time_limit_s=1)
