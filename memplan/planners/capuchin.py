"""Capuchin (Peng et al., ASPLOS'20), as HOME compares against it (paper 004 §4.1): swap first,
then recompute, deciding tensor by tensor from the first to the last that the memory needs.

1. Swap (§4.3 of Capuchin): candidates are feature maps (memplan.planners.kit.featuremaps) whose
   gap covers an op over the budget. Each has a free time FT: the time between its swap-out
   completing and the latest start of a swap-in that lands in time, on the unconstrained
   timeline. Candidates with FT > 0 are swapped, largest FT first, as long as the simulator
   (no cap) finds the swap hidden behind compute, until the static load fits.
2. Passive to active: a prefetch starts just in time (its copy time before the access); the
   plan is simulated, and every prefetch that landed late has its trigger moved earlier by
   its copy time, for a few rounds (Capuchin's feedback of in-triggers from measured accesses;
   the simulator stands in for the measured iteration). The best round is kept.
3. Recompute by memory saving per second (MSPS = bytes / recomputation time, the time
   including the rebuild of inputs already chosen for recomputation, updated after each
   pick) until the simulator runs the plan under the budget; then swaps without free time,
   largest FT first, if it still does not fit; the triggers are tuned once more at the end.

Recomputations and swaps follow the shared rules (a swapped input a recomputation reads is
fetched back for it). With a budget at or above the unconstrained peak nothing moves.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..cost.model import Cost
from ..model import Action, Plan
from ..problem import Problem
from ..sim.validate import static_load
from .base import infeasible, register
from .kit.featuremaps import DEFAULT_MIN_BYTES, FeatureMaps, feature_maps
from .kit.fitting import smallest_fitting_budget
from .kit.gaps import alive_at
from .kit.ops import op_starts
from .kit.policy import CAP_RESOLUTION, PolicyEvaluator

FEEDBACK_ROUNDS = 6  # simulate-and-adjust rounds of the prefetch triggers
LATE_S = 1e-12  # a prefetch landing this close to its op's start counts as late
HIDDEN = 1e-3  # a swap adding at most this share of the baseline time counts as hidden


@register("capuchin", "Capuchin as HOME §4.1 describes it: swap by free time with tuned prefetch, then "
                      "recompute by MSPS", decides=("swap", "recompute"))
def capuchin(problem: Problem, *, min_bytes: int = DEFAULT_MIN_BYTES,
             feedback_rounds: int = FEEDBACK_ROUNDS) -> Plan:
    """Capuchin's swap-then-recompute policy.

    Args:
        trace, budget_bytes, cost, seed: see `memplan.planners.base` (no randomness here).
        min_bytes: smaller activations are not feature maps (they stay).
        feedback_rounds: simulate-and-adjust rounds of the prefetch triggers.
    Raises:
        InfeasibleBudgetError: even with every feature map away the plan does not fit (names
            the peak load of that plan without a cap).
    """
    trace, budget_bytes, cost, seed = problem.parts()
    if budget_bytes >= trace.peak_load_bytes:
        return Plan()
    fm = feature_maps(trace, min_bytes)
    state = _State(fm, cost, budget_bytes, feedback_rounds)
    state.swap_with_free_time()
    state.tune()
    if not state.fits():
        state.recompute_by_msps()
    if not state.fits():
        state.swap_rest()
    state.tune()
    if not state.fits():
        raise infeasible(budget_bytes, smallest_fitting_budget(state.evaluator.simulator, state.plan(), budget_bytes,
                                                               resolution_share=CAP_RESOLUTION), "capuchin")
    return state.plan()


class _State:
    """Capuchin's policy under construction: actions, prefetch triggers and the evaluator."""

    def __init__(self, fm: FeatureMaps, cost: Cost, budget_bytes: int, rounds: int):
        self.fm, self.cost, self.budget, self.rounds = fm, cost, budget_bytes, rounds
        self.evaluator = PolicyEvaluator(fm, cost, budget_bytes)
        self.policy = np.full(len(fm), Action.KEEP, dtype=np.int8)
        starts = op_starts(cost)
        self.start = starts[:-1]
        out_done = starts[fm.out_after + 1] + cost.d2h_s(fm.nbytes)  # swap-out complete
        self.latest_in = self.start[fm.back_before] - cost.h2d_s(fm.nbytes)  # latest swap-in start
        self.free_time = self.latest_in - out_done
        self.triggers = {k: self._op_at(self.start, self.latest_in[k], k) for k in range(len(fm))}

    # --- the plan ---------------------------------------------------------------------------

    def plan(self) -> Plan:
        """The current policy with its triggers."""
        return Plan(decisions=self.evaluator.decode(self.policy, self.triggers))

    def fits(self) -> bool:
        """The simulator runs the current plan under the budget."""
        return self.evaluator.simulator.run(self.plan(), self.budget).feasible

    def _over(self) -> np.ndarray:
        """Ops where the plan still needs more than the budget: over it in the static load, else
        the op where the simulation failed (none when it fits)."""
        plan = self.plan()
        over = static_load(self.fm.trace, plan.decisions) > self.budget
        if not over.any():
            result = self.evaluator.simulator.run(plan, self.budget)
            if not result.feasible:
                over[result.infeasible_op] = True
        return over

    def _helps(self, over: np.ndarray) -> np.ndarray:
        """Feature maps still kept whose gap covers an op in `over`."""
        fm = self.fm
        prefix = np.concatenate([[0], np.cumsum(over)])
        return (self.policy == Action.KEEP) & (prefix[fm.back_before] - prefix[fm.out_after + 1] > 0)

    # --- 1. swaps with free time, 4. the rest -------------------------------------------------

    def swap_with_free_time(self) -> None:
        """Swap candidates with FT > 0, largest first, while the swap stays hidden (the plan's time
        without a cap grows by at most HIDDEN of the baseline), until the static load fits."""
        sim = self.evaluator.simulator
        time_s = sim.baseline_time_s
        for k in np.argsort(-self.free_time, kind="stable"):
            over = static_load(self.fm.trace, self.plan().decisions) > self.budget
            if not over.any():
                return
            if self.free_time[k] <= 0 or not self._helps(over)[k]:
                continue
            self.policy[k] = Action.SWAP
            after = sim.run(self.plan()).time_s
            if after > time_s + HIDDEN * sim.baseline_time_s:
                self.policy[k] = Action.KEEP
            else:
                time_s = after

    def swap_rest(self) -> None:
        """Swap the remaining candidates, largest FT first, until the plan fits."""
        for k in np.argsort(-self.free_time, kind="stable"):
            over = self._over()
            if not over.any():
                return
            if self._helps(over)[k]:
                self.policy[k] = Action.SWAP

    # --- 2. prefetch triggers by feedback ----------------------------------------------------

    def tune(self) -> None:
        """Move late prefetches earlier by their copy time, round by round; keep the best round."""
        best = (self._score(), dict(self.triggers))
        for _ in range(self.rounds):
            moved = self._earlier_triggers()
            if not moved:
                break
            self.triggers.update(moved)
            best = min(best, (self._score(), dict(self.triggers)), key=lambda b: b[0])
        self.triggers = best[1]

    def _score(self) -> float:
        result = self.evaluator.simulator.run(self.plan(), self.budget)
        return result.overhead if result.feasible else float("inf")

    def _earlier_triggers(self) -> dict[int, int]:
        """New triggers for the prefetches that landed late: their copy time earlier, in simulated time.

        Prefetch copies run in the order the simulator issues them: by trigger op, then by
        decision index (memplan.sim.simulate); they are paired with the host-to-device lane so.
        Without a fit under the budget, the plan is simulated without a cap (Capuchin's passive mode).
        """
        plan = self.plan()
        result = self.evaluator.simulator.run(plan, self.budget, timeline=True)
        if not result.feasible:
            result = self.evaluator.simulator.run(plan, timeline=True)
        start = result.op_start_s
        swaps = sorted((d.trigger, i) for i, d in enumerate(plan.decisions) if d.action == "swap")
        index = {int(s): k for k, s in enumerate(self.fm.storage)}
        moved = {}
        for (_, i), (_, land) in zip(swaps, result.lanes["h2d"]):
            d, k = plan.decisions[i], index[plan.decisions[i].storage]
            if land >= start[d.back_before] - LATE_S and d.trigger > d.out_after + 1:
                moved[k] = self._op_at(start, start[d.trigger] - self.cost.h2d_s(self.fm.nbytes[k]), k)
        return moved

    def _op_at(self, start: np.ndarray, when: float, k: int) -> int:
        """The last op starting by `when`, inside feature map k's gap."""
        op = bisect.bisect_right(start, when) - 1
        return int(min(max(op, self.fm.out_after[k] + 1), self.fm.back_before[k]))

    # --- 3. recompute by MSPS ----------------------------------------------------------------

    def recompute_by_msps(self) -> None:
        """Recompute the kept candidate with the highest memory saving per second, until the plan fits."""
        while True:
            over = self._over()
            if not over.any():
                return
            candidates = np.flatnonzero(self._helps(over) & self.fm.recomputable)
            if not len(candidates):
                return
            msps = [self.fm.nbytes[k] / max(self._recompute_s(k), 1e-12) for k in candidates]
            self.policy[candidates[int(np.argmax(msps))]] = Action.RECOMPUTE

    def _recompute_s(self, k: int) -> float:
        """Seconds to rebuild feature map k at its op: its writers, and the inputs recomputed away
        or freed there, recursively (the chain the simulator would run, roughly)."""
        trace, op = self.fm.trace, int(self.fm.back_before[k])
        index = {int(s): j for j, s in enumerate(self.fm.storage)}
        total, stack, seen = 0.0, [int(self.fm.storage[k])], set()
        while stack:
            sid = stack.pop()
            ops, inputs = trace.lineage(sid, op)
            total += float(self.cost.durations[list(ops)].sum())
            for r in inputs:
                j = index.get(r)
                gone = not alive_at(trace, r, op) or (
                    j is not None and self.policy[j] == Action.RECOMPUTE
                    and self.fm.out_after[j] < op < self.fm.back_before[j])
                if gone and r not in seen and trace.recomputable(r):
                    seen.add(r)
                    stack.append(r)
        return total
