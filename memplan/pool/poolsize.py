"""Smallest pool size for an online heuristic (paper 001 §IV-B).

Start from the peak load; simulate; when a request fails, restart with the pool grown by
(request size - largest free block). The result always serves the sequence, but it is an
approximation: best-fit is not monotone in the pool size (a larger pool can fail where a
smaller one succeeds; the paper's example is in the tests), so it may not be the smallest.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cnmem import CNMEM_GRANULARITY, PoolExhausted, run_cnmem
from .problem import PoolProblem
from .sequence import round_up

MAX_RESTARTS = 10_000  # safety net; each restart grows the pool by at least one granule


@dataclass(frozen=True, kw_only=True)
class PoolSizeResult:
    """Outcome of the smallest-pool search."""

    pool_bytes: int  # a pool size that serves the whole sequence
    restarts: int  # failed simulations before it


def serves(problem: PoolProblem, pool_bytes: int, high_end: bool = False, order: str = "prefetch-first") -> bool:
    """True when a fixed pool of `pool_bytes` serves every request (best-fit or high-end)."""
    try:
        run_cnmem(problem, pool_bytes, grow=False, high_end=high_end, order=order)
    except PoolExhausted:
        return False
    return True


def smallest_pool(problem: PoolProblem, high_end: bool = False, order: str = "prefetch-first",
                  start_bytes: int | None = None) -> PoolSizeResult:
    """Paper 001's search for the smallest pool a heuristic can work in.

    Args:
        problem: the buffers (request sequence).
        high_end: vDNN++'s non-offloaded high-end allocation instead of plain best-fit.
        order: "prefetch-first" or "derivative-first".
        start_bytes: initial pool (default: the peak load, rounded to 512 B).
    Returns:
        The pool size found and how many restarts it took.
    """
    pool = round_up(problem.peak_load_bytes if start_bytes is None else start_bytes, CNMEM_GRANULARITY)
    for restarts in range(MAX_RESTARTS):
        try:
            run_cnmem(problem, pool, grow=False, high_end=high_end, order=order)
            return PoolSizeResult(pool_bytes=pool, restarts=restarts)
        except PoolExhausted as exc:
            pool += max(round_up(exc.request - exc.largest_free, CNMEM_GRANULARITY), CNMEM_GRANULARITY)
    raise RuntimeError(f"smallest-pool search did not converge after {MAX_RESTARTS} restarts")
