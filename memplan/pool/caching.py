"""PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) over a request
sequence, faithful to its constants, with or without expandable segments."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from .problem import PoolProblem
from .sequence import events, round_up

MIB = 2**20
# PyTorch CUDACachingAllocator constants
K_MIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB  # kSmallSize: largest "small" allocation
K_SMALL_BUFFER = 2 * MIB  # kSmallBuffer: segment size for small allocations
K_LARGE_BUFFER = 20 * MIB  # kLargeBuffer: segment size for 1-10 MiB allocations
K_MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: at or above this, segments are rounded to 2 MiB
K_ROUND_LARGE = 2 * MIB  # kRoundLarge


@dataclass
class _Block:
    addr: int  # address (segments laid end to end)
    size: int  # bytes
    segment: int  # segment id; blocks merge only within one
    small: bool  # belongs to the small pool
    free: bool = True
    prev: "_Block | None" = None
    next: "_Block | None" = None


class CachingAllocator:
    """PyTorch's caching allocator for one stream, no memory limit, never releasing cache."""

    def __init__(self, expandable: bool = False):
        self.expandable = expandable
        self.pools: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}  # small? -> sorted (size, addr, id)
        self.by_id: dict[int, _Block] = {}
        self.reserved = 0
        self.segments = 0
        self.tails: dict[bool, _Block | None] = {True: None, False: None}  # expandable: last block per pool

    @staticmethod
    def round_size(size: int) -> int:
        """round_size(): at least 512 B, a multiple of 512."""
        return max(K_MIN_BLOCK, round_up(size, K_MIN_BLOCK))

    @staticmethod
    def allocation_size(size: int) -> int:
        """get_allocation_size(): the segment a cudaMalloc would reserve for `size`."""
        if size <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if size < K_MIN_LARGE_ALLOC:
            return K_LARGE_BUFFER
        return round_up(size, K_ROUND_LARGE)

    def _join(self, small: bool, left: _Block, right: _Block) -> _Block:
        """`right` merged into its free neighbour `left`; returns `left`."""
        left.size += right.size
        left.next = right.next
        if right.next:
            right.next.prev = left
        if self.tails[small] is right:
            self.tails[small] = left
        return left

    def _insert(self, small: bool, block: _Block) -> None:
        self.by_id[id(block)] = block
        bisect.insort(self.pools[small], (block.size, block.addr, id(block)))

    def _remove(self, small: bool, block: _Block) -> None:
        pool = self.pools[small]
        del pool[bisect.bisect_left(pool, (block.size, block.addr, id(block)))]

    def malloc(self, size: int) -> _Block:
        """Serve one request; returns the allocated block."""
        size = self.round_size(size)
        small = size <= K_SMALL_SIZE
        pool = self.pools[small]
        k = bisect.bisect_left(pool, (size, -1, -1))
        if k < len(pool):
            block = self.by_id[pool[k][2]]
            self._remove(small, block)
        else:
            block = self._expand(small, size) if self.expandable else self._new_segment(small, size)
        remaining = block.size - size
        if remaining >= K_MIN_BLOCK if small else remaining > K_SMALL_SIZE:
            rest = _Block(addr=block.addr + size, size=remaining, segment=block.segment, small=small, prev=block,
                          next=block.next)
            if block.next:
                block.next.prev = rest
            block.next, block.size = rest, size
            if self.tails[small] is block:
                self.tails[small] = rest
            self._insert(small, rest)
        block.free = False
        return block

    def _new_segment(self, small: bool, size: int) -> _Block:
        alloc = self.allocation_size(size)
        block = _Block(addr=self.reserved, size=alloc, segment=self.segments, small=small)
        self.reserved += alloc
        self.segments += 1
        return block

    def _expand(self, small: bool, size: int) -> _Block:
        """Expandable segments: map more pages at the end of this pool's one segment."""
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        tail = self.tails[small]
        have = tail.size if tail is not None and tail.free else 0
        grow = round_up(size - have, page)
        self.reserved += grow
        self.segments += 1  # one more mapping call
        if have:
            self._remove(small, tail)
            tail.size += grow
            return tail
        # Each pool's segment lives in its own (virtual) range; lay them out by reserve order.
        block = _Block(addr=_VA_BASE[small] + (tail.addr + tail.size if tail else 0), size=grow, segment=int(small),
                       small=small, prev=tail)
        if tail is not None:
            tail.next = block
        self.tails[small] = block
        return block

    def free(self, block: _Block) -> None:
        """Return a block, merging with free neighbours of the same segment."""
        small = block.small
        block.free = True
        for other in (block.prev, block.next):
            if other is not None and other.free and other.segment == block.segment:
                self._remove(small, other)
                block = self._join(small, *((other, block) if other is block.prev else (block, other)))
        self._insert(small, block)

_VA_BASE = {True: 0, False: 1 << 50}  # expandable: small and large segments in separate virtual ranges


def run_caching(problem: PoolProblem, expandable: bool) -> tuple[np.ndarray | None, int, int]:
    """Simulate the caching allocator.

    Returns:
        (offsets, peak reserved bytes, device calls). Offsets are addresses with segments
        laid end to end; None with expandable segments (two growing virtual ranges).
    """
    alloc = CachingAllocator(expandable)
    blocks: dict[int, _Block] = {}
    offsets = np.zeros(problem.n, np.int64)
    for kind, i in events(problem):
        if kind == "free":
            alloc.free(blocks.pop(i))
        else:
            blocks[i] = alloc.malloc(int(problem.sizes[i]))
            offsets[i] = blocks[i].addr
    return (None if expandable else offsets), alloc.reserved, alloc.segments
