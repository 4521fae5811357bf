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

# Above this many buffers smartpool splits the problem first (its exact search is skipped
# there anyway, and the conflict graph of whole-horizon buffers grows quadratically).
DECOMPOSE_ABOVE = 4000


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
            if time.monotonic() > deadline:
                return best
    return best


@register_allocator("smartpool", "portfolio of orderings, then exact canonical search under a time limit")
def smartpool(problem: PoolProblem, *, time_limit_s: float = 10.0, seed: int = 0) -> AllocatorOutcome:
    """SmartPool beyond the paper: portfolio, then search for a smaller pool until the time limit.

    Problems above DECOMPOSE_ABOVE buffers are first split (see `decompose`) and each part gets
    the portfolio only (the exact search is for small problems), which keeps large problems
    near-linear; an optimal layout of the parts is optimal for the whole.
    """
    if problem.n > DECOMPOSE_ABOVE:
        spanning, parts = decompose(problem)
        if len(spanning) or len(parts) > 1:
            return _solve_parts(problem, spanning, parts, time_limit_s, seed)
    return _smartpool_whole(problem, time_limit_s, seed)


def decompose(problem: PoolProblem) -> tuple[np.ndarray, list[np.ndarray]]:
    """Buffers alive over the whole horizon, and the others split into independent time ranges.

    Whole-horizon buffers conflict with every other buffer, so stacking them at the bottom
    loses nothing: compacting any valid layout's other buffers down past them keeps it valid.
    Between two time ranges that no buffer crosses, layouts are independent.

    Returns:
        (indices of whole-horizon buffers, list of index arrays, one per time range).
    """
    spanning = (problem.starts == problem.starts.min()) & (problem.ends == problem.ends.max())
    rest = np.flatnonzero(~spanning)
    order = rest[np.argsort(problem.starts[rest], kind="stable")]
    if order.size == 0:
        return np.flatnonzero(spanning), []
    reach = np.maximum.accumulate(problem.ends[order])
    cuts = np.flatnonzero(reach[:-1] <= problem.starts[order][1:]) + 1
    return np.flatnonzero(spanning), np.split(order, cuts)


def _solve_parts(problem: PoolProblem, spanning: np.ndarray, parts: list[np.ndarray], time_limit_s: float,
                 seed: int) -> AllocatorOutcome:
    """Stack the whole-horizon buffers, then solve every time range on top of them."""
    offsets = np.zeros(problem.n, np.int64)
    stacked = spanning[np.argsort(-problem.sizes[spanning], kind="stable")]
    offsets[stacked] = np.concatenate([[0], np.cumsum(problem.sizes[stacked])[:-1]]) if stacked.size else []
    base = int(problem.sizes[spanning].sum())
    top = 0
    for part in parts:
        share = time_limit_s * len(part) / max(1, problem.n - len(spanning))
        outcome = _smartpool_whole(problem.subset(part), share, seed, search=False)
        offsets[part] = base + outcome.offsets
        top = max(top, outcome.footprint_bytes)
    return AllocatorOutcome(footprint_bytes=base + top, offsets=offsets,
                            details={"decomposed": True, "spanning_buffers": int(len(spanning)),
                                     "time_ranges": len(parts)})


def _smartpool_whole(problem: PoolProblem, time_limit_s: float, seed: int, search: bool = True) -> AllocatorOutcome:
    """Portfolio, then (if `search`) the exact search, on one problem as a whole."""
    started = time.monotonic()
    if problem.n == 0:
        return AllocatorOutcome(footprint_bytes=0, offsets=np.zeros(0, np.int64))
    graph = conflict_graph(problem)
    offsets, footprint, label = portfolio(problem, graph, started + time_limit_s)
    details = {"portfolio": label, "portfolio_footprint": footprint, "optimal": footprint == problem.peak_load_bytes}
    if search and not details["optimal"]:
        from .search import improve

        deadline = started + time_limit_s
        offsets, footprint, found = improve(problem, graph, offsets, footprint, deadline, seed)
        details.update(found)
    return AllocatorOutcome(footprint_bytes=footprint, offsets=offsets, details=details)
