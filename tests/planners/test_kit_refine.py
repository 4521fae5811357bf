"""The policy the lower bound's LP suggests (memplan.planners.kit.refine.policy_of_bound): read here
from shares written by hand, and from a real bound, whose plan auto's local search starts from; and the
local search over policies beside a plan's other decisions (memplan.planners.kit.refine.Refiner)."""

from __future__ import annotations

import time

import numpy as np

from memplan.cost.model import Cost
from memplan.planners.bound import lower_bound
from memplan.planners.kit.featuremaps import Decoder, feature_maps
from memplan.planners.kit.policy import INFEASIBLE, PolicyEvaluator
from memplan.planners.kit.refine import Refiner, policy_of_bound
from memplan.planners.milp.layers import movable_gaps
from memplan.sim.validate import validate
from memplan.testing.synthetic import MIB, chain_trace
from memplan.model import Action, Decision, Plan


def test_each_feature_map_takes_what_the_lp_keeps_away_most_of_it():
    trace = chain_trace(6)
    fm = feature_maps(trace, min_bytes=0)
    gap = {trace.storages[int(s)].name: (int(s), int(o), int(b)) for s, o, b in zip(fm.storage, fm.out_after,
                                                                                     fm.back_before)}
    away = {gap["a1"]: (0.7, 0.2), gap["a2"]: (0.1, 0.6), gap["a3"]: (0.3, 0.3),
            (gap["a4"][0], gap["a4"][1] - 1, gap["a4"][2]): (1.0, 0.0)}  # a gap outside a4's: not a4's
    names = [trace.storages[int(s)].name for s in fm.storage]
    policy = policy_of_bound(fm, away)
    expected = {"a1": Action.SWAP, "a2": Action.RECOMPUTE if fm.recomputable[names.index("a2")] else Action.SWAP, "a3": Action.KEEP, "a4": Action.KEEP}
    assert {n: int(policy[names.index(n)]) for n in expected} == expected
    assert all(policy[k] == Action.KEEP for k, n in enumerate(names) if n not in expected)


def test_the_bounds_own_solution_decodes_to_a_valid_plan_that_moves_what_the_budget_needs():
    trace = chain_trace(9, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(9)])
    cost = Cost.for_trace(trace, "h100")
    budget = int(0.5 * trace.peak_load_bytes)
    bound = lower_bound(trace, budget, cost, time_limit_s=30.0)
    assert bound.away and all(0 <= x <= 1 + 1e-6 and 0 <= y <= 1 + 1e-6 for x, y in bound.away.values())
    fm = feature_maps(trace)
    policy = policy_of_bound(fm, bound.away)
    plan = Plan(decisions=Decoder(fm)(policy))
    assert np.any(policy != Action.KEEP) and validate(trace, plan) == []


def test_beside_other_decisions_an_infeasible_start_is_searched_toward_the_budget():
    # Every optimizer state swapped across the boundary (a plan's decisions beside its feature maps'), and
    # a budget that needs three activations away besides: no single change fits, so the search needs a
    # direction among infeasible policies (their static peaks), as it has without those decisions.
    trace = chain_trace(6, act_bytes=32 * MIB, state_bytes=16 * MIB)
    cost = Cost.for_trace(trace, "h100")
    states = tuple(Decision(storage=u.storage, action="swap", out_after=u.out_after, back_before=u.back_before)
                   for u in movable_gaps(trace, cost, 0) if trace.storages[u.storage].kind == "optimizer_state")
    assert len(states) == 6 and all(d.wraps for d in states)
    budget = trace.peak_load_bytes - 6 * 16 * MIB - 2 * 32 * MIB - 8 * MIB
    refiner = Refiner(PolicyEvaluator(feature_maps(trace), cost, budget), states)
    start = np.full(len(refiner.evaluator.fm), Action.KEEP, dtype=np.int8)
    assert refiner.score(start) > INFEASIBLE  # graded: over the budget by its static peak
    best, score = refiner.polish(start, time.monotonic() + 60.0)
    assert score < INFEASIBLE and (best != Action.KEEP).sum() >= 3
    assert validate(trace, refiner.plan(best), budget) == []
