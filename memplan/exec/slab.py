"""The host slab: one (pinned, on a GPU) byte buffer allocated once, sized from the plan.

Swap-outs take regions from it with a bump pointer; the pointer goes back to zero when
every region has been given back (at the end of each backward pass). A region that does
not fit (the plan under-estimated, e.g. a compression ratio) gets its own buffer, counted
as overflow, so a bad estimate costs memory, never correctness.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

import torch

log = logging.getLogger(__name__)

ALIGN = 512  # bytes: keeps every region aligned for any dtype view and for DMA


def align_up(n: int, align: int = ALIGN) -> int:
    """`n` rounded up to a multiple of `align`."""
    return -(-n // align) * align


@dataclass(frozen=True, kw_only=True)
class Region:
    """A piece of host memory holding one swapped tensor."""

    data: torch.Tensor  # uint8, 1-D
    in_slab: bool  # False for an overflow buffer


class HostSlab:
    """Bump allocator over one host buffer.

    Args:
        nbytes: slab size (rounded up to ALIGN).
        pin: allocate page-locked memory (needed for asynchronous copies from a GPU).
        on_recycle: called when the pointer returns to zero (the engine fence, rule 6).
    """

    def __init__(self, nbytes: int, *, pin: bool = False, on_recycle: Callable[[], None] | None = None):
        self.nbytes = align_up(max(int(nbytes), 0))
        self.pin = pin
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
        self.on_recycle = on_recycle
        self._lock = threading.Lock()  # regions are given back from autograd threads on a GPU
        self._top = 0
        self._live = 0
        self.peak_bytes = 0  # highest slab use seen
        self.overflow_bytes = 0  # bytes handed out outside the slab, in total
        self.overflow_peak_bytes = 0  # most overflow bytes alive at once
        self._overflow_live = 0
        self._warned = False

    def take(self, nbytes: int) -> Region:
        """A region of at least `nbytes` bytes."""
        size = align_up(nbytes)
        with self._lock:
            if self._top + size <= self.nbytes:
                data = self.buffer[self._top:self._top + size]
                self._top += size
                self._live += 1
                self.peak_bytes = max(self.peak_bytes, self._top)
                return Region(data=data, in_slab=True)
            self.overflow_bytes += size
            self._overflow_live += size
            self.overflow_peak_bytes = max(self.overflow_peak_bytes, self._overflow_live)
        (log.debug if self._warned else log.warning)(
            "host slab full (%d of %d bytes used): %d bytes allocated outside it", self._top, self.nbytes, size)
        self._warned = True
        return Region(data=torch.empty(size, dtype=torch.uint8, pin_memory=self.pin), in_slab=False)

    def give_back(self, region: Region) -> None:
        """Return a region; the slab recycles once every region is back."""
        recycle = False
        with self._lock:
            if not region.in_slab:
                self._overflow_live -= region.data.numel()
                return
            self._live -= 1
            if self._live == 0:
                self._top = 0
                recycle = True
        if recycle and self.on_recycle is not None:
            self.on_recycle()

    @property
    def used_bytes(self) -> int:
        """Bytes of the slab handed out now."""
        return self._top

    @property
    def host_bytes(self) -> int:
        """Host memory held: the slab plus live overflow buffers."""
        return self.nbytes + self._overflow_live
