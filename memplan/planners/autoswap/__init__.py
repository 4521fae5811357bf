"""AutoSwap (paper 000 §IV): priority-score swap planning and its Bayesian-optimised variant.

Registered names: `autoswap:doa`, `autoswap:aoa`, `autoswap:wdoa`, `autoswap:swdoa`,
`autoswap:bo`. The combined SmartPool + AutoSwap mode (§V: swap plan first, then the
offline pool over the resulting buffers) is `autoswap:X+smartpool`, the composition any
swap or recompute planner has (`memplan.planners.base.compositions.compose_pool`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ...cost.model import Cost
from ...errors import InfeasibleBudgetError, MemplanError
from ...model import Plan, Trace
from ...problem import Problem
from ...units import format_bytes
from ..base import register
from ..kit.candidates import DEFAULT_MIN_BYTES, Candidates, find_candidates
from ..kit.searched import search_report
from . import schedule as sched
from .bo import tune_weights
from .scores import all_scores, standardize

log = logging.getLogger(__name__)

SCORES = ("aoa", "doa", "wdoa", "swdoa")  # the order of the BO weights a, b, c, d (Eq. 3)
VARIANTS = SCORES + ("bo",)
DEFAULT_TRIALS = 35  # §VI-B2: BO converges within 30 to 40 evaluations
OBJECTIVES = ("simulated",)  # or a callable plan -> overhead (a measured one comes from the workflows layer)


@dataclass(frozen=True, kw_only=True, eq=False)
class SwapProblem:
    """Everything one (trace, budget) needs, computed once and shared by all score variants."""

    trace: Trace  # the iteration
    cost: Cost  # its op and copy times
    budget_bytes: int  # the memory load limit
    cand: Candidates  # the swap candidates
    scores: dict  # standardized priority score arrays by name (SCORES)


def load_min_bytes(trace: Trace, min_bytes: int = DEFAULT_MIN_BYTES, multi_swap: bool = False) -> int:
    """The lowest load reachable by swapping every candidate once (`load_min`, §VI-B1).

    Args:
        trace: the iteration.
        min_bytes: the candidate size threshold.
        multi_swap: include every gap of every large-enough storage (the floor of
            `allow_multi_swap`).
    Returns:
        Bytes; the unconstrained peak when there are no candidates.
    """
    cand = find_candidates(trace, min_bytes, multi_swap)
    return sched.load_min(trace, cand)


def make_problem(trace: Trace, budget_bytes: int, cost: Cost, *, min_bytes: int = DEFAULT_MIN_BYTES,
                 allow_multi_swap: bool = False, planner: str = "autoswap") -> SwapProblem:
    """Candidates and standardized scores for one budget, after checking it is reachable.

    Raises:
        InfeasibleBudgetError: the budget is below `load_min` (or below the multi-swap
            floor with `allow_multi_swap`).
    """
    cand = find_candidates(trace, min_bytes, allow_multi_swap)
    floor = sched.load_min(trace, cand)
    if budget_bytes < floor:
        if not len(cand):
            raise _no_candidates(budget_bytes, floor, planner, min_bytes)
        raise _below_load_min(budget_bytes, floor, planner, allow_multi_swap)
    raw = all_scores(cand, cost, trace.load) if len(cand) else {k: np.zeros(0) for k in SCORES}
    return SwapProblem(trace=trace, cost=cost, budget_bytes=budget_bytes, cand=cand,
                   scores={k: standardize(v) for k, v in raw.items()})


def _below_load_min(budget: int, floor: int, planner: str, multi: bool) -> InfeasibleBudgetError:
    what = "with multi-swap (every gap of every storage)" if multi else "(every candidate swapped once)"
    hint = "" if multi else ("; allow_multi_swap=true swaps storages more than once "
                             "(memplan plan --param allow_multi_swap=true, memplan sweep --allow-multi-swap)")
    return InfeasibleBudgetError(
        f"budget {format_bytes(budget)} is below load_min {format_bytes(floor)} ({floor} bytes) of planner "
        f"{planner!r} {what}{hint}", budget_bytes=budget, min_feasible_bytes=floor)


def _no_candidates(budget: int, peak: int, planner: str, min_bytes: int) -> InfeasibleBudgetError:
    return InfeasibleBudgetError(
        f"budget {format_bytes(budget)} is infeasible for planner {planner!r}: no candidates at all (no storage of "
        f"at least {format_bytes(min_bytes)} has a gap across the peak or between iterations; min_bytes sets that "
        f"size), so load_min is the unconstrained peak {format_bytes(peak)} ({peak} bytes)",
        budget_bytes=budget, min_feasible_bytes=peak)


def plan_for_priority(problem: SwapProblem, priority: np.ndarray) -> Plan:
    """Select (§IV-D) and schedule (§IV-E) the swaps for one priority score array."""
    cand, load = problem.cand, problem.trace.load
    order = sched.priority_order(priority, cand.primary)
    chosen, planned = sched.select(load, cand, order, problem.budget_bytes)
    if not chosen:
        return Plan()
    picked = cand.subset(np.array(sorted(chosen)))
    trigger = sched.just_in_time_triggers(picked, problem.cost)
    trigger = sched.fit_triggers(planned, picked, trigger, problem.budget_bytes)
    return Plan(decisions=sched.decisions(picked, trigger))


def combined_priority(problem: SwapProblem, weights) -> np.ndarray:
    """Eq. 3: a*AOA + b*DOA + c*WDOA + d*SWDOA over the standardized scores."""
    return sum(float(w) * problem.scores[k] for w, k in zip(weights, SCORES))


def autoswap(problem: Problem, *, score: str = "bo",
             min_bytes: int = DEFAULT_MIN_BYTES, allow_multi_swap: bool = False,
             n_trials: int = DEFAULT_TRIALS, objective="simulated", weights: object = None,
             time_limit_s: float | None = None) -> Plan:
    """AutoSwap: swap the highest-priority candidates until the load fits the budget.

    Args:
        problem: the trace, its cap, its costs and the seed (memplan.problem).
        score: "doa", "aoa", "wdoa", "swdoa" or "bo" (Bayesian-optimised weights, §IV-C).
        min_bytes: candidate size threshold (§IV-A, default 1 MiB).
        allow_multi_swap: below load_min, swap further gaps (storages more than once).
        n_trials: BO evaluations (bo only).
        objective: "simulated" overhead, or a function plan -> overhead (bo only); the CLI's
            "measured" is `memplan.workflows.run.measured_objective`.
        weights: fixed (a, b, c, d) for the combined score; skips the BO search.
        time_limit_s: wall-clock limit for the BO search (bo only; None: all `n_trials`).
    Returns:
        The plan: one swap decision per chosen gap, with just-in-time prefetch triggers.
    Raises:
        InfeasibleBudgetError: the budget is below load_min (names it).
        MemplanError: a bad score, objective or weights.
    """
    trace, budget_bytes, cost, seed = problem.trace, problem.budget_bytes, problem.cost, problem.seed
    _check_args(score, objective, weights, time_limit_s)
    if budget_bytes >= trace.peak_load_bytes:
        return Plan()
    swaps = make_problem(trace, budget_bytes, cost, min_bytes=min_bytes, allow_multi_swap=allow_multi_swap,
                         planner=f"autoswap:{score}")
    return _plan_variant(swaps, score, seed=seed, n_trials=n_trials, objective=objective, weights=weights,
                         time_limit_s=time_limit_s)


def _plan_variant(problem: SwapProblem, score: str, *, seed: int, n_trials: int, objective, weights,
                  time_limit_s: float | None = None) -> Plan:
    if score in SCORES:
        return plan_for_priority(problem, problem.scores[score])
    report = {}
    if weights is None:
        started = time.monotonic()
        weights, scored = tune_weights(problem, plan_for_priority, combined_priority, seed=seed, n_trials=n_trials,
                                       objective=objective, time_limit_s=time_limit_s)
        report = search_report(scored, time.monotonic() - started)
    log.info("autoswap:bo weights a,b,c,d = %s", ", ".join(f"{w:+.3f}" for w in weights))
    result = plan_for_priority(problem, combined_priority(problem, weights))
    return result.with_meta(params={"weights": [float(w) for w in weights]}, report=report)


def _check_args(score: str, objective, weights, time_limit_s: float | None) -> None:
    if score not in VARIANTS:
        raise MemplanError(f"autoswap score must be one of {', '.join(VARIANTS)}, not {score!r}")
    if objective == "measured":
        raise MemplanError("autoswap objective 'measured' trains the model: use `memplan plan --param "
                           "objective=measured`, or pass memplan.workflows.run.measured_objective(trace)")
    if not callable(objective) and objective not in OBJECTIVES:
        raise MemplanError(f"autoswap objective must be one of {', '.join(OBJECTIVES)} or 'measured', "
                           f"not {objective!r}")
    if weights is not None and (len(weights) != len(SCORES) or any(abs(float(w)) > 1 for w in weights)):
        raise MemplanError("autoswap weights must be four numbers (a, b, c, d) in [-1, 1]")
    if time_limit_s is not None and not time_limit_s > 0:
        raise MemplanError(f"autoswap parameter time_limit_s must be positive, got {time_limit_s!r}")


for _variant in VARIANTS:
    _summary = {"doa": "duration of absence", "aoa": "area of absence", "wdoa": "weighted duration of absence",
                "swdoa": "submodular weighted duration of absence",
                "bo": "Bayesian-optimised combination of the four scores"}[_variant]
    register(f"autoswap:{_variant}", f"AutoSwap (paper 000 §IV), priority score: {_summary}",
             decides=("swap",), score=_variant)(autoswap)
