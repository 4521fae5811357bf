"""Validation of a pool layout: no two buffers alive at the same time share an address."""

from __future__ import annotations

import numpy as np

from .greedy import conflict_graph
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
    indptr, indices = conflict_graph(problem)
    i = np.repeat(np.arange(problem.n), np.diff(indptr))
    j = indices.astype(np.int64)
    clash = (offsets[i] < tops[j]) & (offsets[j] < tops[i])
    if clash.any():
        a, b = int(i[clash][0]), int(j[clash][0])
        raise LayoutError(f"buffers {problem.names[a]} and {problem.names[b]} overlap in time and address")
    return need
