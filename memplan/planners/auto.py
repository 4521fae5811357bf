"""`auto`: the planner to use when you do not know which one to use.

Within one time limit (default 20 s) it
1. proves a lower bound on the overhead of every plan (`memplan.planners.bound`) with
   BOUND_SHARE of the limit;
2. runs the fast planners (FAST: Capuchin, TFLMS, SuperNeurons, AutoSwap's scores, the
   PyTorch-style baselines) and the plan of the fewest swaps, largest storages first
   (`memplan.planners.kit.cover`: what a host that pays per decision wants), each scored by the
   simulator at the budget, then DTR's search for a plan within the budget (`dtr_within`,
   DTR_SHARE of the time left);
3. runs AutoSwap's Bayesian-optimised weights (`autoswap:bo`) for BO_SHARE of the time left;
4. runs `milp` when its model is small enough to be solved whole (at most MILP_MAX_GROUPS
   decision groups, `whole_gaps`; over saved activations only when the model over every storage is
   larger), for MILP_SHARE of the time left (on larger models the decomposition improves too
   slowly to be worth the time, unless no fast planner reaches the budget: then milp over every
   storage runs, decomposed, since it moves what the others cannot, such as optimizer state
   across the iteration boundary);
5. searches locally from the plans of the best REFINED candidates so far, milp's included: over
   policies (`memplan.planners.kit.refine`), then on the better plan itself
   (`memplan.planners.kit.plan_search`: its own prefetch ops kept, one decision changed at a
   time), sharing the time left until each reaches a local optimum;
6. runs `home:seeded` (HOME's swarm seeded with the fast planners' plans; SWARM_PARTICLES
   particles for at most SWARM_ITERS iterations) within what is left but step 8's share;
7. with time still left, runs milp over every storage warm-started from the best plan so
   far (its decomposition on a large model, never worse than that start in the simulator;
   FINISH_SHARE of the limit, at least FINISH_S, is kept back: HiGHS and scoring the plans
   overrun a solve's own limit);
8. with the time left (SETTLE_SHARE of the limit is kept for it), an iterated local search on the
   best plan itself (`PlanSearch.iterate`: one to three of its decisions dropped at random, seeded,
   and the plan searched again, until PATIENCE such kicks in a row find nothing faster);
9. returns the plan of least simulated time that validates and fits the budget.

`plan.report` names the plan chosen (`chosen`), the planner whose plan it refined
(`refined_from`), every candidate's simulated overhead, the bound (`bound`) and the chosen plan's
distance to it (`gap`), and milp's own bound where milp ran (`milp_bound`). Deterministic for a
seed whenever nothing is cut short by the time limit (on small traces); on large ones how far
each step gets depends on the machine's speed.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import InfeasibleBudgetError, MemplanError
from ..model import Plan
from ..problem import Problem
from ..sim.simulate import Simulator
from ..sim.validate import validate
from .base import get_planner, infeasible, register
from .dtr import dtr_within
from .bound import Bound, lower_bound
from .kit.cover import largest_first
from .kit.featuremaps import DEFAULT_MIN_BYTES
from .kit.fitting import smallest_fitting_budget
from .kit.policy import CAP_RESOLUTION
from .kit.polish import Polisher
from .kit.refine import policy_of_bound
from .kit.searched import search_report
from .milp import MAX_DIRECT_GROUPS, solve_milp
from .milp.layers import MOVES, whole_gaps

log = logging.getLogger(__name__)

# Not DTR as a planner: quick where it fits, but naming the smallest budget it reaches took 106 s on
# hf:gpt2@8 at 50%; auto runs its search for a fitting plan only (`dtr_within`).
FAST = ("capuchin", "tflms", "superneurons", "autoswap:doa", "autoswap:swdoa", "sqrt-n", "checkpoint-all",
        "save-on-cpu")
LARGEST_FIRST = "largest-first"  # the candidate name of the plan of `memplan.planners.kit.cover`
DEFAULT_TIME_LIMIT_S = 20.0
DTR_SHARE = 0.1  # of the time left after the fast planners, for DTR's plan (not its refusal: see FAST)
BO_SHARE = 0.25  # of the time left after the fast planners, for autoswap:bo
BO_MIN_S = 1.0  # autoswap:bo is not started with less time than this
MILP_SHARE = 0.5  # of the time left after autoswap:bo
MILP_MAX_GROUPS = MAX_DIRECT_GROUPS  # larger models (decomposed, slow to improve) are left to the other steps
MILP_MIN_S = 2.0  # milp is not started with less time than this
MILP_MAX_S = 60.0  # ... nor given more: its decomposition improves too slowly to be worth more (on
# resnet18-cifar@8 at 70%, one sweep over the whole model took 4 minutes and improved nothing)
DONE_GAP = 1e-3  # a candidate this close to the bound (in overhead) ends the search: nothing left to find
REFINED = 3  # candidates the local search starts from (and the plan of the bound's LP: BOUND_START)
BOUND_START = "bound"  # the start named for the lower bound's LP solution (memplan.planners.kit.refine.policy_of_bound)
BOUND_SHARES = (0.5, 0.25, 0.1)  # ... a feature map is moved where the LP keeps at least this share of it away
BOUND_SHARE = 0.15  # of the time limit for the lower bound of every plan (memplan.planners.bound)
FINISH_S, FINISH_SHARE = 2.0, 0.1  # kept back from the last milp (seconds, share of the limit): its
# solves and the scoring of its plans end up to a few seconds past its own limit on large traces
SETTLE_SHARE = 0.1  # of the limit kept from the swarm and the last milp for the iterated search (step 8)
SWARM_MIN_S = 2.0  # home:seeded runs with the time left when at least this much is
SWARM_ITERS, SWARM_PARTICLES = 50, 100  # its size: it ends on its own on small traces (a result that a time cut
# does not decide), and within the limit on large ones


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One plan `auto` considered."""

    name: str  # the planner (or "refined:<planner>") that made it
    plan: Plan  # the plan
    time_s: float  # its simulated iteration time at the budget
    overhead: float  # its simulated overhead


@register("auto", "the best simulated plan of the fast planners, milp and a local search, within a time limit",
          decides=("swap", "recompute"), simulated=True)
def plan_auto(problem: Problem, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, min_bytes: int = DEFAULT_MIN_BYTES,
              milp: bool = True, swaps: bool = True) -> Plan:
    """The best plan `auto` finds within `time_limit_s` (see the module docstring).

    Args:
        problem: the trace, its cap, its costs and the seed (memplan.problem).
        time_limit_s: wall-clock limit for all steps (a fast planner already running finishes).
        min_bytes: smaller activations are not feature maps for milp and the local search (nor
            candidates of the fast planners that take a `min_bytes`, where theirs is larger).
        milp: run milp (steps 2 and 5; false: never).
        swaps: consider plans that swap (false: recompute only, as a compiled step on the CPU runs them).
    Returns:
        The plan; `plan.report` says which planner's plan was chosen or refined, every
        candidate's simulated overhead, and milp's bound and status where it ran.
    Raises:
        InfeasibleBudgetError: no candidate fits; names the smallest load one of them reaches.
        MemplanError: a time limit that is not positive.
    """
    trace, budget_bytes, cost = problem.trace, problem.budget_bytes, problem.cost
    if not time_limit_s > 0:
        raise MemplanError(f"planner 'auto': parameter time_limit_s must be positive, got {time_limit_s!r}")
    if budget_bytes >= trace.peak_load_bytes:
        return Plan(report={"chosen": "none", "refined_from": None, "candidates": {"none": 0.0}, "bound": 0.0,
                            "gap": 0.0, "note": "the budget holds the unconstrained peak: nothing moves"})
    search = _Search(problem, time_limit_s, min_bytes, swaps)
    search.bound = lower_bound(trace, budget_bytes, cost, time_limit_s=BOUND_SHARE * time_limit_s)
    steps = [search.fast, search.bayesian] + ([search.milp] if milp else []) + [search.refine, search.swarm] + (
        [search.decompose] if milp else []) + [search.settle]
    for step in steps:
        step()
        if search.at_the_bound():
            break
    return search.result()


class _Search:
    """The candidates so far, the loads the infeasible ones named, and milp's report."""

    def __init__(self, problem: Problem, limit_s: float, min_bytes: int, swaps: bool = True):
        self.problem = problem
        self.swaps = swaps  # False: a plan that swaps is no candidate
        self.trace, self.budget, self.cost, self.seed = problem.trace, problem.budget_bytes, problem.cost, problem.seed
        self.started = time.monotonic()
        self.limit_s, self.deadline, self.min_bytes = limit_s, self.started + limit_s, min_bytes
        self.simulator = Simulator(self.trace, self.cost)
        self.evaluated_by_planners = 0  # plans the searching planners it ran evaluated (their reports)
        self.candidates: list[Candidate] = []
        self.named: dict[str, int] = {}  # planner -> the smallest load its infeasible-budget error named
        self.milp_report: dict | None = None
        self.bound: Bound | None = None  # the lower bound of every plan

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def at_the_bound(self) -> bool:
        """A candidate within DONE_GAP of the proven bound: no step can find much better."""
        bound = self.bound.overhead if self.bound is not None else None
        return bound is not None and math.isfinite(bound) and any(c.overhead <= bound + DONE_GAP for c in self.candidates)

    def add(self, name: str, plan: Plan) -> None:
        """Score `plan` and keep it when the simulator runs it within the budget (and swaps only where
        swaps are allowed)."""
        if not self.swaps and any(d.action == "swap" for d in plan.decisions):
            log.debug("auto: %s's plan swaps, and swaps are off", name)
            return
        result = self.simulator.run(plan, self.budget)
        if result.feasible and result.peak_load_bytes <= self.budget:
            self.candidates.append(Candidate(name=name, plan=plan, time_s=result.time_s, overhead=result.overhead))
        else:
            self.named[name] = smallest_fitting_budget(self.simulator, plan, self.budget,
                                                       resolution_share=CAP_RESOLUTION)

    def ranked(self) -> list[Candidate]:
        return sorted(self.candidates, key=lambda c: (c.time_s, c.name))

    def run_planner(self, name: str, **params) -> None:
        """Plan with registered planner `name` (its defaults and `params`) and keep its plan as a
        candidate, or the load its infeasible-budget error names."""
        spec = get_planner(name)
        try:
            plan = spec.fn(self.problem, **spec.defaults, **params)
            self.evaluated_by_planners += plan.report.get("evaluations", 0)
            self.add(name, plan)
        except InfeasibleBudgetError as exc:
            self.named[name] = exc.min_feasible_bytes

    def fast(self) -> None:
        """Step 2: every fast planner (all of them run: they take a fraction of a second each) and the
        largest storages first, then DTR's plan where it fits (its caps tried within DTR_SHARE of the
        time left)."""
        for name in FAST:
            spec = get_planner(name)
            if self.swaps or "recompute" in spec.decides:
                # a planner that leaves small storages out leaves out no more than auto's own search does
                sized = {p.name: min(self.min_bytes, p.default) for p in spec.params if p.name == "min_bytes"}
                self.run_planner(name, **sized)
        few = largest_first(self.trace, self.budget, self.min_bytes)
        if few is not None:
            self.add(LARGEST_FIRST, Plan(decisions=few))
        found = dtr_within(self.trace, self.cost, self.simulator, self.budget,
                           time.monotonic() + DTR_SHARE * self.left())
        if found is not None:
            self.add("dtr", found)

    def bayesian(self) -> None:
        """Step 3: AutoSwap's weights tuned by Bayesian optimisation, for BO_SHARE of the time left."""
        share = BO_SHARE * self.left()
        if share >= BO_MIN_S and self.swaps:  # AutoSwap only swaps
            self.run_planner("autoswap:bo", time_limit_s=share)

    def milp(self) -> None:
        """Step 4: milp on a model small enough to solve whole."""
        share = min(MILP_SHARE * self.left(), MILP_MAX_S)
        if share < MILP_MIN_S:
            return
        moves = next((m for m in MOVES if len(whole_gaps(self.trace, self.cost, self.min_bytes, self.budget, m))
                      <= MILP_MAX_GROUPS), None)
        if not self.candidates:  # nothing reaches the budget yet: the model over every storage, decomposed if large
            moves = MOVES[0]
        if moves is None:
            log.info("auto: milp skipped (more than %d decision groups even over activations only)", MILP_MAX_GROUPS)
            return
        try:
            plan = solve_milp(self.trace, self.budget, self.cost, time_limit_s=share, min_bytes=self.min_bytes,
                              moves=moves, bound=self.bound)
        except InfeasibleBudgetError as exc:
            self.named["milp"] = exc.min_feasible_bytes
            return
        self.milp_report = {**plan.report, "moves": moves}
        self.add("milp", plan)

    def refine(self) -> None:
        """Step 5: from each of the best REFINED candidates and the bound's plan, sharing the time left:
        the local searches of `memplan.planners.kit.polish` (over policies for half of its share, then
        on the better plan itself); never slower than the candidate it starts from."""
        polisher = self.polisher
        if polisher is None:
            return
        fm, evaluator = polisher.fm, polisher.evaluator
        starts = [(c.name, c.plan) for c in self.ranked()[:REFINED]]
        away = self.bound.away if self.bound is not None else {}
        # the LP's plan at the share away that scores best (one that fits, else the least over the budget)
        guided = min((policy_of_bound(fm, away, share) for share in BOUND_SHARES), key=evaluator)
        if guided.any():  # whether or not it fits: the search moves it to where it does
            starts.append((BOUND_START, evaluator.plan(guided)))
        for i, (name, plan) in enumerate(starts):
            share = self.left() / (len(starts) - i)
            if share <= 0:
                break
            polished = polisher.polish(plan, time.monotonic() + share)
            if polished is not plan or name == BOUND_START:
                self.add(f"refined:{name}", polished)

    @cached_property
    def polisher(self) -> Polisher | None:
        """The local searches over this problem's feature maps (made when first needed; None where it has none)."""
        return Polisher.of(self.trace, self.cost, self.budget, self.simulator, self.min_bytes)

    def swarm(self) -> None:
        """Step 6: with time left after the local searches, `home:seeded` with the rest of it but step 8's."""
        left = self.left() - SETTLE_SHARE * self.limit_s
        if left >= SWARM_MIN_S:
            self.run_planner("home:seeded", time_limit_s=left, workers=1, min_bytes=self.min_bytes,
                             iters=SWARM_ITERS, particles=SWARM_PARTICLES)

    def decompose(self) -> None:
        """Step 7: with time left, milp over every storage warm-started from the best plan so far
        (decomposed on a large model; never worse than its start in the simulator; without milp's
        fallback, made after its solves: it would end past the limit, and those plans are candidates)."""
        kept = max(FINISH_S, FINISH_SHARE * self.limit_s) + SETTLE_SHARE * self.limit_s
        left, ranked = min(self.left() - kept, MILP_MAX_S), self.ranked()
        if left < MILP_MIN_S or not ranked or (self.milp_report or {}).get("moves") == MOVES[0]:
            return
        try:
            plan = solve_milp(self.trace, self.budget, self.cost, time_limit_s=left, min_bytes=self.min_bytes,
                              start=ranked[0].plan.decisions, bound=self.bound, fallback=False)
        except InfeasibleBudgetError:
            return
        self.milp_report = {**plan.report, "moves": MOVES[0], "started_from": ranked[0].name}
        self.add(f"milp from {ranked[0].name}", plan)

    def settle(self) -> None:
        """Step 8: with the time left (SETTLE_SHARE of the limit kept for it), the iterated search on the plan
        itself from the best candidate (`PlanSearch.iterate`: its local optimum kicked and searched again)."""
        ranked, polisher = self.ranked(), self.polisher
        if not ranked or polisher is None or self.left() <= 0:
            return
        settled = polisher.search.iterate(ranked[0].plan, self.deadline, self.seed)
        if settled is not ranked[0].plan:
            self.add(f"refined:{ranked[0].name}", settled)

    def result(self) -> Plan:
        """Step 9: the best candidate that validates; the infeasible-budget error without one."""
        for chosen in self.ranked():
            if not validate(self.trace, chosen.plan, self.budget):
                return chosen.plan.with_meta(report=self._report(chosen))
            log.warning("auto: %s's plan does not validate; trying the next", chosen.name)
        # the load named is one a fast planner reaches: they always run, whatever the time left, so auto
        # plans there again (a search's load may not be reached again within the time limit)
        fast = [self.named[name] for name in FAST if name in self.named]
        raise infeasible(self.budget, min(fast, default=self.trace.peak_load_bytes), "auto")

    def _report(self, chosen: Candidate) -> dict:
        milp = self.milp_report or {}
        bound = self.bound.report() if self.bound is not None else {"bound": None}
        finite = bound["bound"] is not None and np.isfinite(bound["bound"])
        searched = search_report(self.simulator.evaluations + self.evaluated_by_planners,
                                 time.monotonic() - self.started)
        return {"chosen": chosen.name, "overhead": chosen.overhead, **searched,
                "refined_from": chosen.name.split(":", 1)[1] if chosen.name.startswith("refined:") else None,
                "candidates": {c.name: round(c.overhead, 6) for c in self.ranked()},
                "infeasible": dict(sorted(self.named.items())), **bound,
                "gap": float(np.float64(chosen.overhead - bound["bound"])) if finite else None,
                "milp_bound": milp.get("milp_bound"), "milp_status": milp.get("status")}
