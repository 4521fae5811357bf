"""Validation of a pool layout: no two buffers alive at the same time share an address."""

from __future__ import annotations

import numba
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


@numba.njit(cache=True)
def _first_clash(order, offsets, tops):
    """Sweep over time keeping the live buffers sorted by offset: a new buffer clashes with some
    live one iff it clashes with its neighbour below or above (live buffers are disjoint).

    Args:
        order: event order; event e < n frees buffer e, event e >= n allocates buffer e - n.
        offsets, tops: start and end address of every buffer.
    Returns:
        (a, b), two buffers alive together at overlapping addresses, or (-1, -1).
    """
    n = len(offsets)
    live_off = np.empty(n, np.int64)
    live_idx = np.empty(n, np.int64)
    m = 0
    for e in order:
        i = e % n
        pos = np.searchsorted(live_off[:m], offsets[i])
        if e < n:  # a free
            while pos < m and live_idx[pos] != i:
                pos += 1
            if pos < m:
                live_off[pos:m - 1] = live_off[pos + 1:m].copy()
                live_idx[pos:m - 1] = live_idx[pos + 1:m].copy()
                m -= 1
            continue
        if pos > 0 and tops[live_idx[pos - 1]] > offsets[i]:
            return live_idx[pos - 1], i
        if pos < m and live_off[pos] < tops[i]:
            return live_idx[pos], i
        live_off[pos + 1:m + 1] = live_off[pos:m].copy()
        live_idx[pos + 1:m + 1] = live_idx[pos:m].copy()
        live_off[pos] = offsets[i]
        live_idx[pos] = i
        m += 1
    return -1, -1
