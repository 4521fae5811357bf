"""`milp`: the optimum of keep / swap / recompute per gap of every storage that can move, as a
0-1 MILP solved by HiGHS: the reference the other planners are measured against.

In the spirit of Checkmate (recomputation as a MILP over the schedule), extended with
swap-out and prefetch decisions on the two copy lanes, at the layer granularity of HOME
(paper 004): the decision units (`memplan.planners.milp.layers`) are the gaps between two accesses of every
storage of at least `min_bytes` that span an op over the budget (activations, weights,
gradients, inputs; weights and optimizer state also across the iteration boundary), each
kept, swapped to the host after the access before the gap and prefetched before the one after
it, or (not across the boundary, when the storage can be rebuilt) dropped then and recomputed
right before it; a swap may also end early, at a recomputation that reads the storage. Time
and memory are tracked at positions: the first op of every layer, plus the ops where a unit
may leave or must be back. Models with more than `max_direct_groups` decision groups are
decomposed (`memplan.planners.milp.decompose`); the others are solved whole.

What the MILP models of the simulator's semantics (memplan.sim.simulate):
- the compute stream: segments run in order; before the op a feature map is due at, the
  recomputations there run (every op of their chains once: chains at one op share what they
  rebuild), then the op waits for the prefetches due there (and prefetches that those chains
  read land before the chains run);
- the device-to-host lane: FIFO in swap-out order, each copy starting when its op ends, and
  done by the step's end (the step waits for it there) but for one after the step's last op,
  which is carried over: copied at the next step's start, before that step's own swap-outs,
  its bytes held there until it is released (by its prefetch at the latest);
  the host-to-device lane: FIFO in prefetch order, a copy starting at its trigger, after the
  previous one and after its own swap-out reached the host;
- memory at every segment and before every recomputation, within the budget: a swapped map
  holds its bytes until it is released at a position whose start is after its copy ended (the
  simulator releases at the first such op, or waits there for the copy when memory is needed:
  the MILP charges that wait), and again from its trigger on (twice, when the trigger comes
  before the release: the simulator allocates the prefetch while the swap-out still holds its
  bytes); a recomputed map holds none during its gap; before an op, the chains' targets,
  their temporarily rebuilt inputs and the largest replayed op's discarded outputs count.
What it approximates (the simulator is the judge of every plan, and reports the overhead):
- within a segment the decisions are fixed: releases and triggers happen only at positions
  (`window` of them at each end of a gap, or the whole gap with window=0; for a storage across
  the boundary also up to `window` of the positions ending a stretch over the budget, and for a
  copy carried over of the positions over it), and a segment's load is its largest op's; on
  traces whose every op starts a layer this is exact;
- a wait for memory is charged at the start of a position, before its prefetches are issued
  (the simulator may wait later, at the allocation that needs the room);
- the chains before one op are charged as if all ran at once (their temporaries all alive
  with the largest discarded output), an upper bound on the simulator's chain-by-chain load;
- prefetch triggers follow the order of first backward access (the FIFO order of the lane);
- a recomputation may read a swapped storage only through a swap ending at that op (a
  variant for the inputs of the targets' own writers; deeper inputs of a chain must be
  resident or rebuilt: the validator forbids reading data that is on the host);
- a storage across the iteration boundary is prefetched in the head of the iteration only
  (the simulator also allows a prefetch in the tail);
- compression is not decided (traces carry no measured ratio per tensor).
So the simulated overhead of the chosen plan is at most the MILP objective when no wait is
charged early, and both are reported. The MILP's proven lower bound and gap (`milp_bound`; when
decomposed, the bound of the LP relaxation) bound the best plan in the model, not every schedule
the simulator could run (`milp_bound_scope` in the report says so); `bound` in the report is the
lower bound of every plan (`memplan.planners.bound`), and `gap` the plan's distance to it.

The plan is validated and simulated at the budget; a plan the validator rejects has the
offending action forbidden and is solved again, one whose simulated peak exceeds the budget
is solved again under a budget lowered by the excess (at most `MAX_ROUNDS` solves in all).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ...cost.model import Cost
from ...errors import InfeasibleBudgetError, MemplanError
from ...model import Decision, Plan, Trace
from ...problem import Problem
from ...sim.simulate import Simulator
from ...sim.validate import OVER_BUDGET, static_load, validate
from ..base import infeasible, register
from ..bound import Bound, lower_bound
from ..kit.linear import MS
from ..kit.prefetch import in_issue_order
from .decompose import decompose
from .finish import START_PLANNERS, below_the_floor, fast_start, never_worse, with_bound
from .layers import ACTIVATIONS, MOVES, LayerProblem, layer_problem, movable_gaps
from .host import host_price
from .model import build

log = logging.getLogger(__name__)

DEFAULT_MIN_BYTES = 2**20  # smaller saved activations (batch-norm statistics, biases) are kept
DEFAULT_WINDOW = 16  # release and trigger positions per swapped feature map
DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_GAP = 1e-4  # HiGHS stops when the overhead is proven within this share of the optimum
MAX_ROUNDS = 4  # solves per plan: the first, then after a rejected or overshooting plan
OPTIMAL = 0  # scipy.optimize.milp's status code for a proven optimum
BOUND_SCOPE = ("a lower bound on the overhead of every plan in the model: keep, swap or recompute per gap of "
               "every storage of at least min_bytes, releases and prefetches at positions, segment loads")
MAX_DIRECT_GROUPS = 64  # larger problems are decomposed
MAX_UNITS = 600  # with more movable gaps than this (hf:gpt2 with 12 layers: 1271), only saved activations move
ACTIVATIONS_SHARE = 0.4  # of the time limit for the activations-only model the decomposition starts from
BOUND_SHARE = 0.25  # of the time limit for the LP relaxation's bound, when decomposed
SIM_BOUND_SHARE = 0.2  # of the time limit for the lower bound of every plan (memplan.planners.bound)
MIN_SOLVE_S = 1.0  # the MILP's time limit after that bound, at least


@register("milp", "keep/swap/recompute per gap of every movable storage, the MILP optimum (HiGHS) on the "
                  "layer view", decides=("swap", "recompute"))
def plan_milp(problem: Problem, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S, mip_rel_gap: float = DEFAULT_GAP,
              min_bytes: int = DEFAULT_MIN_BYTES, window: int = DEFAULT_WINDOW,
              max_direct_groups: int = MAX_DIRECT_GROUPS, moves: str = "all") -> Plan:
    """The plan of least overhead in the MILP, checked by the validator and the simulator.

    Args:
        trace, budget_bytes, cost, seed: see `memplan.planners.base` (HiGHS is deterministic;
            the seed is not used).
        time_limit_s: wall-clock limit for all solves; the best plan found by then is returned,
            with its bound and gap (every unit swapped when HiGHS found none).
        mip_rel_gap: relative gap on the overhead at which the solver stops.
        min_bytes: smaller storages stay resident.
        window: positions at each end of a gap where a swap may be released and prefetched
            (0: the whole gap).
        max_direct_groups: with more decision groups than this the model is decomposed
            (`memplan.planners.milp.decompose`) instead of solved whole, starting from the
            smaller model over saved activations only, solved whole when it is small enough,
            or from the fast planners' best plan.
        moves: "all" (every gap of every storage) or "activations" (saved activations from
            their last forward to their first backward access only: a smaller model).
    Returns:
        The plan; `plan.report` holds the MILP's objective, bound and gap, the solve time
        and the simulated overhead.
    Raises:
        InfeasibleBudgetError: the budget is below the floor (the load with every unit of the model
            away for its whole gap: no plan over these units goes lower) and no plan of the fast
            planners, DTR or autoswap:bo fits it either; it names the floor.
        MemplanError: a bad parameter.
    """
    trace, budget_bytes, cost = problem.trace, problem.budget_bytes, problem.cost
    return solve_milp(trace, budget_bytes, cost, time_limit_s=time_limit_s, mip_rel_gap=mip_rel_gap,
                      min_bytes=min_bytes, window=window, max_direct_groups=max_direct_groups, moves=moves)


def solve_milp(trace: Trace, budget_bytes: int, cost: Cost, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
               mip_rel_gap: float = DEFAULT_GAP, min_bytes: int = DEFAULT_MIN_BYTES, window: int = DEFAULT_WINDOW,
               max_direct_groups: int = MAX_DIRECT_GROUPS, start: tuple[Decision, ...] | None = None,
               moves: str = "all", bound: Bound | None = None, fallback: bool = True) -> Plan:
    """`milp`'s plan (see `plan_milp`), the decomposition starting from `start` (another
    planner's decisions) when one is given; never slower in the simulator than `start`, nor,
    when HiGHS proved nothing and `fallback` holds, than the fast planners' best plan (made after the
    solves, up to 25 s more: `memplan.planners.milp.finish`; a caller that has their plans, `auto`,
    passes False). Its report holds the lower bound of every plan (`memplan.planners.bound`: `bound`,
    or one found with SIM_BOUND_SHARE of the time limit) and the gap to it."""
    _check(time_limit_s, mip_rel_gap, moves)
    started = time.perf_counter()
    if bound is None:
        bound = lower_bound(trace, budget_bytes, cost, time_limit_s=SIM_BOUND_SHARE * time_limit_s)
    left = max(time_limit_s - (time.perf_counter() - started), MIN_SOLVE_S)
    try:
        plan = _solve(trace, budget_bytes, cost, time_limit_s=left, mip_rel_gap=mip_rel_gap, min_bytes=min_bytes,
                      window=window, max_direct_groups=max_direct_groups, start=start, moves=moves)
    except InfeasibleBudgetError as exc:  # below the model's floor: another planner's units may go lower
        if not fallback:
            raise
        return with_bound(below_the_floor(trace, budget_bytes, cost, time_limit_s, exc), bound)
    return with_bound(never_worse(trace, budget_bytes, cost, plan, start, time_limit_s if fallback else None), bound)


def _solve(trace: Trace, budget_bytes: int, cost: Cost, *, time_limit_s: float, mip_rel_gap: float, min_bytes: int,
           window: int, max_direct_groups: int, start: tuple[Decision, ...] | None, moves: str) -> Plan:
    """The MILP's plan (whole or decomposed), before the comparisons of `solve_milp`."""
    started = time.perf_counter()
    if moves != ACTIVATIONS and len(movable_gaps(trace, cost, min_bytes, budget_bytes)) > MAX_UNITS:
        log.warning("milp: more than %d movable gaps; deciding saved activations only", MAX_UNITS)
        moves = ACTIVATIONS
    if budget_bytes >= trace.peak_load_bytes:
        return Plan(report=_trivial_report(layer_problem(trace, cost, min_bytes, budget_bytes, moves)))
    problem = layer_problem(trace, cost, min_bytes, budget_bytes, moves)
    fallback = swap_everything(problem)
    floor = int(static_load(trace, list(fallback)).max())
    if budget_bytes < floor:
        raise infeasible(budget_bytes, floor, "milp")
    # making the model takes seconds on a large trace: the solves have what is left
    search = _Search(trace, cost, problem, budget_bytes, window, mip_rel_gap,
                     max(time_limit_s - (time.perf_counter() - started), MIN_SOLVE_S))
    if len(problem.groups()) <= max_direct_groups:
        return search.run(fallback)
    origin = "the given start"
    if start is None and moves != ACTIVATIONS:
        start, origin = _activations_start(trace, budget_bytes, cost, search, min_bytes, window,
                                           max_direct_groups), "the activations-only model"
    if start is None:
        start, origin = fast_start(trace, budget_bytes, cost, search.simulator), "the fast planners' best plan"
    return search.run_decomposed(fallback, start, origin)


def _activations_start(trace: Trace, budget_bytes: int, cost: Cost, search: "_Search", min_bytes: int, window: int,
                       max_direct_groups: int) -> tuple[Decision, ...] | None:
    """The plan of the model over saved activations only, when it is small enough to solve whole
    (with ACTIVATIONS_SHARE of the time), for the decomposition to start from; None otherwise."""
    small = layer_problem(trace, cost, min_bytes, budget_bytes, ACTIVATIONS)
    if len(small.groups()) > max_direct_groups or not small.units:
        return None
    floor = int(static_load(trace, list(swap_everything(small))).max())
    if budget_bytes < floor:
        return None
    limit = ACTIVATIONS_SHARE * (search.deadline - time.perf_counter())
    plan = _Search(trace, cost, small, budget_bytes, window, search.gap, limit).run(swap_everything(small))
    return plan.decisions if plan.report.get("milp_overhead") is not None else None


def swap_everything(problem: LayerProblem) -> tuple[Decision, ...]:
    """Every unit's whole gap swapped, prefetched at the op that needs it: the lowest load any plan
    over these units reaches, and a valid plan that fits any budget above it."""
    whole = [problem.units[k] for k in problem.base_units()]
    return in_issue_order(Decision(storage=u.storage, action="swap", out_after=u.out_after, back_before=u.back_before,
                                   trigger=u.back_before) for u in whole)


def _check(time_limit_s: float, mip_rel_gap: float, moves: str) -> None:
    if moves not in MOVES:
        raise MemplanError(f"planner 'milp': parameter moves must be one of {', '.join(MOVES)}, got {moves!r}")
    if not time_limit_s > 0:
        raise MemplanError(f"planner 'milp': parameter time_limit_s must be positive, got {time_limit_s!r}")
    if not mip_rel_gap < 1:
        raise MemplanError(f"planner 'milp': parameter mip_rel_gap must be below 1, got {mip_rel_gap!r}")


class _Search:
    """Solve, check with the validator and the simulator, tighten and solve again."""

    def __init__(self, trace: Trace, cost: Cost, problem: LayerProblem, budget_bytes: int, window: int,
                 gap: float, time_limit_s: float):
        self.trace, self.problem, self.budget = trace, problem, budget_bytes
        self.window, self.gap = window, gap
        self.deadline = time.perf_counter() + time_limit_s
        self.simulator = Simulator(trace, cost)
        self.host = host_price(problem, self.simulator, cost)
        self.unit_of = {(u.storage, u.out_after, u.back_before): k for k, u in enumerate(problem.units)}
        self.forbidden: set = set()
        self.solve_s = 0.0

    def run(self, fallback: tuple[Decision, ...]) -> Plan:
        """The first MILP plan that validates and fits the budget in the simulator; `fallback`
        when HiGHS finds none in time (or the rounds run out)."""
        model_budget = self.budget
        for rounds in range(1, MAX_ROUNDS + 1):
            model = build(self.problem, model_budget, self.window, self.forbidden, self.host)
            result = self._solve(model)
            if result.x is None:
                log.warning("milp: %s; every feature map is swapped instead", result.message.strip())
                break
            plan = Plan(decisions=model.decisions(result.x))
            excess = self._excess(plan)
            if excess == 0:
                return plan.with_meta(report=self._report(model, result, plan, model_budget, rounds))
            if excess is not None:
                model_budget -= excess
            log.info("milp round %d: %s; solving again", rounds,
                     "the validator rejected actions" if excess is None else f"{excess} bytes over the budget")
        else:
            log.warning("milp: no plan within the budget after %d solves; every feature map is swapped instead",
                        MAX_ROUNDS)
        plan = Plan(decisions=fallback)
        return plan.with_meta(report=self._report(model, result, plan, model_budget, rounds, fallback=True))

    def run_decomposed(self, fallback: tuple[Decision, ...], start: tuple[Decision, ...] | None, origin: str) -> Plan:
        """The decomposition's plan (`memplan.planners.milp.decompose`) from `start`, with the LP
        relaxation's bound; the best simulated of it, `start` and `fallback` that validates and fits
        (`chosen` in the report says which)."""
        model = build(self.problem, self.budget, self.window, self.forbidden, self.host)
        started = time.perf_counter()
        relaxed = model.solve(BOUND_SHARE * (self.deadline - started), 0.0, relax=True)
        bound = float(relaxed.fun) if relaxed.status == OPTIMAL else None
        outcome = decompose(model, start, self.deadline, self.gap)
        self.solve_s = time.perf_counter() - started
        named = ([("decomposition", Plan(decisions=model.decisions(outcome.x)))] if outcome else []) + \
            ([(f"start: {origin}", Plan(decisions=start))] if start else []) + [("every unit swapped", Plan(decisions=fallback))]
        plan = self._best_fitting([p for _, p in named])
        base = MS * self.problem.baseline_s
        objective = None if outcome is None else outcome.objective / base
        report = self._figures(plan, "decomposed", objective, None if bound is None else max(0.0, bound) / base, model)
        report.update(solves=0 if outcome is None else outcome.solves, sweeps=0 if outcome is None else outcome.sweeps,
                      started_from=origin if outcome is not None and outcome.seeded else "every unit swapped",
                      chosen=next(name for name, p in named if p is plan))
        return plan.with_meta(report=report)

    def _best_fitting(self, plans: list[Plan]) -> Plan:
        """The plan of least simulated time among those that validate and fit (the last one otherwise)."""
        fitting = [p for p in plans if self._excess(p) == 0]
        return min(fitting or plans[-1:], key=lambda p: self.simulator.run(p, self.budget).time_s)

    def _solve(self, model):
        started = time.perf_counter()
        result = model.solve(self.deadline - started, self.gap)
        self.solve_s += time.perf_counter() - started
        return result

    def _excess(self, plan: Plan) -> int | None:
        """0 when the plan validates and fits; None when the validator rejected actions (now
        forbidden); else the bytes by which it exceeds the budget."""
        violations = validate(self.trace, plan, self.budget)
        rejected = [v for v in violations if v.kind != OVER_BUDGET]
        for v in rejected:
            found = [d for d in plan.decisions if d.storage == v.storage]
            if not found:
                raise MemplanError(f"planner 'milp' made an invalid plan: {v}")
            self.forbidden.update((self.unit_of[(d.storage, d.out_after, d.back_before)], d.action) for d in found)
        if rejected:
            return None
        if violations:
            return int(static_load(self.trace, list(plan.decisions)).max()) - self.budget
        result = self.simulator.run(plan, self.budget)
        if not result.feasible:
            return int(result.shortfall_bytes)
        return max(0, result.peak_load_bytes - self.budget)

    def _report(self, model, result, plan: Plan, model_budget: int, rounds: int, fallback: bool = False) -> dict:
        baseline_ms = MS * self.problem.baseline_s
        optimal = result.status == OPTIMAL and not fallback
        bound = getattr(result, "mip_dual_bound", None)
        status = "optimal" if optimal else "time limit" if not fallback else "no MILP plan: every unit swapped"
        report = self._figures(plan, status, None if fallback else float(result.fun) / baseline_ms,
                               None if bound is None or not np.isfinite(bound) else max(0.0, float(bound)) / baseline_ms,
                               model)
        report.update(optimal_s=self.solve_s if optimal else None, rounds=rounds, model_budget_bytes=model_budget)
        return report

    def _figures(self, plan: Plan, status: str, objective: float | None, bound: float | None, model) -> dict:
        """The report's figures: the model's objective and proven bound (shares of the baseline), the gap
        between them, the plan's simulated overhead and the model's size."""
        units = self.problem.units
        return {
            "status": status,
            "milp_overhead": objective,
            "milp_bound": bound,
            "mip_gap": None if objective is None or bound is None else max(0.0, objective - bound) / max(objective, 1e-12),
            "simulated_overhead": self.simulator.run(plan, self.budget).overhead,
            "solve_s": self.solve_s,
            "optimal_s": None,
            "units": len(units),
            "wrap_units": sum(u.wraps for u in units),
            "early_variants": sum(u.group != k and not u.carried for k, u in enumerate(units)),
            "carried_variants": sum(u.carried and u.group != k for k, u in enumerate(units)),
            "positions": len(self.problem.positions),
            "variables": len(model.cols.lb),
            "constraints": len(model.cols.rows),
            "milp_bound_scope": BOUND_SCOPE,
            "moves": self.problem.moves,
        }


def _trivial_report(problem: LayerProblem) -> dict:
    """Nothing needs to move: keeping everything is optimal."""
    return {"status": "optimal", "milp_overhead": 0.0, "milp_bound": 0.0, "mip_gap": 0.0, "simulated_overhead": 0.0,
            "solve_s": 0.0, "optimal_s": 0.0, "rounds": 0, "model_budget_bytes": None, "units": len(problem.units),
            "wrap_units": 0, "early_variants": 0, "carried_variants": 0, "positions": len(problem.positions),
            "variables": 0, "constraints": 0, "milp_bound_scope": "nothing needs to move: 0 is the optimum of every planner"}
