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

import bisect
from dataclasses import dataclass

import numpy as np

from ..errors import MemplanError
from .api import AllocatorOutcome, register_allocator
from .problem import ROLE_OFFLOAD, ROLE_PREFETCH, PoolProblem

MIB = 2**20
CNMEM_GRANULARITY = 512  # cnmem.cpp: CNMEM_GRANULARITY
# PyTorch CUDACachingAllocator constants
K_MIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB  # kSmallSize: largest "small" allocation
K_SMALL_BUFFER = 2 * MIB  # kSmallBuffer: segment size for small allocations
K_LARGE_BUFFER = 20 * MIB  # kLargeBuffer: segment size for 1-10 MiB allocations
K_MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: at or above this, segments are rounded to 2 MiB
K_ROUND_LARGE = 2 * MIB  # kRoundLarge
ORDERS = ("prefetch-first", "derivative-first")


class PoolExhausted(Exception):
    """A fixed-size pool cannot serve a request (carries what the smallest-pool search needs)."""

    def __init__(self, request: int, largest_free: int):
        super().__init__(f"request of {request} bytes, largest free block {largest_free}")
        self.request = request
        self.largest_free = largest_free


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


# --- a region-based best-fit free list (CNMeM and vDNN++) ------------------------------------

class FreeList:
    """Free blocks (address, size, region) kept in address order; neighbours merge within a region."""

    def __init__(self):
        self.addrs: list[int] = []  # sorted start addresses of free blocks
        self.blocks: dict[int, tuple[int, int]] = {}  # address -> (size, region)
        self.region_starts: list[int] = [0]  # start address of each device region, ascending

    def region_of(self, addr: int) -> int:
        """Index of the region holding `addr`."""
        return bisect.bisect_right(self.region_starts, addr) - 1

    def add(self, addr: int, size: int, region: int) -> None:
        """Return [addr, addr+size) to the free list, merging with free neighbours in the same region."""
        k = bisect.bisect_left(self.addrs, addr)
        if k < len(self.addrs):
            nxt = self.addrs[k]
            nsize, nreg = self.blocks[nxt]
            if nxt == addr + size and nreg == region:
                size += nsize
                del self.blocks[nxt], self.addrs[k]
        if k > 0:
            prv = self.addrs[k - 1]
            psize, preg = self.blocks[prv]
            if prv + psize == addr and preg == region:
                self.blocks[prv] = (psize + size, region)
                return
        self.addrs.insert(k, addr)
        self.blocks[addr] = (size, region)

    def take(self, size: int, high: bool = False) -> int | None:
        """Best-fit (smallest block, lowest address) at the block's front, or with `high` the
        highest-addressed fitting block at its end; None when nothing fits."""
        fits = [(s, a) for a, (s, _) in self.blocks.items() if s >= size]
        if not fits:
            return None
        bsize, addr = max(fits, key=lambda t: t[1]) if high else min(fits)
        region = self.blocks[addr][1]
        k = bisect.bisect_left(self.addrs, addr)
        del self.blocks[addr], self.addrs[k]
        if bsize > size:
            rest = (addr, bsize - size) if high else (addr + size, bsize - size)
            self.add(rest[0], rest[1], region)
        return addr + bsize - size if high else addr

    def largest(self) -> int:
        """Size of the largest free block (0 if none)."""
        return max((s for s, _ in self.blocks.values()), default=0)


def run_cnmem(problem: PoolProblem, pool_bytes: int, grow: bool, high_end: bool = False,
              order: str = "prefetch-first") -> tuple[np.ndarray, int, int]:
    """Simulate CNMeM (or vDNN++ high-end) on the request sequence.

    Args:
        problem: the buffers.
        pool_bytes: initial pool size.
        grow: add a region of exactly the rounded size when nothing fits (else raise PoolExhausted).
        high_end: place ROLE_OFFLOAD buffers at the highest free address (vDNN++).
        order: allocation order at one time step (see `events`).
    Returns:
        (offsets, reserved bytes, number of device allocation calls).
    """
    free = FreeList()
    reserved, regions = round_up(pool_bytes, CNMEM_GRANULARITY), 1
    if reserved:
        free.add(0, reserved, 0)
    offsets = np.zeros(problem.n, np.int64)
    for kind, i in events(problem, order):
        size = round_up(int(problem.sizes[i]), CNMEM_GRANULARITY)
        if kind == "free":
            free.add(int(offsets[i]), size, free.region_of(int(offsets[i])))
            continue
        addr = free.take(size, high=high_end and problem.roles[i] == ROLE_OFFLOAD)
        if addr is None:
            if not grow:
                raise PoolExhausted(size, free.largest())
            addr, reserved, regions = reserved, reserved + size, regions + 1
            free.region_starts.append(addr)
        offsets[i] = addr
    return offsets, reserved, regions


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
    from .poolsize import smallest_pool

    search = smallest_pool(problem, high_end=True, order=order)
    offsets, reserved, _ = run_cnmem(problem, search.pool_bytes, grow=False, high_end=True, order=order)
    return AllocatorOutcome(footprint_bytes=reserved, offsets=offsets,
                            details={"order": order, "restarts": search.restarts})


# --- PyTorch's CUDA caching allocator --------------------------------------------------------

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
                if other is block.prev:
                    other.size += block.size
                    other.next = block.next
                    if block.next:
                        block.next.prev = other
                    if self.tails[small] is block:
                        self.tails[small] = other
                    block = other
                else:
                    block.size += other.size
                    block.next = other.next
                    if other.next:
                        other.next.prev = block
                    if self.tails[small] is other:
                        self.tails[small] = block
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
