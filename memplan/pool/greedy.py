"""The offline greedy pool allocators of paper 000 (SmartPool, §III-C) and their orderings.

Buffers are taken in a given order (the paper: size descending); each is placed in the best
(smallest) or first (lowest) gap left by already placed buffers whose lifetimes overlap
it; when no gap fits, it goes on top of them, growing the pool. No power-of-two rounding.
The region between the highest overlapping buffer and the current pool top counts as a
gap too (it is free for this lifetime and costs no growth).
"""

from __future__ import annotations

import numba
import numpy as np

from .problem import PoolProblem

NO_OFFSET = -1


@numba.njit(cache=True)
def _conflict_counts(starts, ends, order):
    n = len(starts)
    deg = np.zeros(n, np.int64)
    active = np.empty(n, np.int64)
    na = 0
    for i in order:
        m = 0
        for a in range(na):
            j = active[a]
            if ends[j] > starts[i]:
                active[m] = j
                m += 1
                deg[i] += 1
                deg[j] += 1
        na = m
        active[na] = i
        na += 1
    return deg


@numba.njit(cache=True)
def _conflict_fill(starts, ends, order, indptr):
    n = len(starts)
    indices = np.empty(indptr[n], np.int32)
    fill = indptr[:-1].copy()
    active = np.empty(n, np.int64)
    na = 0
    for i in order:
        m = 0
        for a in range(na):
            j = active[a]
            if ends[j] > starts[i]:
                active[m] = j
                m += 1
                indices[fill[i]] = j
                fill[i] += 1
                indices[fill[j]] = i
                fill[j] += 1
        na = m
        active[na] = i
        na += 1
    return indices


def conflict_graph(problem: PoolProblem) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of buffers whose lifetimes overlap, as CSR (indptr, indices).

    Returns:
        indptr (int64, n+1) and indices (int32): the neighbours of buffer i are
        indices[indptr[i]:indptr[i+1]].
    """
    order = np.argsort(problem.starts, kind="stable")
    deg = _conflict_counts(problem.starts, problem.ends, order)
    indptr = np.zeros(problem.n + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    return indptr, _conflict_fill(problem.starts, problem.ends, order, indptr)


@numba.njit(cache=True)
def _greedy(order, sizes, indptr, indices, best_fit):
    n = len(sizes)
    off = np.full(n, NO_OFFSET, np.int64)
    max_deg = 0
    for i in range(n):
        max_deg = max(max_deg, indptr[i + 1] - indptr[i])
    lo = np.empty(max_deg, np.int64)
    hi = np.empty(max_deg, np.int64)
    footprint = 0
    for i in order:
        k = 0
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            if off[j] != NO_OFFSET:
                lo[k] = off[j]
                hi[k] = off[j] + sizes[j]
                k += 1
        size = sizes[i]
        chosen = NO_OFFSET
        chosen_gap = np.int64(0)
        cur = np.int64(0)
        for t in np.argsort(lo[:k]):
            if lo[t] - cur >= size and (chosen == NO_OFFSET or lo[t] - cur < chosen_gap):
                chosen, chosen_gap = cur, lo[t] - cur
                if not best_fit:
                    break
            cur = max(cur, hi[t])
        top_gap = footprint - cur
        if chosen == NO_OFFSET or (best_fit and size <= top_gap < chosen_gap):
            chosen = cur
        off[i] = chosen
        footprint = max(footprint, chosen + size)
    return off, footprint


def greedy_place(problem: PoolProblem, order: np.ndarray, best_fit: bool = True,
                 graph: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, int]:
    """Place buffers one by one in `order` (best-fit or first-fit).

    Args:
        problem: the buffers.
        order: buffer indices, the order in which they are placed.
        best_fit: smallest fitting gap (True) or lowest fitting gap (False).
        graph: a precomputed `conflict_graph(problem)`.
    Returns:
        (offsets int64 array, footprint bytes).
    """
    if problem.n == 0:
        return np.zeros(0, np.int64), 0
    indptr, indices = graph if graph is not None else conflict_graph(problem)
    off, footprint = _greedy(np.asarray(order, np.int64), problem.sizes, indptr, indices, best_fit)
    return off, int(footprint)


# --- orderings --------------------------------------------------------------------------------

def section_totals(problem: PoolProblem) -> np.ndarray:
    """Per buffer, the largest load (sum of live sizes) at any time in its lifetime."""
    times = np.unique(np.concatenate([problem.starts, problem.ends]))
    lo = np.searchsorted(times, problem.starts)
    hi = np.searchsorted(times, problem.ends)
    delta = np.zeros(len(times) + 1, np.int64)
    np.add.at(delta, lo, problem.sizes)
    np.add.at(delta, hi, -problem.sizes)
    load = np.cumsum(delta)[:-1]
    return _range_max(load, lo, hi)


@numba.njit(cache=True)
def _range_max(load, lo, hi):
    out = np.empty(len(lo), np.int64)
    for i in range(len(lo)):
        out[i] = load[lo[i]:hi[i]].max()
    return out


def orderings(problem: PoolProblem) -> dict[str, np.ndarray]:
    """Named buffer orderings for the greedy portfolio.

    `size` is the paper's (size descending); `spatial` and `temporal` are XLA's
    GlobalDecreasingSizeBestFitHeap orders; `area` is size x lifetime; `total` and
    `total-area` follow minimalloc's preorderings (the largest load a buffer lives through
    first, then area); `start` is allocation order (what an online allocator sees).
    """
    size, length = problem.sizes, problem.ends - problem.starts
    area = size * length
    total = section_totals(problem)
    ids = np.arange(problem.n)
    return {
        "size": np.lexsort((ids, -size)),
        "spatial": np.lexsort((ids, -length, -size)),
        "temporal": np.lexsort((ids, -size, -length)),
        "area": np.lexsort((ids, -size, -area)),
        "total": np.lexsort((ids, -size, -total)),
        "total-area": np.lexsort((ids, -area, -total)),
        "start": np.lexsort((ids, -size, problem.starts)),
    }
