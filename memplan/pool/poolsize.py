"""Smallest pool size for an online heuristic (paper 001 §IV-B).

Start from the peak load; simulate; when a request fails, restart with the pool grown by
(request size - largest free block). The result always serves the sequence, but it is an
approximation: best-fit is not monotone in the pool size (a larger pool can fail where a
smaller one succeeds; the paper's example is in the tests), so it may not be the smallest.

Growing the pool only grows its top block, which need not be the largest free one: where the
same request fails alike restart after restart (STALLED_RESTARTS in a row), the pool grows by
the whole request instead, else the search would creep up one granule at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cnmem import CNMEM_GRANULARITY, PoolExhausted, run_cnmem
from .problem import PoolProblem
from .sequence import round_up

MAX_RESTARTS = 10_000  # safety net; each restart grows the pool by at least one granule
STALLED_RESTARTS = 100  # restarts failing alike in a row, after which the pool grows by the whole request


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
    last, alike = None, 0  # the last failure (request, largest free block), and how many times in a row
    for restarts in range(MAX_RESTARTS):
        try:
            run_cnmem(problem, pool, grow=False, high_end=high_end, order=order)
            return PoolSizeResult(pool_bytes=pool, restarts=restarts)
        except PoolExhausted as exc:
            failure = (exc.request, exc.largest_free)
            alike, last = (alike + 1 if failure == last else 1), failure
            shortfall = exc.request if alike >= STALLED_RESTARTS else exc.request - exc.largest_free
            pool += max(round_up(shortfall, CNMEM_GRANULARITY), CNMEM_GRANULARITY)
    raise RuntimeError(f"smallest-pool search did not converge after {MAX_RESTARTS} restarts")
