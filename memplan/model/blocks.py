"""Bytes as the CUDA caching allocator counts them (c10/cuda/CUDACachingAllocator.cpp).

Every block is at least kMinBlockSize (512) bytes and a multiple of it (`round_size`);
a request of 0 bytes takes no block. `torch.cuda.memory_allocated` sums block sizes, and a
memory snapshot's trace events give the requested sizes, so both a snapshot's import and a
trace seen as a GPU holds it (memplan.cost.device_memory) count blocks.
"""

from __future__ import annotations

MIN_BLOCK = 512  # kMinBlockSize: the smallest block and the rounding step


def allocated_size(nbytes: int) -> int:
    """Bytes the CUDA caching allocator's counters charge for a request of `nbytes`."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK
