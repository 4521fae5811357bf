"""Local search over keep/swap/recompute policies: the refinement step of `auto` and of
`home:seeded` (a mutation step after the swarm stops).

A plan is read as a policy over the trace's feature maps (`memplan.planners.kit.featuremaps`):
the action of the decision on each feature map's storage, KEEP without one; its decisions on
other storages (weights, optimizer state, small activations) ride along unchanged as
`extras`. The search changes one entry at a time, largest feature map first, keeps the first
change that lowers the simulated overhead (and that the validator accepts, when extras could
conflict with a recomputation), and sweeps again until a sweep changes nothing
(a local optimum) or the deadline passes. Every score is the shared simulator's
(`memplan.planners.kit.policy`), so what it returns is what `simulate` reports.
"""

from __future__ import annotations

import time

import numpy as np

from ...model import Action, Decision, Plan
from ...sim.validate import validate
from .featuremaps import FeatureMaps
from .policy import PolicyEvaluator

BETTER = 1e-9  # a change must lower the overhead by more than this


def policy_of(fm: FeatureMaps, decisions) -> tuple[np.ndarray, tuple[Decision, ...]]:
    """(policy, extras): the Action of the decision covering each feature map's gap (KEEP without one;
    RECOMPUTE only where allowed, SWAP otherwise), and the decisions on other storages."""
    index = {int(s): k for k, s in enumerate(fm.storage)}
    policy = np.full(len(fm), Action.KEEP, dtype=np.int8)
    extras = []
    for d in decisions:
        k = index.get(d.storage)
        if k is None:
            extras.append(d)
        elif not d.wraps and d.out_after < fm.back_before[k] and d.back_before > fm.out_after[k]:
            policy[k] = Action.RECOMPUTE if d.action == Action.RECOMPUTE.word and fm.recomputable[k] else Action.SWAP
    return policy, tuple(extras)


def policy_of_bound(fm: FeatureMaps, away: dict, share: float = 0.5) -> np.ndarray:
    """The policy the lower bound's LP solution suggests (`memplan.planners.bound.Bound.away`):
    each feature map whose storage the LP keeps away by at least `share` somewhere in its gap,
    recomputed where the LP recomputes more of it than it swaps (and recomputing is allowed),
    else swapped; the others kept."""
    shares: dict[int, list[tuple[int, int, float, float]]] = {}
    for (sid, out_after, back_before), (swapped, recomputed) in away.items():
        shares.setdefault(sid, []).append((out_after, back_before, swapped, recomputed))
    policy = np.full(len(fm), Action.KEEP, dtype=np.int8)
    for k, sid in enumerate(fm.storage.tolist()):
        inside = [(x, y) for lo, hi, x, y in shares.get(sid, ()) if fm.out_after[k] <= lo and hi <= fm.back_before[k]]
        swapped, recomputed = max((x for x, _ in inside), default=0.0), max((y for _, y in inside), default=0.0)
        if max(swapped, recomputed) >= share:
            policy[k] = Action.RECOMPUTE if recomputed > swapped and fm.recomputable[k] else Action.SWAP
    return policy


class Refiner:
    """Scores policies (with fixed extra decisions) and improves them by local search."""

    def __init__(self, evaluator: PolicyEvaluator, extras: tuple[Decision, ...] = ()):
        self.evaluator, self.extras = evaluator, extras
        self.memo: dict[bytes, float] = {}
        self.order = np.argsort(-evaluator.fm.nbytes, kind="stable")
        self.allowed = evaluator.fm.allowed()

    def plan(self, policy: np.ndarray) -> Plan:
        """The plan of `policy` with the extra decisions."""
        return Plan(decisions=self.evaluator.decode(policy) + self.extras)

    def score(self, policy: np.ndarray) -> float:
        """Simulated overhead under the budget (INFEASIBLE and above when it does not run there, graded by
        how far over it is: memplan.planners.kit.policy)."""
        if not self.extras:
            return self.evaluator(policy)
        key = policy.tobytes()
        if key not in self.memo:  # graded as the evaluator grades a policy: an infeasible one by its static peak
            self.memo[key] = self.evaluator.score_plan(self.plan(policy))
        return self.memo[key]

    def valid(self, policy: np.ndarray) -> bool:
        """The validator accepts the plan: the decoder's rules hold among feature maps, but a
        recomputation may read a storage an extra decision swaps away."""
        return not self.extras or not validate(self.evaluator.fm.trace, self.plan(policy))

    def polish(self, start: np.ndarray, deadline: float) -> tuple[np.ndarray, float]:
        """First-improvement local search from `start` until a local optimum or `deadline`
        (time.monotonic()); returns the best policy and its score."""
        best, score = start.copy(), self.score(start)
        improved = True
        while improved and time.monotonic() < deadline:
            improved = False
            for k in self.order:
                if time.monotonic() >= deadline:
                    break
                for action in Action:
                    if action == best[k] or not self.allowed[k, action]:
                        continue
                    trial = best.copy()
                    trial[k] = action
                    trial_score = self.score(trial)
                    if trial_score < score - BETTER and self.valid(trial):
                        best, score, improved = trial, trial_score, True
                        break
        return best, score
