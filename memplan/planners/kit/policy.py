"""The simulated overhead of a keep/swap/recompute policy: HOME's Policy Evaluator (paper 004
§3.4, Algorithm 2's role), with the shared simulator as its time-cost model.

A policy the simulator can run under the budget scores its overhead. One it cannot
(Algorithm 2's "return error") scores INFEASIBLE plus its static peak load (copies and
recomputations taking no time, `Simulator.peak_floor`: a lower bound of what it needs) over the
budget, so that among infeasible policies the search still prefers the ones needing less memory
(with one error value for all of them it would have no direction at all).
"""

from __future__ import annotations

import numpy as np

from ...cost.model import Cost
from ...model import Plan
from ...sim.simulate import Simulator
from .featuremaps import Decoder, FeatureMaps
from .fitting import smallest_fitting_budget
from .prefetch import DEFAULT_LEAD

INFEASIBLE = 1e3  # scores from here up are infeasible policies (overheads stay far below: 1e3 = 100,000%)
# How closely the smallest budget a policy fits is bracketed (share of its peak): the searches over
# policies name it often, and one byte would cost a dozen more simulations each time.
CAP_RESOLUTION = 1e-3


class PolicyEvaluator:
    """Scores policies for one trace, budget and cost model; every distinct policy is simulated once."""

    def __init__(self, fm: FeatureMaps, cost: Cost, budget_bytes: int, lead: int = DEFAULT_LEAD,
                 simulator: Simulator | None = None):
        self.fm, self.budget_bytes = fm, int(budget_bytes)
        self.decode = Decoder(fm, lead)
        self.simulator = simulator or Simulator(fm.trace, cost)
        self.memo: dict[bytes, float] = {}

    def plan(self, policy: np.ndarray) -> Plan:
        """The plan of a policy (`memplan.planners.kit.featuremaps.Decoder`)."""
        return Plan(decisions=self.decode(policy))

    def __call__(self, policy: np.ndarray) -> float:
        """The score of `policy` (lower is better; INFEASIBLE and above when it does not fit)."""
        key = policy.tobytes()
        score = self.memo.get(key)
        if score is None:
            score = self.memo[key] = self.score_plan(self.plan(policy))
        return score

    @property
    def evaluations(self) -> int:
        """Plans its simulator has evaluated so far."""
        return self.simulator.evaluations

    def smallest_cap(self, policy: np.ndarray) -> int:
        """About the smallest budget (from this one up) under which `policy` fits, to CAP_RESOLUTION."""
        return smallest_fitting_budget(self.simulator, self.plan(policy), self.budget_bytes,
                                       resolution_share=CAP_RESOLUTION)

    def score_plan(self, plan: Plan) -> float:
        """The score of `plan` (a policy's, or one with decisions beside its feature maps'), not memoised."""
        overhead = self.simulator.overhead_if_fits(plan, self.budget_bytes)
        if overhead is not None:
            return float(overhead)
        return INFEASIBLE + self.simulator.peak_floor(plan) / self.budget_bytes

