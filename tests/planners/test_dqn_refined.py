"""`dqn:refined`: the shipped network's greedy plan improved by a local search. Never worse than
`dqn:pretrained` (planned here on its own, both judged by the simulator), strictly better on a
residual trace where the greedy plan recomputes too much, and conformant."""

from __future__ import annotations

import pytest

from memplan.cost.model import Cost
from memplan.planners.base import plan as make_plan
from memplan.sim.simulate import Simulator
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import chain_trace, residual_trace


class TestDqnRefined(PlannerConformance):
    planner = "dqn:refined"
    traces = [lambda: chain_trace(6), lambda: residual_trace(3, flops_per_block=3e10)]


@pytest.mark.parametrize("share", [0.8, 0.7])
def test_better_than_the_greedy_plan_it_starts_from(share):
    trace = residual_trace(3, flops_per_block=3e10)
    cost = Cost.for_trace(trace, "h100")
    budget = int(share * trace.peak_load_bytes)
    simulator = Simulator(trace, cost)
    greedy = simulator.run(make_plan(trace, budget, planner="dqn:pretrained", cost=cost), budget)
    refined = simulator.run(make_plan(trace, budget, planner="dqn:refined", cost=cost), budget)
    assert greedy.feasible and refined.feasible and refined.peak_load_bytes <= budget
    assert refined.time_s < greedy.time_s
