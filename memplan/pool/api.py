"""`memplan.pool.layout`: lay out every buffer of a trace (optionally under a plan) in one pool,
with any allocator of memplan.pool.allocators."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from ..model import Plan, PoolSlot, Trace, check_plan
from ..progress import time_limit_bar
from .allocators.base import ALLOCATORS
from .check import check_layout
from .intervals import residency_problem
from .problem import PoolProblem

log = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT_S = 10.0
SEARCH_ALLOCATORS = ("smartpool",)  # allocators that search up to their time limit (a progress bar shows)


@dataclass(frozen=True, kw_only=True)
class PoolResult:
    """A pool layout and how good it is."""

    allocator: str  # allocator name
    problem: PoolProblem  # the buffers that were placed
    offsets: np.ndarray | None  # byte offset per buffer of `problem` (None: no single address space)
    slots: tuple[PoolSlot, ...]  # the offsets as plan slots (storage, start op, offset)
    footprint_bytes: int  # pool size / peak reserved bytes
    peak_load_bytes: int  # lower bound: most bytes alive at once
    ratio: float  # footprint / peak load (1.0 is perfect)
    seconds: float  # wall-clock seconds the allocator took
    buffers: int  # number of buffers placed
    alloc_calls: int  # device allocation calls per iteration
    details: dict = field(default_factory=dict)  # allocator-specific facts

    def summary(self) -> dict:
        """The JSON-ready numbers `memplan pool --json` prints."""
        return {"allocator": self.allocator, "footprint_bytes": self.footprint_bytes,
                "peak_load_bytes": self.peak_load_bytes, "ratio": self.ratio, "seconds": self.seconds,
                "buffers": self.buffers, "alloc_calls": self.alloc_calls, "details": self.details}


def solve(problem: PoolProblem, allocator: str = "smartpool", time_limit_s: float = DEFAULT_TIME_LIMIT_S,
          seed: int = 0, **options) -> PoolResult:
    """Run one allocator on a pool problem and validate its layout.

    Args:
        problem: the buffers.
        allocator: a name from `known_allocators()`.
        time_limit_s: wall-clock limit for search allocators (smartpool).
        seed: random seed for search allocators.
        **options: allocator-specific options (e.g. `order="derivative-first"`).
    Returns:
        The validated PoolResult.
    Raises:
        UnknownNameError: unknown allocator.
    """
    fn = ALLOCATORS.get(allocator).fn
    started = time.perf_counter()
    with time_limit_bar(f"pool {allocator}", time_limit_s) if allocator in SEARCH_ALLOCATORS \
            else contextlib.nullcontext():
        outcome = fn(problem, time_limit_s=time_limit_s, seed=seed, **options)
    seconds = time.perf_counter() - started
    if outcome.offsets is not None:
        check_layout(problem, outcome.offsets, outcome.footprint_bytes)
    peak = problem.peak_load_bytes
    slots = () if outcome.offsets is None else tuple(
        PoolSlot(storage=int(s), start=int(t), offset=int(o))
        for s, t, o in zip(problem.storages, problem.starts, outcome.offsets))
    log.info("pool %s: %d buffers, footprint %d, peak load %d, %.3f s", allocator, problem.n,
             outcome.footprint_bytes, peak, seconds)
    return PoolResult(allocator=allocator, problem=problem, offsets=outcome.offsets, slots=slots,
                      footprint_bytes=int(outcome.footprint_bytes), peak_load_bytes=peak,
                      ratio=outcome.footprint_bytes / peak if peak else 1.0, seconds=seconds, buffers=problem.n,
                      alloc_calls=outcome.alloc_calls, details=dict(outcome.details))


def layout(trace: Trace, plan: Plan | None = None, allocator: str = "smartpool",
           time_limit_s: float = DEFAULT_TIME_LIMIT_S, seed: int = 0, cost=None, **options) -> PoolResult:
    """Lay out the buffers of `trace` (under `plan`'s swaps and recomputes, if given) in one pool.

    Args:
        trace: the traced iteration (or a pool-only trace imported from a minimalloc CSV).
        plan: a swap/recompute plan; swapped-out storages free their memory while on the
            host (once their device-to-host copy completes), prefetches and recomputes allocate.
        allocator: a name from `known_allocators()`; default the offline SmartPool.
        time_limit_s: wall-clock limit for smartpool's search.
        seed: random seed for the search.
        cost: the Cost used to time swap-out completion (default: h100 roofline).
        **options: allocator-specific options.
    Returns:
        The validated PoolResult; `slots` are the plan's PoolSlots.
    """
    if plan is not None:
        check_plan(trace, plan)
    return solve(residency_problem(trace, plan, cost), allocator, time_limit_s, seed, **options)


def with_pool(trace: Trace, plan: Plan, allocator: str = "smartpool", time_limit_s: float = DEFAULT_TIME_LIMIT_S,
              seed: int = 0, cost=None, **options) -> Plan:
    """A copy of `plan` with `pool` and `pool_bytes` filled by `layout`.

    Args:
        trace: the trace the plan was made for.
        plan: any plan (its decisions decide the residency intervals).
        allocator: an allocator that returns offsets (smartpool family, cnmem, caching...).
        time_limit_s, seed, cost, options: as for `layout`.
    Returns:
        The plan with pool slots and pool size; its metadata is otherwise unchanged.
    """
    result = layout(trace, plan, allocator=allocator, time_limit_s=time_limit_s, seed=seed, cost=cost, **options)
    return plan.with_meta(pool=result.slots + _kept_gap_slots(plan, result), pool_bytes=result.footprint_bytes)


def _kept_gap_slots(plan: Plan, result: PoolResult) -> tuple[PoolSlot, ...]:
    """A slot for every gap whose storage the step program kept where it was.

    A prefetch due while its swap-out is still in flight cancels the swap, so the program
    has one residency across that gap; the plan still names a slot for the residency that
    starts at the gap's prefetch (`memplan.sim.validate.residency_intervals`): the same
    offset, since the bytes never moved.
    """
    if result.offsets is None:
        return ()
    problem, have, out = result.problem, {(s.storage, s.start) for s in result.slots}, []
    for d in plan.decisions:
        if (d.storage, d.prefetch_at) in have:
            continue
        around = np.flatnonzero((problem.storages == d.storage) & (problem.starts <= d.prefetch_at)
                                & (d.prefetch_at < problem.ends))
        if around.size:
            out.append(PoolSlot(storage=d.storage, start=d.prefetch_at, offset=int(result.offsets[around[0]])))
            have.add((d.storage, d.prefetch_at))
    return tuple(out)
