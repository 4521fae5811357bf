"""Online allocator simulators: what a real allocator would reserve for the same buffers.

They see one iteration as a sequence of requests (at each time step, frees before
allocations, allocations in buffer order) and never look ahead. Their footprint is the
peak memory they reserve from the device. Addresses of separate device regions (segments)
are laid end to end, so their placements are valid pool offsets too (and validated).

  exact              one cudaMalloc per buffer: footprint = peak load, one call per buffer.
  cnmem              NVIDIA CNMeM: 512 B granularity, best-fit over an address-ordered free
                     list, allocation at the front of the block, a new region of exactly
                     the rounded size when nothing fits, regions never merged. Initial pool
                     = peak load (as vDNN/vDNN++ configure it).
  caching            PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp).
  caching-expandable the same with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).
  vdnnpp-highend     paper 001: best-fit, but the first residency of a buffer to be
                     offloaded goes to the highest free address; pool from the smallest-
                     pool search; `order` prefetch-first or derivative-first.
"""

from __future__ import annotations

from ..cnmem import run_cnmem
from ..caching import run_caching
from ..poolsize import smallest_pool
from ..problem import PoolProblem
from .base import AllocatorOutcome, register_allocator


@register_allocator("exact", "one cudaMalloc per buffer: footprint = peak load, one allocation call per buffer")
def exact(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0) -> AllocatorOutcome:
    """cudaMalloc/cudaFree per buffer: no pool, no fragmentation, one call per buffer."""
    return AllocatorOutcome(footprint_bytes=problem.peak_load_bytes, offsets=None, alloc_calls=problem.n)


@register_allocator("cnmem", "NVIDIA CNMeM: best-fit, 512 B granularity, grows by new regions never merged")
def cnmem(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0,
          pool_bytes: int | None = None) -> AllocatorOutcome:
    """CNMeM with an initial pool of `pool_bytes` (default: the peak load), growing as needed."""
    initial = problem.peak_load_bytes if pool_bytes is None else pool_bytes
    offsets, reserved, regions = run_cnmem(problem, initial, grow=True)
    return AllocatorOutcome(footprint_bytes=reserved, offsets=offsets, alloc_calls=regions,
                            details={"initial_pool_bytes": initial, "regions": regions})


@register_allocator("vdnnpp-highend", "paper 001: best-fit, offloaded buffers at the highest address; smallest pool")
def vdnnpp_highend(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0,
                   order: str = "prefetch-first") -> AllocatorOutcome:
    """vDNN++'s non-offloaded high-end allocation in the smallest pool the paper's search finds."""
    search = smallest_pool(problem, high_end=True, order=order)
    offsets, reserved, _ = run_cnmem(problem, search.pool_bytes, grow=False, high_end=True, order=order)
    return AllocatorOutcome(footprint_bytes=reserved, offsets=offsets,
                            details={"order": order, "restarts": search.restarts})


@register_allocator("caching", "PyTorch CUDA caching allocator: 512 B rounding, 2/20 MiB segments, best-fit, no release")
def caching(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0) -> AllocatorOutcome:
    """PyTorch's default CUDA caching allocator."""
    offsets, reserved, calls = run_caching(problem, expandable=False)
    return AllocatorOutcome(footprint_bytes=reserved, offsets=offsets, alloc_calls=calls)


@register_allocator("caching-expandable", "PyTorch caching allocator with expandable segments")
def caching_expandable(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0) -> AllocatorOutcome:
    """PyTorch's caching allocator with expandable_segments:True."""
    _, reserved, calls = run_caching(problem, expandable=True)
    return AllocatorOutcome(footprint_bytes=reserved, offsets=None, alloc_calls=calls)
