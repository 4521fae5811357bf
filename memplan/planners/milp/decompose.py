"""The `milp` planner's decomposition for traces too large to solve whole: fix-and-optimize
over windows of units (a rolling horizon).

The groups of units (`LayerProblem.groups`: a whole gap and its early-ending variants) are
ordered by the op they must be back for, and cut into windows of `size` groups, each window
overlapping the previous one by half. A window's subproblem is the whole model with every
other group fixed to the incumbent's choice: HiGHS re-decides the window's groups and every
schedule variable (triggers, releases, times) of the whole trace, so its optimum is never
worse than the incumbent. Windows are swept forward, and sweeps repeat until one improves
nothing or the time runs out. The incumbent starts from a seed (another planner's plan, read
as unit choices) or, without one or when the model rejects it, every unit swapped.

What it gives up: optimality across windows (a choice in one window that only pays with a
different choice in a distant one is not found). The bound it reports is the LP relaxation of
the whole model, valid for every plan in the model and usually far below the incumbent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from ...model import Decision
from .columns import Model
from .layers import LayerProblem

log = logging.getLogger(__name__)

WINDOW_GROUPS = 12  # groups a window re-decides
WINDOW_LIMIT_S = 15.0  # HiGHS' time per window at most
IMPROVES = 1e-6  # a window's objective (ms) must beat the incumbent's by this much
OPTIMAL = 0  # scipy.optimize.milp's status code for a proven optimum


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """The decomposition's best solution."""

    x: np.ndarray  # the solution vector
    objective: float  # its objective (model milliseconds)
    solves: int  # HiGHS runs
    sweeps: int  # sweeps over the windows
    seeded: bool  # the incumbent started from the seed (else from every unit swapped)


def choices_of(problem: LayerProblem, decisions) -> dict:
    """A plan's decisions as unit choices (group -> (unit, action) or None); decisions on gaps that
    are no unit are left out."""
    index = {(u.storage, u.out_after, u.back_before): k for k, u in enumerate(problem.units)}
    out = {group: None for group in problem.groups()}
    for d in decisions:
        k = index.get((d.storage, d.out_after, d.back_before))
        if k is not None and (d.action == "swap" or problem.units[k].recomputable):
            out[problem.units[k].group] = (k, d.action)
    return out


def all_swapped(problem: LayerProblem) -> dict:
    """Every whole gap swapped."""
    return {group: (group, "swap") for group in problem.groups()}


def decompose(model: Model, seed: tuple[Decision, ...] | None, deadline: float, gap: float,
              size: int = WINDOW_GROUPS) -> Outcome | None:
    """Fix-and-optimize from `seed` (or every unit swapped) until `deadline` (time.perf_counter()).

    Returns:
        The best solution, or None when the model has no solution with any start.
    """
    problem = model.problem
    starts = ([choices_of(problem, seed)] if seed else []) + [all_swapped(problem)]
    best = None
    for n, start in enumerate(starts):
        result = model.solve(max(deadline - time.perf_counter(), 1e-3), gap, fixed=start)
        if result.x is not None:
            best = (start, result.x, float(result.fun), bool(seed) and n == 0)
            break
    if best is None:
        return None
    choices, x, objective, seeded = best
    order = sorted(problem.groups(), key=lambda g: (problem.units[g].back_before, g))
    windows = [order[i:i + size] for i in range(0, max(len(order) - size // 2, 1), max(size // 2, 1))]
    solves, sweeps, improved = 1, 0, True
    while improved and time.perf_counter() < deadline:
        improved, sweeps = False, sweeps + 1
        for window in windows:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            free = set(window)
            fixed = {g: c for g, c in choices.items() if g not in free}
            result = model.solve(min(left, WINDOW_LIMIT_S), gap, fixed=fixed)
            solves += 1
            if result.x is not None and float(result.fun) < objective - IMPROVES:
                x, objective, improved = result.x, float(result.fun), True
                choices = model.choices(result.x)
        log.info("milp decomposition: sweep %d, objective %.4f ms after %d solves", sweeps, objective, solves)
    return Outcome(x=x, objective=objective, solves=solves, sweeps=sweeps, seeded=seeded)
