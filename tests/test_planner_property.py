"""Issue 19: every registered planner, on generated and imported traces, at budgets from 100% to 10%.

For every planner `known_planners()` lists (a planner registered later is covered without
editing this file; `memplan.testing.planner_property.FAST_PARAMS` keeps slow ones fast),
on random training iterations (`memplan.testing.strategies.training_traces`) and on the
same iterations written as a DTR log, a CUDA memory snapshot or a minimalloc CSV and
imported again: the planner returns a plan the validator accepts and whose simulated peak
fits the budget, or raises InfeasibleBudgetError naming a smallest feasible load above
the budget, or (a trace without ops, planners that decide about ops) NeedsOpsError.

Examples per planner and property: the `memplan` Hypothesis profile of tests/conftest.py
(12, reproducible). A longer, random run:

    .venv/bin/python -m pytest -q tests/test_planner_property.py --hypothesis-profile ci-long
    MEMPLAN_FUZZ_EXAMPLES=200 .venv/bin/python -m pytest -q tests/test_planner_property.py
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memplan.planners.base import known_planners
from memplan.testing.exporters import reimport
from memplan.testing.planner_property import INFEASIBLE, PLANNED, REFUSED, check_planner
from memplan.testing.strategies import budget_shares, training_traces

PLANNERS = sorted(known_planners())
IMPORTED = ("dtr", "snapshot", "minimalloc")


@pytest.mark.parametrize("planner", PLANNERS)
@given(trace=training_traces(), budget=budget_shares())
def test_every_planner_on_generated_traces(planner, trace, budget):
    assert check_planner(trace, planner, budget) in (PLANNED, INFEASIBLE)


@pytest.mark.parametrize("planner", PLANNERS)
@given(trace=training_traces(), fmt=st.sampled_from(IMPORTED), budget=budget_shares())
def test_every_planner_on_imported_traces(planner, trace, fmt, budget):
    outcome = check_planner(reimport(trace, fmt), planner, budget)
    assert outcome in (PLANNED, INFEASIBLE) or outcome == REFUSED and fmt == "minimalloc"


@pytest.fixture(scope="module")
def zoo_trace():
    from memplan.workflows.workloads import trace_workload

    return trace_workload("resnet18-cifar", 2, fake=True)


@pytest.mark.parametrize("fmt", IMPORTED)
def test_every_planner_on_an_exported_zoo_trace(zoo_trace, fmt):
    imported = reimport(zoo_trace, fmt)
    for planner in PLANNERS:
        for budget in ("100%", "50%", "10%"):
            outcome = check_planner(imported, planner, budget)
            assert outcome in (PLANNED, INFEASIBLE) or outcome == REFUSED and fmt == "minimalloc", planner
