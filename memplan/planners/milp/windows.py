"""Where the `milp` model lets a unit be released and prefetched: the positions of its windows
(memplan.planners.milp.model).

A unit's gap offers release positions (the swap-out is released there, its copy done) and trigger
positions (its prefetch is issued there). The model puts a column on the first `window` release
positions and the last `window` trigger positions of a gap (every one with window=0). A storage
across the iteration boundary, whose head may be most of the step, may also be prefetched at up to
`window` of the positions that end a stretch over the budget (it comes back as soon as the peak is
past), and a copy carried over into the step may also be released at up to `window` of the head's
positions over the budget (only there does a release before its prefetch matter) and at its
trigger positions (its prefetch releases it at the latest).
"""

from __future__ import annotations

import numpy as np

from .layers import LayerProblem

MAX_POSITIONS = 0  # window value meaning "the whole gap"


class Windows:
    """The release and trigger positions (indices into `LayerProblem.positions`) of each unit."""

    def __init__(self, problem: LayerProblem, budget_bytes: int, window: int):
        self.p, self.window = problem, window
        self.over = np.maximum(problem.seg_load, problem.pre_load) > budget_bytes  # per position

    def gap(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(release positions, trigger positions) of unit k: both its gap's, or for a wrap-around
        unit the tail after out_after and the head up to back_before (a carried one's both the head)."""
        u, pos = self.p.units[k], self.p.positions
        if u.wraps:
            head = np.flatnonzero(pos <= u.back_before)
            return (head if u.carried else np.flatnonzero(pos > u.out_after)), head
        gap = np.flatnonzero((pos > u.out_after) & (pos <= u.back_before))
        return gap, gap

    def triggers(self, k: int, positions: np.ndarray) -> np.ndarray:
        """Unit k's trigger positions among its gap's `positions` (see the module docstring)."""
        size = self.size(positions)
        last = positions[len(positions) - size:]
        if not self.p.units[k].wraps:
            return last
        over = self.over[positions]
        ends = positions[1:][over[:-1] & ~over[1:]]
        return np.union1d(_spread(ends, size), last)

    def releases(self, k: int, positions: np.ndarray, triggers: np.ndarray) -> np.ndarray:
        """Unit k's release positions among its gap's `positions`, given its `triggers` (see the module
        docstring)."""
        size = self.size(positions)
        first = positions[:size]
        if not self.p.units[k].carried:
            return first
        return np.union1d(np.union1d(first, _spread(positions[self.over[positions]], size)), triggers)

    def size(self, positions: np.ndarray) -> int:
        """The positions a window holds at each end of `positions`."""
        return len(positions) if self.window == MAX_POSITIONS else min(self.window, len(positions))

    def reach(self) -> int:
        """How many positions before a due op the model's prefetch cuts start from."""
        return len(self.p.positions) if self.window == MAX_POSITIONS else self.window


def _spread(positions: np.ndarray, size: int) -> np.ndarray:
    """At most `size` of `positions`, evenly spread among them (the first and the last included)."""
    if len(positions) <= size:
        return positions
    return positions[np.unique(np.linspace(0, len(positions) - 1, size).round().astype(int))]
