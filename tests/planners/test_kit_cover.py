"""The largest storages first (`memplan.planners.kit.cover`) and the prefetch of a swap across the
iteration boundary (`memplan.planners.kit.prefetch`), which such a plan leans on."""

from __future__ import annotations

import numpy as np
from hypothesis import given

from memplan.budget import parse_budget
from memplan.cost.model import Cost
from memplan.model import Plan
from memplan.planners.base import plan as make_plan
from memplan.planners.kit.cover import largest_first
from memplan.planners.kit.gaps import load_without
from memplan.planners.kit.prefetch import gap_decisions
from memplan.sim.simulate import Simulator
from memplan.sim.validate import static_load, validate
from memplan.testing.strategies import budget_shares, training_traces
from memplan.testing.synthetic import MIB, chain_trace

MIN_BYTES = MIB


@given(trace=training_traces(), budget=budget_shares())
def test_its_plan_validates_and_its_static_load_fits_or_there_is_none(trace, budget):
    budget_bytes = max(1, parse_budget(budget).bytes_for(trace.peak_load_bytes))
    decisions = largest_first(trace, budget_bytes, MIN_BYTES)
    if decisions is None:
        return
    assert all(d.action == "swap" for d in decisions)
    assert len({d.storage for d in decisions}) == len(decisions)  # one gap a storage
    assert int(static_load(trace, list(decisions)).max()) <= budget_bytes
    assert not validate(trace, Plan(decisions=decisions), budget_bytes)


def test_it_swaps_the_largest_storage_away_at_the_op_most_over_first():
    trace = chain_trace(6, sizes=[(8 + 16 * (i % 3)) * MIB for i in range(6)], param_bytes=MIB // 2)
    peak = trace.peak_load_bytes
    budget = peak - 20 * MIB  # one of the largest (40 MiB) activations away at the peak op is enough
    decisions = largest_first(trace, budget, MIN_BYTES)
    assert decisions is not None and len(decisions) == 1
    assert trace.nbytes[decisions[0].storage] == 40 * MIB
    assert largest_first(trace, int(0.01 * peak), MIN_BYTES) is None  # below what moving everything reaches


def test_a_swap_across_the_iteration_boundary_is_prefetched_in_the_head_as_soon_as_it_fits():
    """A weight away from the optimizer's step to its use in the next forward was prefetched at the
    op that needs it (a stall of its whole copy); it comes back at the first op of the next
    iteration from which it fits."""
    trace = chain_trace(4, act_bytes=16 * MIB, param_bytes=8 * MIB)
    state = max((s for s in trace.storages if s.persistent), key=lambda s: trace.accesses[s.id][0])  # the last weight
    accesses = trace.accesses[state.id]
    wrap = (state.id, accesses[-1], accesses[0])
    assert wrap[2] <= wrap[1]
    cap = int(trace.peak_load_bytes)
    (decision,) = gap_decisions(trace, [wrap], [], cap=cap)
    assert decision.trigger == 0 < wrap[2]  # nothing over the cap: from the iteration's first op
    load = load_without(trace, [wrap])
    tight = int(load[: wrap[2]].max()) + int(state.nbytes) - 1  # over by a byte at the most loaded head op
    (decision,) = gap_decisions(trace, [wrap], [], cap=tight)
    head = load[: wrap[2]] + state.nbytes
    assert decision.trigger == int(np.flatnonzero(head > tight)[-1]) + 1 <= wrap[2]


def test_auto_scores_it_beside_the_fast_planners():
    trace = chain_trace(6, sizes=[(8 + 16 * (i % 3)) * MIB for i in range(6)], param_bytes=MIB // 2)
    budget = trace.peak_load_bytes - 20 * MIB
    cost = Cost.for_trace(trace, "h100")
    report = make_plan(trace, budget, planner="auto", cost=cost, time_limit_s=5.0).report
    expected = Simulator(trace, cost).run(Plan(decisions=largest_first(trace, budget, MIN_BYTES)), budget).overhead
    assert report["candidates"]["largest-first"] == round(expected, 6)
