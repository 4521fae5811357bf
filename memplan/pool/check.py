"""Validation of a pool layout: no two buffers alive at the same time share an address."""

from __future__ import annotations

import bisect

import numpy as np

from .problem import PoolProblem


class LayoutError(AssertionError):
    """A layout that places two live buffers at overlapping addresses (a bug, not user input)."""


def check_layout(problem: PoolProblem, offsets: np.ndarray, footprint: int | None = None) -> int:
    """Check offsets against lifetimes; return the footprint they need.

    Args:
        problem: the buffers.
        offsets: byte offset per buffer.
        footprint: if given, every buffer must also end at or below it.
    Returns:
        The footprint: max(offset + size), 0 when there are no buffers.
    Raises:
        LayoutError: a negative offset, a buffer past `footprint`, or two overlapping buffers.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    if len(offsets) != problem.n:
        raise LayoutError(f"{len(offsets)} offsets for {problem.n} buffers")
    if problem.n == 0:
        return 0
    if offsets.min() < 0:
        raise LayoutError(f"negative offset for buffer {int(offsets.argmin())}")
    tops = offsets + problem.sizes
    need = int(tops.max())
    if footprint is not None and need > footprint:
        raise LayoutError(f"buffer {int(tops.argmax())} ends at {need}, past the footprint {footprint}")
    n = problem.n
    # Events: the n frees (kind 0) sort before the n allocations (kind 1) at equal times.
    order = np.lexsort((np.repeat([0, 1], n), np.concatenate((problem.ends, problem.starts))))
    a, b = _first_clash(order, offsets, tops)
    if a >= 0:
        raise LayoutError(f"buffers {problem.names[a]} and {problem.names[b]} overlap in time and address")
    return need


def _first_clash(order: np.ndarray, offsets: np.ndarray, tops: np.ndarray) -> tuple[int, int]:
    """Sweep over time keeping the live buffers sorted by offset: a new buffer clashes with some
    live one iff it clashes with its neighbour below or above (live buffers are disjoint, so
    their offsets are distinct).

    Args:
        order: event order; event e < n frees buffer e, event e >= n allocates buffer e - n.
        offsets, tops: start and end address of every buffer.
    Returns:
        (a, b), two buffers alive together at overlapping addresses, or (-1, -1).
    """
    n = len(offsets)
    offsets, tops = offsets.tolist(), tops.tolist()
    live_off: list[int] = []
    live_idx: list[int] = []
    for e in order.tolist():
        i = e % n
        pos = bisect.bisect_left(live_off, offsets[i])
        if e < n:  # a free: the live buffer at this offset is i
            del live_off[pos], live_idx[pos]
            continue
        if pos > 0 and tops[live_idx[pos - 1]] > offsets[i]:
            return live_idx[pos - 1], i
        if pos < len(live_off) and live_off[pos] < tops[i]:
            return live_idx[pos], i
        live_off.insert(pos, offsets[i])
        live_idx.insert(pos, i)
    return -1, -1
