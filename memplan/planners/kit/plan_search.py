"""Local search on a plan's own decisions: the refinement step of `auto`.

Unlike the search over policies (`memplan.planners.kit.refine`), which reads a plan as one action
per feature map and decodes it again with the decoder's own prefetch ops, this search keeps the
plan as it is (its triggers, its decisions on weights and optimizer state, its order) and changes
one thing at a time, largest feature map first:
- a feature map without a decision: swap it (prefetched `lead` backward layers before it is due),
  or recompute it (also with every recomputation the same module call runs again for due at the
  earliest of theirs: below);
- a swapped one: keep it, recompute it (so too), or move its prefetch one backward layer earlier or later;
- a recomputed one: keep it, swap it, or bring it back with the first recomputation whose chain
  rebuilds it on the way (due at one op, the chains rebuild it once: on resnet50@256 at 1/3, 3.2 of
  the 15.1 ms replayed were storages rebuilt twice, for a neighbour's chain and then for their own),
  or with an earlier recomputation that the hooked executor runs the same module call again for (due at
  one hook point, one run of the call rebuilds both, where apart it runs twice: gpt2@8 with 4 layers at
  70%, five 12 MiB activations rebuilt by two runs instead of four, 12.44% -> 11.45%);
- each recomputation above also without the swaps that have its lineage's inputs away when it runs
  (a swap the validator would refuse it beside: on vgg16@64 at 50% the 37 MiB input image swapped
  kept the 784 MiB first convolution's output swapped, its copies stalling the step, where
  recomputing it costs 0.6 ms);
- every other swap (weights, optimizer state, small storages): drop it, or move its prefetch (one
  across the iteration boundary too, within the head of the step it is due in); one across the
  boundary prefetched in the next step's head also swapped out at the step's end: a swap-out inside
  the optimizer's step splits the step at a hook there, each stretch a call of the step the host
  pays (`memplan.tracing.stepwise`; gpt2@8 with 4 layers at 70%: twenty Adam states swapped out
  after their updates, 0.6 ms of stretches on an 18 ms step).
Where none of those improves the plan, four more:
- every such swap across the boundary swapped out at the step's end at once (where they fit only
  together: the step splits wherever one of them is still swapped out inside it);
- every prefetch issued again by §4.5 (`memplan.planners.kit.prefetch.retimed`: in order of need,
  each as soon as it fits, at a hook point): a planner's own prefetch ops can crowd the
  host-to-device engine in another order (gpt2@8 with 4 layers at 70%: autoswap:bo's plan brought
  the tied embedding's Adam states back before the activations due earlier, which then stalled);
- the prefetches waited at one update mark inside the optimizer's step waited at the mark before (the
  first mark's at the step's start), one mark at a time, where each was issued by then: each mark
  waited at is a stretch, and a prefetch that landed before an earlier mark costs nothing waited there
  (gpt2@8 with 4 layers at 70%: 25 Adam states waited at thirteen marks, 6.1% -> 4.3% while the
  simulator priced no copy still running at the step's end; tried before
  the prefetches issued again, the 12-layer one's polish ran out of time before reaching those);
- every other swap exchanged for one of the EXCHANGED_WITH largest feature maps without a decision,
  swapped or recomputed, the prefetches issued again: a plan that fits only with one of the two is
  not reached one change at a time (there an optimizer state's actions fall in the optimizer's step,
  where the host is the bottleneck, an activation's in the forward; 8.4% -> 7.3%).
A change is kept when the plan then simulates faster within the budget and the validator accepts
it, and sweeps repeat until one changes nothing or the deadline passes. So the plan returned is
never slower than the one it started from. `PlanSearch.iterate` repeats the search from kicked plans
(one to three decisions of the best so far dropped at random, seeded): auto's last step.
"""

from __future__ import annotations

import bisect
import random
import time
from dataclasses import replace

import numpy as np

from ...model import Decision, Plan
from ...model.program import HOOKED
from ...sim.simulate import Simulator
from ...sim.validate import validate
from .featuremaps import FeatureMaps
from .prefetch import DEFAULT_LEAD, retimed

BETTER = 1e-9  # a change must lower the simulated time by more than this share
EXCHANGED_WITH = 8  # a swap that is no feature map's is tried in place of this many of the largest free ones
KICKS = (1, 2, 3)  # decisions an iterated search's kick drops, one of these many at random
PATIENCE = 20  # ... which ends after this many kicks in a row found nothing faster


class PlanSearch:
    """First-improvement local search over the decisions of plans on one trace and budget."""

    def __init__(self, fm: FeatureMaps, simulator: Simulator, budget_bytes: int, lead: int = DEFAULT_LEAD):
        self.fm, self.simulator, self.budget, self.lead = fm, simulator, int(budget_bytes), lead
        self.order = np.argsort(-fm.nbytes, kind="stable").tolist()
        self.starts = list(fm.layer_starts)
        self.last = fm.trace.num_steps - 1  # a swap-out at the step's end comes after this op
        marks = fm.trace.marks
        self.updates = frozenset(m.point for m in marks if m.kind == "update")  # points inside the optimizer's step
        self.step_start = min((m.point for m in marks if m.kind == "step"), default=None)

    def time_s(self, decisions) -> float:
        """Simulated iteration time within the budget (inf when the plan does not run there)."""
        time_s = self.simulator.time_if_fits(Plan(decisions=tuple(decisions)), self.budget)
        return float("inf") if time_s is None else time_s

    def polish(self, plan: Plan, deadline: float) -> Plan:
        """The best plan found from `plan` by `deadline` (time.monotonic()); `plan` itself when
        nothing improves it."""
        decisions, best = list(plan.decisions), self.time_s(plan.decisions)
        improved = True
        while improved and time.monotonic() < deadline:
            improved = False
            for trial in self._sweep(decisions):
                if time.monotonic() >= deadline:
                    break
                trial_s = self.time_s(trial)
                if trial_s < best * (1 - BETTER) and not validate(self.fm.trace, Plan(decisions=tuple(trial)),
                                                                  self.budget):
                    decisions, best, improved = trial, trial_s, True
                    break
        return plan if decisions == list(plan.decisions) else Plan(decisions=tuple(decisions))

    def iterate(self, plan: Plan, deadline: float, seed: int = 0, patience: int = PATIENCE) -> Plan:
        """Iterated local search: `plan` polished, then kicked (one to three of its decisions dropped at
        random, seeded) and polished again, the result kept where it is faster and validates, until
        `patience` kicks in a row find nothing faster or `deadline` passes; `plan` itself when nothing
        improves it (gpt2@8 with 4 layers at 70%: auto's 8.66% plan, a local optimum, 7.34% after 120 kicks)."""
        rng = random.Random(seed)
        best = self.polish(plan, deadline)
        best_s, misses = self.time_s(best.decisions), 0
        while misses < patience and time.monotonic() < deadline and len(best.decisions) > 1:
            kicked = list(best.decisions)
            for _ in range(min(rng.choice(KICKS), len(kicked) - 1)):
                kicked.pop(rng.randrange(len(kicked)))
            found = self.polish(Plan(decisions=tuple(kicked)), deadline)
            found_s = self.time_s(found.decisions)
            if found_s < best_s * (1 - BETTER) and not validate(self.fm.trace, found, self.budget):
                best, best_s, misses = found, found_s, 0
            else:
                misses += 1
        return best

    def _sweep(self, decisions: list[Decision]):
        """Every neighbour of `decisions`: feature maps largest first, the other swaps, its prefetches
        issued again, then the other swaps exchanged for feature maps."""
        by_storage = {d.storage: i for i, d in enumerate(decisions)}
        calls = self._region_calls(decisions)
        covered = set()
        for k in self.order:
            sid = int(self.fm.storage[k])
            i = by_storage.get(sid)
            if i is not None and not self._covers(decisions[i], k):
                continue  # a decision on another gap of this storage: left to the moves below
            covered.add(i)
            yield from self._feature_map_moves(decisions, k, i, calls)
        others = [i for i, d in enumerate(decisions) if i not in covered and d.action == "swap"]
        at_end = {i: replace(decisions[i], out_after=self.last) for i in others if self._splits_the_step(decisions[i])}
        for i in others:
            yield decisions[:i] + decisions[i + 1:]
            yield from self._trigger_moves(decisions, i)
            if i in at_end:
                yield decisions[:i] + [at_end[i]] + decisions[i + 1:]
        if len(at_end) > 1:
            yield [at_end.get(i, d) for i, d in enumerate(decisions)]
        again = self._retimed(decisions)
        if again != decisions:
            yield again
        yield from self._waits_merged(decisions)
        free = [k for k in self.order if int(self.fm.storage[k]) not in by_storage][:EXCHANGED_WITH]
        for i in others:
            for k in free:  # prefetches issued again: the feature map's own lead rarely suits the others'
                yield from map(self._retimed, self._feature_map_moves(decisions[:i] + decisions[i + 1:], k, None))

    def _retimed(self, decisions: list[Decision]) -> list[Decision]:
        """`decisions` with every prefetch issued again by §4.5 at a hook point (module docstring)."""
        return list(retimed(self.fm.trace, decisions, self.budget, self.simulator.lowering.sites.after_of))

    def _splits_the_step(self, d: Decision) -> bool:
        """A swap across the boundary prefetched in the next step's head, swapped out before the step's end
        (`d.out_after` may move to the last op: no access comes after it in the step)."""
        return d.wraps and d.prefetch_at <= d.back_before and d.out_after < self.last

    def _waits_merged(self, decisions: list[Decision]):
        """For each update mark inside the optimizer's step that prefetches are waited at, `decisions` with
        those waited at the mark before it instead (the first one's at the step's start), where each was
        issued by then: a wait at a mark splits the step there, a stretch the host pays, and a prefetch
        that landed before an earlier mark can be waited there at no cost (memory is the same: a
        prefetch holds its bytes from its issue on)."""
        before = self.simulator.lowering.sites.before_of
        waited: dict[int, list[int]] = {}  # update mark point -> the swaps waited there
        for i, d in enumerate(decisions):
            point = int(before[d.back_before])
            if d.action == "swap" and d.trigger is not None and point in self.updates:
                waited.setdefault(point, []).append(i)
        points = sorted(waited)
        for earlier, point in zip([self.step_start, *points], points):
            if earlier is None or earlier >= point or any(decisions[i].prefetch_at > earlier for i in waited[point]):
                continue
            moved = {i: replace(decisions[i], back_before=earlier) for i in waited[point]}
            yield [moved.get(i, d) for i, d in enumerate(decisions)]

    def _covers(self, d: Decision, k: int) -> bool:
        return not d.wraps and d.out_after < self.fm.back_before[k] and d.back_before > self.fm.out_after[k]

    def _feature_map_moves(self, decisions: list[Decision], k: int, i: int | None, calls: dict | None = None):
        fm = self.fm
        out, back = int(fm.out_after[k]), int(fm.back_before[k])
        swap = Decision(storage=int(fm.storage[k]), action="swap", out_after=out, back_before=back,
                        trigger=fm.trigger(k, back, self.lead))
        recompute = Decision(storage=int(fm.storage[k]), action="recompute", out_after=out, back_before=back)
        if i is None:
            yield decisions + [swap]
            if fm.recomputable[k]:
                yield decisions + [recompute]
                yield from self._aligned(decisions + [recompute], len(decisions), calls)
                yield from self._inputs_back(decisions + [recompute], recompute)
            return
        rest = decisions[:i] + decisions[i + 1:]
        yield rest
        if decisions[i].action == "swap":
            if fm.recomputable[k]:
                yield decisions[:i] + [recompute] + decisions[i + 1:]
                yield from self._aligned(decisions[:i] + [recompute] + decisions[i + 1:], i, calls)
                yield from self._inputs_back(decisions[:i] + [recompute] + decisions[i + 1:], recompute)
            yield from self._trigger_moves(decisions, i)
        else:
            yield decisions[:i] + [swap] + decisions[i + 1:]
            yield from self._with_first_rebuild(decisions, i)
            yield from self._with_region_mates(decisions, i, calls or {})

    def _inputs_back(self, decisions: list[Decision], recompute: Decision):
        """`decisions` without the swaps that have an input of `recompute`'s lineage away when it runs
        (nothing when none does)."""
        at = recompute.back_before
        inputs = set(self.fm.trace.lineage(recompute.storage, at)[1])
        kept = [d for d in decisions if not (d.action == "swap" and d.storage in inputs and d.away_at(at))]
        if len(kept) < len(decisions):
            yield kept

    def _with_first_rebuild(self, decisions: list[Decision], i: int):
        """The recomputation at `i` brought back at the earliest recomputation whose chain rebuilds its
        storage as a passing input: due at one op, the chains run together and rebuild it once
        (`memplan.sim.chains`), where apart it is replayed twice."""
        d = decisions[i]
        away = {}  # storage -> the gaps it is recomputed away in
        for e in decisions:
            if e.action == "recompute":
                away.setdefault(e.storage, []).append((e.out_after, e.back_before))
        dues = sorted({e.back_before for e in decisions if e.action == "recompute"
                       and d.out_after < e.back_before < d.back_before and e.storage != d.storage})
        for at in dues:
            if any(d.storage in self._rebuilt(e.storage, at, away) for e in decisions
                   if e.action == "recompute" and e.back_before == at):
                yield decisions[:i] + [replace(d, back_before=at)] + decisions[i + 1:]
                return

    def _region_calls(self, decisions: list[Decision]) -> dict[int, int]:
        """Per recompute decision (its position in `decisions`), the module call the hooked executor runs
        again for it (memplan.sim.regions), where the plan runs hooked (none where it runs interpreted:
        its chains are not module calls)."""
        if self.simulator.lowering is None or self.simulator.run(Plan(decisions=tuple(decisions)),
                                                                 self.budget).level != HOOKED:
            return {}
        return self._calls_of(decisions)

    def _calls_of(self, decisions: list[Decision]) -> dict[int, int]:
        """`_region_calls` of the hooked form of `decisions`, whether or not it is the one that runs."""
        lowered = self.simulator.lowering.lower(tuple(decisions))
        kept = range(len(decisions)) if lowered.kept is None else lowered.kept.tolist()
        return {kept[j]: run.call for j, run in lowered.regions.items()}

    def _with_region_mates(self, decisions: list[Decision], i: int, calls: dict[int, int]):
        """The recomputation at `i` brought back with each earlier one that the same module call runs again
        for (`calls`), the nearest first: due at one hook point, one run rebuilds them both."""
        call, d = calls.get(i), decisions[i]
        if call is None:
            return
        dues = {decisions[j].back_before for j, c in calls.items() if c == call and j != i}
        for at in sorted((at for at in dues if d.out_after + 1 < at < d.back_before), reverse=True):
            yield decisions[:i] + [replace(d, back_before=at)] + decisions[i + 1:]

    def _aligned(self, decisions: list[Decision], i: int, calls: dict | None):
        """`decisions` with the new recomputation at `i` and every one that the same module call runs again for
        due at the earliest of theirs (one run rebuilds them all), where that moves any; only where the plan
        it changes runs hooked and recomputes (`calls`, that plan's `_region_calls`, not empty)."""
        if not calls:
            return
        runs = self._calls_of(decisions)  # the trial's: the new recomputation may change which call runs
        if i not in runs:
            return
        mates = [j for j, c in runs.items() if c == runs[i]]
        at = min(decisions[j].back_before for j in mates)
        moved = {j: replace(decisions[j], back_before=at) for j in mates
                 if decisions[j].out_after + 1 < at < decisions[j].back_before}
        if moved:
            yield [moved.get(j, d) for j, d in enumerate(decisions)]

    def _rebuilt(self, storage: int, at: int, away: dict) -> set[int]:
        """The storages a chain rebuilding `storage` before op `at` rebuilds on the way: the inputs of its
        lineage recomputed away then, and theirs (as `memplan.sim.chains` visits them)."""
        trace, seen, todo = self.fm.trace, set(), [storage]
        while todo:
            for r in trace.lineage(todo.pop(), at)[1]:
                if r not in seen and any(lo < at < hi for lo, hi in away.get(r, ())):
                    seen.add(r)
                    todo.append(r)
        return seen

    def _trigger_moves(self, decisions: list[Decision], i: int):
        """The swap at `i` with its prefetch one backward layer start earlier, then later (within its gap;
        across the iteration boundary, in the head: before it is due)."""
        d = decisions[i]
        at = d.prefetch_at
        if d.wraps and at > d.out_after:
            return  # prefetched in the tail, for the next iteration: left as planned
        earlier = bisect.bisect_left(self.starts, at) - 1
        later = bisect.bisect_right(self.starts, at)
        first = -1 if d.wraps else d.out_after  # a head prefetch may be issued from the first op on
        for j in (earlier, later):
            if 0 <= j < len(self.starts) and first < self.starts[j] <= d.back_before:
                yield decisions[:i] + [replace(d, trigger=self.starts[j])] + decisions[i + 1:]
