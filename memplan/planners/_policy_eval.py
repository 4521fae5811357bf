"""The simulated overhead of a keep/swap/recompute policy: HOME's Policy Evaluator (paper 004
§3.4, Algorithm 2's role), with the shared simulator as its time-cost model.

A policy the simulator can run under the budget scores its overhead. One it cannot
(Algorithm 2's "return error") scores INFEASIBLE plus its static peak load (copies and
recomputations taking no time, `memplan.sim.validate.static_load`: a lower bound of what it
needs) over the budget, so that among infeasible policies the search still prefers the ones
needing less memory (with one error value for all of them it would have no direction at all).
"""

from __future__ import annotations

import numpy as np

from ..cost.model import Cost
from ..model import Plan
from ..sim.simulate import Simulator
from ..sim.validate import static_load
from ._featuremaps import DEFAULT_LEAD, Decoder, FeatureMaps

INFEASIBLE = 1e3  # scores from here up are infeasible policies (overheads stay far below: 1e3 = 100,000%)
CAP_RESOLUTION = 1e-3  # how closely `smallest_cap` brackets the smallest budget a plan fits (share of its peak)


class PolicyEvaluator:
    """Scores policies for one trace, budget and cost model; every distinct policy is simulated once."""

    def __init__(self, fm: FeatureMaps, cost: Cost, budget_bytes: int, lead: int = DEFAULT_LEAD,
                 simulator: Simulator | None = None):
        self.fm, self.budget_bytes = fm, int(budget_bytes)
        self.decode = Decoder(fm, lead)
        self.simulator = simulator or Simulator(fm.trace, cost)
        self.memo: dict[bytes, float] = {}

    def plan(self, policy: np.ndarray) -> Plan:
        """The plan of a policy (`memplan.planners._featuremaps.Decoder`)."""
        return Plan(decisions=self.decode(policy))

    def __call__(self, policy: np.ndarray) -> float:
        """The score of `policy` (lower is better; INFEASIBLE and above when it does not fit)."""
        key = policy.tobytes()
        score = self.memo.get(key)
        if score is None:
            score = self.memo[key] = self._score(self.plan(policy))
        return score

    def smallest_cap(self, policy: np.ndarray) -> int:
        """The smallest budget (above this one) under which `policy` fits: see `smallest_cap`."""
        return smallest_cap(self.simulator, self.plan(policy), self.budget_bytes)

    def _score(self, plan: Plan) -> float:
        result = self.simulator.run(plan, self.budget_bytes)
        if result.feasible:
            return float(result.overhead)
        return INFEASIBLE + int(static_load(self.fm.trace, plan.decisions).max()) / self.budget_bytes


def smallest_cap(simulator: Simulator, plan: Plan, above: int) -> int:
    """About the smallest budget over `above` under which the simulator runs `plan` (bisection
    between `above` and the plan's peak without a cap, where it always runs, to CAP_RESOLUTION):
    what a planner names as the smallest load it reaches when `above` does not fit."""
    lo, hi = above, simulator.run(plan, None).peak_load_bytes
    resolution = max(1, int(hi * CAP_RESOLUTION))
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        if simulator.run(plan, mid).feasible:
            hi = mid
        else:
            lo = mid
    return hi
