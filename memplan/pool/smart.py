"""SmartPool: the paper's greedy allocators, and `smartpool` that goes beyond them.

`smartpool-bestfit` / `smartpool-firstfit` are paper 000 §III-C exactly: size descending,
best / first gap. `smartpool` runs a portfolio of orderings with both fits (so it is never
worse than best-fit), then an exact search over canonical solutions (in the spirit of
minimalloc) for a smaller pool, under a time limit, keeping the best valid layout found.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from .api import AllocatorOutcome, register_allocator
from .greedy import conflict_graph, greedy_place, orderings
from .problem import PoolProblem

log = logging.getLogger(__name__)


def _size_order(problem: PoolProblem) -> np.ndarray:
    return np.lexsort((np.arange(problem.n), -problem.sizes))


@register_allocator("smartpool-bestfit", "paper 000: size descending, best-fit gap among overlapping buffers")
def bestfit(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0) -> AllocatorOutcome:
    """Paper 000's default SmartPool (best-fit)."""
    offsets, footprint = greedy_place(problem, _size_order(problem), best_fit=True)
    return AllocatorOutcome(footprint_bytes=footprint, offsets=offsets)


@register_allocator("smartpool-firstfit", "paper 000: size descending, first-fit gap among overlapping buffers")
def firstfit(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0) -> AllocatorOutcome:
    """Paper 000's first-fit variant."""
    offsets, footprint = greedy_place(problem, _size_order(problem), best_fit=False)
    return AllocatorOutcome(footprint_bytes=footprint, offsets=offsets)


def portfolio(problem: PoolProblem, graph=None, deadline: float = float("inf")) -> tuple[np.ndarray, int, str]:
    """Best greedy layout over all orderings x {best-fit, first-fit}, stopping at `deadline`
    (a perf_counter time) once the paper's size-descending best-fit has run.

    Returns:
        (offsets, footprint, label of the winning ordering and fit).
    """
    graph = graph if graph is not None else conflict_graph(problem)
    best = None
    for name, order in orderings(problem).items():
        for best_fit in (True, False):
            offsets, footprint = greedy_place(problem, order, best_fit, graph)
            if best is None or footprint < best[1]:
                best = (offsets, footprint, f"{name}/{'best' if best_fit else 'first'}-fit")
            if time.perf_counter() > deadline:
                return best
    return best


@register_allocator("smartpool", "portfolio of orderings, then exact canonical search under a time limit")
def smartpool(problem: PoolProblem, *, time_limit_s: float = 10.0, seed: int = 0) -> AllocatorOutcome:
    """SmartPool beyond the paper: portfolio, then search for a smaller pool until the time limit."""
    started = time.perf_counter()
    if problem.n == 0:
        return AllocatorOutcome(footprint_bytes=0, offsets=np.zeros(0, np.int64))
    graph = conflict_graph(problem)
    offsets, footprint, label = portfolio(problem, graph, started + time_limit_s)
    details = {"portfolio": label, "portfolio_footprint": footprint, "optimal": footprint == problem.peak_load_bytes}
    if not details["optimal"]:
        from .search import improve

        deadline = started + time_limit_s
        offsets, footprint, found = improve(problem, graph, offsets, footprint, deadline, seed)
        details.update(found)
    return AllocatorOutcome(footprint_bytes=footprint, offsets=offsets, details=details)
