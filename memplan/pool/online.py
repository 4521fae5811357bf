"""Online allocator simulators (placeholder: exact only)."""

from __future__ import annotations

from .api import AllocatorOutcome, register_allocator
from .problem import PoolProblem


@register_allocator("exact", "one cudaMalloc per buffer: footprint = peak load, one allocation call per buffer")
def exact(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0) -> AllocatorOutcome:
    """cudaMalloc/cudaFree per buffer: never fragments here, pays one call per buffer."""
    return AllocatorOutcome(footprint_bytes=problem.peak_load_bytes, offsets=None, alloc_calls=problem.n)
