"""The host slab: one (pinned, on a GPU) byte buffer allocated once, laid out offline.

Every swap decision of the step program gets a fixed region. Regions of gaps that never
hold data at the same time share bytes: a region is busy from its swap-out (after op
`out_after`) until its prefetch has landed (before op `back_before`), and the regions are
placed with the pool's best-fit allocator over those intervals (memplan.pool), so the slab
is about the most host memory the program holds at once. Gaps across the iteration
boundary hold their data between steps and get regions of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..model import Trace
from ..model.program import StepProgram
from ..pool import make_problem, solve

ALIGN = 512  # bytes: keeps every region aligned for any dtype view and for DMA


def align_up(n: int, align: int = ALIGN) -> int:
    """`n` rounded up to a multiple of `align`."""
    return -(-n // align) * align


def reserve_bytes(nbytes: int, compress_ratio: float | None) -> int:
    """Host bytes reserved for one swapped storage (compressed: bitmask and values apart)."""
    if compress_ratio is None:
        return align_up(nbytes)
    return min(align_up(nbytes), align_up(math.ceil(nbytes * compress_ratio)) + ALIGN)


@dataclass(frozen=True, kw_only=True)
class HostLayout:
    """Where every swap decision's host copy lives in the slab."""

    offsets: dict  # decision index -> byte offset
    sizes: dict  # decision index -> bytes reserved
    nbytes: int  # slab size


def host_layout(trace: Trace, program: StepProgram) -> HostLayout:
    """Lay out the host regions of `program`'s swaps (see the module docstring)."""
    shared, own = [], []
    for k, d in enumerate(program.decisions):
        if d.action == "swap":
            (own if d.wraps else shared).append(k)
    sizes = {k: reserve_bytes(trace.storages[program.decisions[k].storage].nbytes,
                              program.decisions[k].compress_ratio) for k in shared + own}
    offsets, top = {}, 0
    if shared:
        # Half-op time: the swap-out is after its op (2i+1), the wait before its op (2i).
        starts = [2 * program.decisions[k].out_after + 1 for k in shared]
        ends = [2 * program.decisions[k].back_before + 1 for k in shared]
        result = solve(make_problem(starts, ends, [sizes[k] for k in shared], storages=shared),
                       "smartpool-bestfit")
        offsets = {int(k): int(o) for k, o in zip(result.problem.storages, result.offsets)}
        top = align_up(result.footprint_bytes)
    for k in own:
        offsets[k], top = top, top + sizes[k]
    return HostLayout(offsets=offsets, sizes=sizes, nbytes=top)


class HostSlab:
    """The slab buffer and the region of each swap decision.

    Args:
        layout: the offline layout.
        pin: allocate page-locked memory (needed for asynchronous copies from a GPU).
    """

    def __init__(self, layout: HostLayout, *, pin: bool = False):
        self.layout = layout
        self.pin = pin
        self.buffer = torch.empty(layout.nbytes, dtype=torch.uint8, pin_memory=pin)
        self._regions: dict[int, torch.Tensor] = {}  # made once: a swap takes its region at every step

    @property
    def nbytes(self) -> int:
        """Slab size in bytes."""
        return self.buffer.numel()

    def region(self, decision: int) -> torch.Tensor:
        """The uint8 region of one swap decision."""
        region = self._regions.get(decision)
        if region is None:
            offset = self.layout.offsets[decision]
            region = self._regions[decision] = self.buffer[offset: offset + self.layout.sizes[decision]]
        return region

    def release(self) -> None:
        """Drop the buffer (after every copy has finished)."""
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self._regions.clear()
