"""Issue 19: every registered planner, on generated and imported traces, at budgets from 100% to 10%.

For every planner `known_planners()` lists (a planner registered later is covered without
editing this file; `memplan.testing.planner_property.FAST_PARAMS` keeps slow ones fast) and
a few compositions (`COMPOSED`: a pool laid out over a swap or recompute plan),
on random training iterations (`memplan.testing.strategies.training_traces`) and on the
same iterations written as a DTR log, a CUDA memory snapshot or a minimalloc CSV and
imported again: the planner returns a plan the validator accepts and whose simulated peak
fits the budget, or raises InfeasibleBudgetError naming a smallest feasible load above
the budget, or (a trace without ops, planners that decide about ops) NeedsOpsError.

Examples per planner and property: the `memplan` Hypothesis profile of tests/conftest.py
(12, reproducible). A longer, random run:

    .venv/bin/python -m pytest -q tests/planners/test_planner_property.py --hypothesis-profile ci-long
    MEMPLAN_FUZZ_EXAMPLES=200 .venv/bin/python -m pytest -q tests/planners/test_planner_property.py
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memplan.budget import NO_LIMIT
from memplan.errors import InfeasibleBudgetError
from memplan.model import Op, Storage, Trace
from memplan.planners.base import known_planners, plan
from memplan.sim.validate import validate
from memplan.testing.exporters import reimport
from memplan.testing.planner_property import (
    COMPOSED,
    INFEASIBLE,
    PLANNED,
    REFUSED,
    check_planner,
    fast_params,
)
from memplan.testing.strategies import budget_shares, training_traces
from memplan.tracing.importers.minimalloc import read_minimalloc

MIB = 2**20

PLANNERS = sorted(known_planners()) + list(COMPOSED)
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


@pytest.mark.parametrize("planner", PLANNERS)
@given(trace=training_traces())
def test_every_planner_without_a_budget(planner, trace):
    # No budget means no limit: a plan, whatever its pool (the fragmentation of a first fit included).
    result = plan(trace, None, planner=planner, simulate_result=False, **fast_params(planner))
    assert result.budget_bytes == NO_LIMIT and validate(trace, result) == []


# Five buffers (id, lower, upper, size) whose peak load is 2 MiB + 64 (ops 4 and 7), where a
# size-descending first fit puts both 2 MiB buffers at 0, the 64-byte ones above them, and
# the last of those beside its predecessor: a footprint of 2 MiB + 128.
FIRST_FIT_FRAGMENTS = "id,lower,upper,size\n0,0,5,64\n1,4,6,2097152\n2,5,7,64\n3,6,8,64\n4,7,8,2097152\n"


def test_a_pool_planner_names_its_footprint_not_the_peak(tmp_path):
    (tmp_path / "frag.csv").write_text(FIRST_FIT_FRAGMENTS)
    trace = read_minimalloc(tmp_path / "frag.csv")
    assert trace.peak_load_bytes == 2 * MIB + 64
    with pytest.raises(InfeasibleBudgetError) as err:
        plan(trace, "99%", planner="smartpool-firstfit")
    assert err.value.min_feasible_bytes == 2 * MIB + 128
    assert check_planner(trace, "smartpool-firstfit", err.value.min_feasible_bytes) == PLANNED
    assert check_planner(trace, "smartpool-firstfit", 2 * MIB + 127) == INFEASIBLE


def _input_across_the_loss() -> Trace:
    """A 1 MiB input read by the first and the last op, a 64-byte activation between."""
    storages = (Storage(id=0, nbytes=MIB, kind="input", alloc_op=0, free_op=4),
                Storage(id=1, nbytes=0, kind="temp", alloc_op=0, free_op=2),
                Storage(id=2, nbytes=64, kind="activation", alloc_op=1, free_op=3),
                Storage(id=3, nbytes=0, kind="temp", alloc_op=2, free_op=4),
                Storage(id=4, nbytes=0, kind="temp", alloc_op=3, free_op=4))
    ops = (Op(index=0, name="layer", phase="forward", reads=(0,), writes=(1,)),
           Op(index=1, name="loss", phase="forward", reads=(1,), writes=(2,)),
           Op(index=2, name="loss_backward", phase="backward", reads=(2,), writes=(3,)),
           Op(index=3, name="layer_backward", phase="backward", reads=(3, 0), writes=(4,)))
    return Trace(storages=storages, ops=ops)


def test_a_swap_plan_with_its_pool_names_a_load_where_both_fit():
    trace = _input_across_the_loss()
    planner = "autoswap:doa+smartpool"
    with pytest.raises(InfeasibleBudgetError, match="load_min") as err:
        plan(trace, "99%", planner=planner, **fast_params(planner))
    # load_min is the input alone (1 MiB, swapped out across the loss): under that budget the
    # program waits for the copy to land before the activation is made, so its pool fits too.
    assert err.value.min_feasible_bytes == MIB < trace.peak_load_bytes
    assert check_planner(trace, planner, err.value.min_feasible_bytes) == PLANNED
