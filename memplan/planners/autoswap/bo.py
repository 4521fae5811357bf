"""Bayesian optimisation of the AutoSwap score weights (paper 000 §IV-C).

Optuna's Gaussian-process sampler tunes (a, b, c, d) in [-1, 1] of
`a*AOA + b*DOA + c*WDOA + d*SWDOA`; the objective is the overhead of the resulting plan
at the budget, simulated (or measured on a GPU). The four pure scores are evaluated
first, so the result is never worse than the best of them.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...progress import progress_bar
from ...sim.simulate import Simulator

log = logging.getLogger(__name__)

WEIGHT_NAMES = ("a", "b", "c", "d")  # weights of AOA, DOA, WDOA, SWDOA (Eq. 3)
INFEASIBLE_OVERHEAD = 1e3  # objective value for a plan the simulator cannot run (GP needs a finite number)
MIN_TRIALS = len(WEIGHT_NAMES)  # the four pure scores are always tried


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    """One scored weight vector."""

    overhead: float  # simulated (or measured) overhead of its plan
    swapped_bytes: int  # bytes its plan swaps out per iteration (tie-break: less is better)
    trial: int  # evaluation number (tie-break: earlier is better)
    weights: tuple[float, ...]  # (a, b, c, d)


def tune_weights(problem, plan_fn: Callable, combine_fn: Callable, *, seed: int, n_trials: int,
                 objective: str | Callable = "simulated",
                 time_limit_s: float | None = None) -> tuple[tuple[float, ...], int]:
    """Search the weights with Optuna's GPSampler and return the best ones.

    Args:
        problem: the autoswap Problem (trace, cost, budget, candidates, scores).
        plan_fn: `plan_fn(problem, priority) -> Plan`.
        combine_fn: `combine_fn(problem, weights) -> priority array`.
        seed: sampler seed; the same seed gives the same weights.
        n_trials: evaluations (at least the four pure scores).
        objective: "simulated", or `objective(plan) -> overhead` (the workflows layer
            passes a measured one, `memplan.workflows.run.measured_objective`).
        time_limit_s: start no trial after this many seconds (None: run all `n_trials`); the
            four pure scores are always tried, so the result is never worse than theirs.
    Returns:
        (weights, plans scored): the weights of the lowest overhead (ties go to the plan that swaps
        fewer bytes, then to the earlier evaluation), and how many distinct plans were scored.
    """
    import optuna  # local: a second to import, needed by a BO search only (the registry imports every planner)

    score = _objective_fn(problem, objective)
    cache: dict[tuple, tuple[float, int]] = {}
    evaluations: list[Evaluation] = []

    def run(trial) -> float:
        weights = tuple(trial.suggest_float(k, -1.0, 1.0) for k in WEIGHT_NAMES)
        plan = plan_fn(problem, combine_fn(problem, weights))
        key = tuple((d.storage, d.out_after) for d in plan.decisions)
        if key not in cache:
            cache[key] = (score(plan), _swapped_bytes(problem, plan))
        overhead, swapped = cache[key]
        evaluations.append(Evaluation(overhead=overhead, swapped_bytes=swapped, trial=trial.number, weights=weights))
        bar.update()
        bar.set_postfix_str(_best_so_far(evaluations), refresh=False)
        return overhead

    trials = max(n_trials, MIN_TRIALS)
    with _quiet_optuna(), _one_thread(), progress_bar("autoswap:bo", total=trials, unit=" trials") as bar:
        study = optuna.create_study(direction="minimize", sampler=_sampler(optuna, seed))
        for one_hot in np.eye(len(WEIGHT_NAMES)):
            study.enqueue_trial(dict(zip(WEIGHT_NAMES, map(float, one_hot))))
        started = time.monotonic()
        study.optimize(run, n_trials=MIN_TRIALS)  # the pure scores, whatever the limit
        left = None if time_limit_s is None else time_limit_s - (time.monotonic() - started)
        if left is None or left > 0:
            study.optimize(run, n_trials=trials - MIN_TRIALS, timeout=left)
    best = min(evaluations, key=lambda e: (e.overhead, e.swapped_bytes, e.trial))
    log.info("autoswap:bo: %d evaluations, %d distinct plans, best overhead %.4f", len(evaluations), len(cache),
             best.overhead)
    return best.weights, len(cache)


def _best_so_far(evaluations: list[Evaluation]) -> str:
    best = min(e.overhead for e in evaluations)
    return "best: none feasible yet" if best >= INFEASIBLE_OVERHEAD else f"best overhead {best:.2%}"


def _sampler(optuna, seed: int):
    """Optuna's GP sampler (a maintained Bayesian-optimisation implementation)."""
    with warnings.catch_warnings():
        # deterministic_objective is marked experimental; the simulator is deterministic.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.GPSampler(seed=seed, deterministic_objective=True)


def _objective_fn(problem, objective: str | Callable) -> Callable:
    """The overhead of a plan: simulated, or a caller's function (e.g. measured on a GPU)."""
    if callable(objective):
        return objective
    simulator = Simulator(problem.trace, problem.cost)

    def simulated(plan) -> float:
        overhead = simulator.overhead_if_fits(plan, problem.budget_bytes)
        return INFEASIBLE_OVERHEAD if overhead is None else float(overhead)

    return simulated


def _swapped_bytes(problem, plan) -> int:
    nbytes = problem.trace.nbytes
    return int(sum(int(nbytes[d.storage]) for d in plan.decisions))


@contextlib.contextmanager
def _one_thread():
    """One BLAS/OpenMP thread while Optuna's GP sampler runs.

    Its acquisition search runs scipy's L-BFGS-B and torch on tiny arrays thousands of
    times; more threads only add synchronisation, and on a busy host their spinning made
    the search 3x slower (README, planning time). Torch's own pool is set alike. The limit
    applies to libraries loaded when it is set, so scipy (which the sampler imports on first
    use) is imported first. All three are imported here, not with the module: the planner
    registry imports every planner, and a command that plans without BO imports no torch.
    """
    import scipy.optimize  # noqa: F401  (loaded before the limit is set, so that it covers it)
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _quiet_optuna():
    """Optuna logs every trial at INFO; keep it to warnings while we search, then restore."""
    import optuna  # local: see tune_weights

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)
