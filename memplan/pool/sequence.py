"""The request sequence an online allocator sees: one iteration's buffers as frees and
allocations in time order, never looking ahead."""

from __future__ import annotations

import numpy as np

from ..errors import MemplanError
from .problem import ROLE_PREFETCH, PoolProblem

ORDERS = ("prefetch-first", "derivative-first")


def round_up(n: int, to: int) -> int:
    """n rounded up to a multiple of `to`."""
    return -(-n // to) * to


def events(problem: PoolProblem, order: str = "prefetch-first"):
    """The request sequence: yields ("free", i) and ("alloc", i) in time order.

    At each time step frees come first; allocations follow in buffer order, prefetched
    (or recomputed) residencies before the others for prefetch-first, after for
    derivative-first (paper 001 §IV-B).
    """
    if order not in ORDERS:
        raise MemplanError(f"unknown allocation order {order!r}; known: {', '.join(ORDERS)}")
    late = problem.roles != ROLE_PREFETCH if order == "prefetch-first" else problem.roles == ROLE_PREFETCH
    allocs = np.lexsort((np.arange(problem.n), late, problem.starts))
    frees = np.lexsort((np.arange(problem.n), problem.ends))
    a = f = 0
    while a < problem.n or f < problem.n:
        if f < problem.n and (a == problem.n or problem.ends[frees[f]] <= problem.starts[allocs[a]]):
            yield "free", int(frees[f])
            f += 1
        else:
            yield "alloc", int(allocs[a])
            a += 1
