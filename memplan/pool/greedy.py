"""The offline greedy pool allocators of paper 000 (SmartPool, §III-C) and their orderings.

Buffers are taken in a given order (the paper: size descending); each is placed in the best
(smallest) or first (lowest) gap left by already placed buffers whose lifetimes overlap
it; when no gap fits, it goes on top of them, growing the pool. No power-of-two rounding.
The region between the highest overlapping buffer and the current pool top counts as a
gap too (it is free for this lifetime and costs no growth).
"""

from __future__ import annotations

import numpy as np

from . import native
from .problem import PoolProblem
from .sections import sections


def conflict_graph(problem: PoolProblem) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of buffers whose lifetimes overlap, as CSR (indptr, indices).

    Returns:
        indptr (int64, n+1) and indices (int32): the neighbours of buffer i are
        indices[indptr[i]:indptr[i+1]].
    """
    lib = native.library()
    starts, ends = native.i64(problem.starts), native.i64(problem.ends)
    order = native.i64(np.argsort(starts, kind="stable"))
    indptr = np.zeros(problem.n + 1, np.int64)
    entries = lib.mp_conflict_count(problem.n, native.ptr(starts), native.ptr(ends), native.ptr(order), native.ptr(indptr))
    indices = np.empty(entries, np.int32)
    lib.mp_conflict_fill(problem.n, native.ptr(starts), native.ptr(ends), native.ptr(order), native.ptr(indptr),
                         native.ptr(indices))
    return indptr, indices


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
    order, sizes = native.i64(order), native.i64(problem.sizes)
    off = np.empty(problem.n, np.int64)
    footprint = native.library().mp_greedy(problem.n, native.ptr(order), native.ptr(sizes), native.ptr(indptr),
                                           native.ptr(indices), int(best_fit), native.ptr(off))
    return off, int(footprint)


# --- orderings --------------------------------------------------------------------------------

def section_totals(problem: PoolProblem) -> np.ndarray:
    """Per buffer, the largest load (sum of live sizes) at any time in its lifetime."""
    sec = sections(problem)
    return range_max(sec.total, sec.lo, sec.hi)


def range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo[i]:hi[i]]) for every i (all ranges non-empty), by a sparse table."""
    lengths = hi - lo
    table = [np.asarray(values)]  # table[k][j] = max(values[j:j + 2**k])
    while len(lengths) and 2 ** len(table) <= lengths.max():
        half = 2 ** (len(table) - 1)
        table.append(np.maximum(table[-1][:-half], table[-1][half:]))
    level = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    out = np.empty(len(lo), table[0].dtype)
    for k in np.unique(level):
        pick = level == k
        out[pick] = np.maximum(table[k][lo[pick]], table[k][hi[pick] - 2**k])
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
