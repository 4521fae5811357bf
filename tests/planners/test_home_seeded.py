"""`home:seeded`: HOME's swarm started from other planners' plans, then a local search. Its plan is
never worse than the policy of any plan it was seeded with (each planned here on its own and read
as a policy, judged by the same evaluator), and it passes the conformance suite; the paper's `home`
beside it keeps its own tests (tests/planners/test_home.py)."""

from __future__ import annotations

import pytest

from memplan.cost.model import Cost
from memplan.errors import InfeasibleBudgetError
from memplan.planners.kit.featuremaps import feature_maps
from memplan.planners.kit.policy import PolicyEvaluator
from memplan.planners.kit.refine import policy_of
from memplan.planners.base import plan as make_plan
from memplan.planners.home import SEED_PLANNERS
from memplan.sim.simulate import Simulator
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import chain_trace, residual_trace


class TestHomeSeeded(PlannerConformance):
    planner = "home:seeded"
    params = {"particles": 20, "iters": 30, "time_limit_s": 60.0}
    traces = [lambda: chain_trace(6), lambda: residual_trace(3, flops_per_block=3e10)]


@pytest.mark.parametrize("share", [0.8, 0.7])
def test_never_worse_than_the_policies_it_was_seeded_with(share):
    trace = residual_trace(3, flops_per_block=3e10)
    cost = Cost.for_trace(trace, "h100")
    budget = int(share * trace.peak_load_bytes)
    evaluator = PolicyEvaluator(feature_maps(trace), cost, budget)
    seeds = []
    for name in SEED_PLANNERS:
        try:
            seeds.append(evaluator(policy_of(evaluator.fm, make_plan(trace, budget, planner=name).decisions)[0]))
        except InfeasibleBudgetError:
            continue
    got = make_plan(trace, budget, planner="home:seeded", cost=cost, particles=20, iters=30, time_limit_s=60.0)
    result = Simulator(trace, cost).run(got, budget)
    assert seeds and result.feasible
    assert result.overhead <= min(seeds) + 1e-9
