"""NVIDIA CNMeM's allocation (and vDNN++'s high-end variant) over a request sequence.

512 B granularity, best-fit over an address-ordered free list, allocation at the front of
the block, a new region of exactly the rounded size when nothing fits, regions never merged.
"""

from __future__ import annotations

import bisect

import numpy as np

from .problem import ROLE_OFFLOAD, PoolProblem
from .sequence import events, round_up

CNMEM_GRANULARITY = 512  # cnmem.cpp: CNMEM_GRANULARITY


class PoolExhausted(Exception):
    """A fixed-size pool cannot serve a request (carries what the smallest-pool search needs)."""

    def __init__(self, request: int, largest_free: int):
        super().__init__(f"request of {request} bytes, largest free block {largest_free}")
        self.request = request
        self.largest_free = largest_free


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
