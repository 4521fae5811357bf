"""First layouts for smartpool: every heuristic whose cost fits, the best one kept.

  - allocation-order best/first fit without a graph (native.c mp_sweep_fit): the portfolio's
    `start` ordering in O(n x free blocks), for any size;
  - skyline dives (native.c mp_dive: the search's first path without its checks), one per
    preorder of DIVE_ORDERS, with a cap on their work (they win on large sparse problems);
  - the greedy portfolio (greedy.py: the other 6 orderings x best/first fit over the conflict
    graph), when the graph has at most GRAPH_MAX_PAIRS pairs (memory and time grow with them).
Heuristics run on the given threads in that order (the graph-free ones first: they are cheaper,
and the dives most often reach the lower bound, after which the rest is not needed), and stop
being started at the deadline (the first one always runs, so there is always a layout).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from . import native
from .greedy import conflict_graph, greedy_place, orderings, range_max
from .problem import PoolProblem
from .sections import sections

GRAPH_MAX_PAIRS = 20_000_000  # ~160 MB of neighbour lists; denser problems skip the graph heuristics
DIVE_POPS_PER_BUFFER = 200  # a dive gives up after this many heap pops per buffer (dense problems need more)
DIVE_ORDERS = ("TWA", "TAW", "WAT")  # the search's three best preorders (static T here)


@dataclass(frozen=True)
class Layout:
    """The best first layout of one problem."""

    offsets: np.ndarray
    footprint: int
    label: str  # the heuristic that made it
    tried: int  # heuristics run
    skipped: int  # heuristics not started (deadline, or one at the lower bound already) or given up (work cap)


def count_pairs(problem: PoolProblem) -> int:
    """The number of buffer pairs alive at the same time (about: ties in start count twice)."""
    starts = np.sort(problem.starts)
    return int((np.searchsorted(starts, problem.ends) - np.searchsorted(starts, problem.starts) - 1).sum())


def construct(problem: PoolProblem, deadline: float, threads: int, graph=None, good_enough: int = 0) -> Layout:
    """The best first layout of `problem` that the deadline allows (ties: the earlier heuristic).

    Args:
        problem: the buffers (n > 0).
        deadline: time.monotonic() after which no heuristic starts (the first one always runs).
        threads: heuristics run in parallel on this many threads.
        graph: the conflict graph, or None where it is not affordable (no portfolio then).
        good_enough: no later heuristic starts once one reaches this footprint (default: the peak load).
    """
    jobs = [("start/best-fit", lambda: _sweep_fit(problem, True)), ("start/first-fit", lambda: _sweep_fit(problem, False))]
    jobs += _dive_jobs(problem) + (_portfolio_jobs(problem, graph) if graph is not None else [])
    good_enough = max(good_enough, problem.peak_load_bytes)
    results = [jobs[0][1]()] + [None] * (len(jobs) - 1)
    enough = [0 if results[0][1] <= good_enough else len(jobs)]  # the first job that reached good_enough

    def run(k: int) -> None:
        # Jobs after one that reached good_enough are not needed (it wins ties, being earlier).
        if time.monotonic() <= deadline and k < enough[0]:
            results[k] = jobs[k][1]()
            if 0 <= results[k][1] <= good_enough:
                enough[0] = min(enough[0], k)

    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(1, len(jobs))))
    else:
        for k in range(1, len(jobs)):
            run(k)
    done = [k for k, r in enumerate(results) if r is not None and r[1] >= 0]
    k = min(done, key=lambda k: (results[k][1], k))
    return Layout(offsets=results[k][0], footprint=results[k][1], label=jobs[k][0], tried=len(done),
                  skipped=len(jobs) - len(done))


def affordable_graph(problem: PoolProblem):
    """The conflict graph, or None when it would exceed GRAPH_MAX_PAIRS pairs."""
    return conflict_graph(problem) if count_pairs(problem) <= GRAPH_MAX_PAIRS else None


def _portfolio_jobs(problem: PoolProblem, graph) -> list:
    return [(f"{name}/{'best' if fit else 'first'}-fit", lambda order=order, fit=fit: greedy_place(problem, order, fit, graph))
            for name, order in orderings(problem).items() if name != "start" for fit in (True, False)]


def _sweep_fit(problem: PoolProblem, best_fit: bool) -> tuple[np.ndarray, int]:
    order = native.i64(np.lexsort((np.arange(problem.n), -problem.sizes, problem.starts)))
    by_end = native.i64(np.argsort(problem.ends, kind="stable"))
    arrays = [native.i64(a) for a in (problem.starts, problem.ends, problem.sizes)]
    off = np.empty(problem.n, np.int64)
    footprint = native.library().mp_sweep_fit(problem.n, *map(native.ptr, arrays), native.ptr(order), native.ptr(by_end),
                                              int(best_fit), native.ptr(off))
    return off, int(footprint)


def _dive_jobs(problem: PoolProblem) -> list:
    sec = sections(problem)
    length = problem.ends - problem.starts
    keys = {"T": range_max(sec.total, sec.lo, sec.hi), "W": length, "A": problem.sizes * length}
    ids = np.arange(problem.n)

    def dive(letters: str):
        rank = np.empty(problem.n, np.int64)
        rank[np.lexsort((ids, *(-keys[k] for k in reversed(letters))))] = ids
        off = np.empty(problem.n, np.int64)
        footprint = native.library().mp_dive(problem.n, sec.count, native.ptr(native.i64(problem.sizes)),
                                             native.ptr(sec.lo), native.ptr(sec.hi), native.ptr(rank),
                                             DIVE_POPS_PER_BUFFER * problem.n, native.ptr(off))
        return off, int(footprint)

    return [(f"dive {letters}", lambda letters=letters: dive(letters)) for letters in DIVE_ORDERS]
