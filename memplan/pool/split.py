"""Splitting a pool problem into independent atoms, without losing optimality.

Two rules, applied recursively:
  - buffers alive over the whole time range of a (sub)problem conflict with every other buffer
    there, so stacking them at its bottom loses nothing: in any layout, collapsing their address
    ranges and putting them underneath keeps every other pair apart and no top rises;
  - between two time ranges that no buffer crosses, layouts are independent: they share a base.
An atom is what is left: buffers placed on top of `base` bytes of stacked buffers. An optimal
layout of every atom is optimal for the whole; the footprint is the highest base + atom top.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import PoolProblem


@dataclass(frozen=True)
class Atom:
    """Buffers of the original problem laid out together above `base`."""

    index: np.ndarray  # their indices in the original problem
    base: int  # bytes of stacked buffers below them


@dataclass(frozen=True)
class Split:
    """The stacked buffers (their offsets are final) and the atoms."""

    stacked: np.ndarray  # indices of stacked buffers
    stacked_offsets: np.ndarray  # their offsets
    atoms: list[Atom]


def split(problem: PoolProblem) -> Split:
    """Stack spanning buffers and separate independent time ranges, recursively."""
    stacked, offsets, atoms = [], [], []
    pending = [(np.arange(problem.n), 0)]
    while pending:
        index, base = pending.pop()
        spanning, ranges = _split_once(problem, index)
        if len(spanning):
            order = spanning[np.argsort(-problem.sizes[spanning], kind="stable")]
            sizes = problem.sizes[order]
            stacked.append(order)
            offsets.append(base + np.cumsum(sizes) - sizes)
            base += int(sizes.sum())
        if len(spanning) or len(ranges) > 1:
            pending.extend((part, base) for part in ranges)
        elif len(ranges) == 1:
            atoms.append(Atom(index=ranges[0], base=base))
    atoms.sort(key=lambda atom: int(atom.index[0]))
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
    return Split(stacked=cat(stacked), stacked_offsets=cat(offsets), atoms=atoms)


def _split_once(problem: PoolProblem, index: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Buffers of `index` alive over its whole time range, and the others split into
    independent time ranges (each an index array, in start order)."""
    starts, ends = problem.starts[index], problem.ends[index]
    spanning = (starts == starts.min()) & (ends == ends.max())
    rest = index[~spanning]
    if rest.size == 0:
        return index[spanning], []
    order = rest[np.argsort(problem.starts[rest], kind="stable")]
    reach = np.maximum.accumulate(problem.ends[order])
    cuts = np.flatnonzero(reach[:-1] <= problem.starts[order][1:]) + 1
    return index[spanning], np.split(order, cuts)
