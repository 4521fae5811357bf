"""Candidate gaps: every gap a storage can leave device memory for, as AutoSwap lists them
(paper 000 §IV-A and §VI-B); `autoswap` ranks them, `milp` decides over them.

A candidate is one *gap* of one storage: the ops strictly between two consecutive
accesses, during which the storage could live on the host. Cross-iteration storages
(weights, optimizer state) also have the wrap-around gap from their last access in one
iteration to their first access in the next (§VI-B3). The candidates are parallel numpy
arrays indexed by candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...model import Trace
from .gaps import gap_covers

MIB = 2**20
DEFAULT_MIN_BYTES = MIB  # §IV-A: tiny variables (bias vectors) are not worth the link latency


@dataclass(frozen=True, kw_only=True, eq=False)
class Candidates:
    """Candidate gaps as parallel arrays (one entry per gap)."""

    storage: np.ndarray  # storage id per gap (int64)
    out_after: np.ndarray  # last op touching the storage before the gap (int64)
    back_before: np.ndarray  # next op touching it (wraps around when <= out_after) (int64)
    nbytes: np.ndarray  # size of the storage (int64)
    primary: np.ndarray  # True for §IV-A candidates, False for multi-swap extras (bool)

    def __len__(self) -> int:
        return len(self.storage)

    @property
    def wraps(self) -> np.ndarray:
        """True for gaps across the iteration boundary."""
        return self.back_before <= self.out_after

    def subset(self, mask: np.ndarray) -> "Candidates":
        """The candidates where `mask` is True (or at the given indices)."""
        return Candidates(storage=self.storage[mask], out_after=self.out_after[mask],
                          back_before=self.back_before[mask], nbytes=self.nbytes[mask],
                          primary=self.primary[mask])


def find_candidates(trace: Trace, min_bytes: int = DEFAULT_MIN_BYTES, multi_swap: bool = False) -> Candidates:
    """The swap candidates of §IV-A, optionally followed by the multi-swap extras of §VI-B1.

    Args:
        trace: the iteration.
        min_bytes: storages smaller than this are never candidates.
        multi_swap: also list every other gap of every large-enough storage (not only
            the one spanning the peak), so a storage may be swapped more than once.
    Returns:
        The primary candidates (gap spanning the peak op, plus wrap-around gaps of
        persistent storages) first, then the extras, each group in storage order.
    """
    peak = trace.peak_op
    primary: list[tuple[int, int, int, int, int]] = []
    extra: list[tuple[int, int, int, int, int]] = []
    for s in trace.storages:
        if s.nbytes < min_bytes:
            continue
        for out_after, back_before in _gaps(trace, s.id):
            if back_before <= out_after or gap_covers(out_after, back_before, peak):
                primary.append((s.id, out_after, back_before, s.nbytes, 1))
            elif multi_swap:
                extra.append((s.id, out_after, back_before, s.nbytes, 0))
    cols = np.array(primary + extra, dtype=np.int64).reshape(-1, 5)
    return Candidates(storage=cols[:, 0], out_after=cols[:, 1], back_before=cols[:, 2], nbytes=cols[:, 3],
                      primary=cols[:, 4].astype(bool))


def _gaps(trace: Trace, sid: int) -> list[tuple[int, int]]:
    """Gaps with at least one op between two consecutive accesses of storage `sid`."""
    acc = trace.accesses[sid]
    s = trace.storages[sid]
    gaps = [(a, b) for a, b in zip(acc, acc[1:]) if b - a >= 2]
    n = trace.num_steps
    if s.persistent and acc and (n - 1 - acc[-1]) + acc[0] >= 1:
        gaps.append((acc[-1], acc[0]))
    return gaps
