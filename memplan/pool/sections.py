"""Time sections of a pool problem: the stretches between consecutive start/end times, in which
the set of live buffers does not change (the unit of the search's inference)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import PoolProblem


@dataclass(frozen=True)
class Sections:
    """Per buffer its section range; per section the bytes alive; per boundary the buffers crossing it."""

    lo: np.ndarray  # int64 per buffer: its first section
    hi: np.ndarray  # int64 per buffer: one past its last section
    total: np.ndarray  # int64 per section: bytes alive in it
    cuts: np.ndarray  # int64 per boundary b: buffers alive in both section b and b+1 (zero: independent sides)

    @property
    def count(self) -> int:
        """Number of sections."""
        return len(self.total)


def sections(problem: PoolProblem) -> Sections:
    """The time sections of `problem`."""
    times = np.unique(np.concatenate([problem.starts, problem.ends]))
    lo = np.searchsorted(times, problem.starts).astype(np.int64)
    hi = np.searchsorted(times, problem.ends).astype(np.int64)
    count = max(len(times) - 1, 0)
    return Sections(lo=lo, hi=hi, total=_prefix_sum(lo, hi, problem.sizes, count),
                    cuts=_prefix_sum(lo, hi - 1, np.ones(problem.n, np.int64), max(count - 1, 0)))


def _prefix_sum(lo: np.ndarray, hi: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
    """out[k] = sum of values[i] over i with lo[i] <= k < hi[i], for k < length."""
    delta = np.zeros(length + 2, np.int64)
    np.add.at(delta, lo, values)
    np.add.at(delta, hi, -values)
    return np.cumsum(delta)[:length].copy()
