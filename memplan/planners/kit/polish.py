"""A plan improved by local search in the simulator: over policies (`memplan.planners.kit.refine`: one
feature map's action at a time, decoded with the decoder's own prefetch ops) for half the time, then
on the better of the two plans itself (`memplan.planners.kit.plan_search`: its own prefetch ops and
its decisions on other storages kept). `auto` polishes its best candidates so; milp its fallback."""

from __future__ import annotations

import time

from ...cost.model import Cost
from ...model import Plan, Trace
from ...sim.simulate import Simulator
from .featuremaps import FeatureMaps, feature_maps
from .plan_search import PlanSearch
from .policy import PolicyEvaluator
from .refine import Refiner, policy_of


class Polisher:
    """The two local searches on one trace, budget and simulator."""

    def __init__(self, fm: FeatureMaps, evaluator: PolicyEvaluator, search: PlanSearch):
        self.fm, self.evaluator, self.search = fm, evaluator, search

    @classmethod
    def of(cls, trace: Trace, cost: Cost, budget_bytes: int, simulator: Simulator, min_bytes: int) -> Polisher | None:
        """The searches over the feature maps of at least `min_bytes` (None where there are none)."""
        fm = feature_maps(trace, min_bytes)
        if not len(fm):
            return None
        return cls(fm, PolicyEvaluator(fm, cost, budget_bytes, simulator=simulator),
                   PlanSearch(fm, simulator, budget_bytes))

    def polish(self, plan: Plan, deadline: float) -> Plan:
        """The best plan found from `plan` by `deadline` (time.monotonic()); `plan` itself when nothing
        improves it (never slower in the simulator)."""
        policy, extras = policy_of(self.fm, plan.decisions)
        refiner = Refiner(self.evaluator, extras)
        best, _ = refiner.polish(policy, time.monotonic() + (deadline - time.monotonic()) / 2)
        start = min((plan, refiner.plan(best)), key=lambda p: self.search.time_s(p.decisions))
        return self.search.polish(start, deadline)
