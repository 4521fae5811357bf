"""AutoSwap candidates and priority scores (paper 000 §IV-A and §IV-B).

A candidate is one *gap* of one storage: the ops strictly between two consecutive
accesses, during which the storage could live on the host. Cross-iteration storages
(weights, optimizer state) also have the wrap-around gap from their last access in one
iteration to their first access in the next (§VI-B3). Everything here works on numpy
arrays indexed by candidate; times are the unconstrained op start times of the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.model import Cost
from ..model import Trace

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
            if back_before <= out_after or _spans(out_after, back_before, peak):
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


def _spans(out_after: int, back_before: int, op: int) -> bool:
    """True when `op` lies strictly inside the gap (the storage is away while it runs)."""
    if back_before > out_after:
        return out_after < op < back_before
    return op > out_after or op < back_before


def absent_mask(n_ops: int, out_after: int, until: int) -> np.ndarray:
    """Boolean mask of the ops out_after+1 .. until-1, wrapping around when until <= out_after."""
    mask = np.zeros(n_ops, dtype=bool)
    if until > out_after:
        mask[out_after + 1:until] = True
    else:
        mask[out_after + 1:] = True
        mask[:until] = True
    return mask


def _window(prefix: np.ndarray, out_after: np.ndarray, back_before: np.ndarray) -> np.ndarray:
    """Sum of a per-op quantity (given as its prefix sums) over each gap, wrapping around."""
    total = prefix[-1]
    inner = prefix[back_before] - prefix[out_after + 1]
    return np.where(back_before > out_after, inner, inner + total)


def op_starts(cost: Cost) -> np.ndarray:
    """Unconstrained start time of every op, plus the iteration end as the last entry."""
    return np.concatenate([[0.0], np.cumsum(cost.durations)])


def doa(cand: Candidates, cost: Cost) -> np.ndarray:
    """Duration of Absence: time between the two accesses minus swap-out and swap-in time."""
    gap_s = _window(op_starts(cost), cand.out_after, cand.back_before)
    copy_s = np.array([cost.d2h_s(int(n)) + cost.h2d_s(int(n)) for n in cand.nbytes], dtype=np.float64)
    return gap_s - copy_s


def aoa(cand: Candidates, cost: Cost) -> np.ndarray:
    """Area of Absence: DOA x size, or DOA / size where DOA is negative (§IV-B ii)."""
    d = doa(cand, cost)
    size = cand.nbytes.astype(np.float64)
    return np.where(d >= 0, d * size, d / size)


def wdoa(cand: Candidates, cost: Cost, load: np.ndarray) -> np.ndarray:
    """Weighted DOA: area under the load curve (byte-seconds) between the two accesses."""
    area = np.concatenate([[0.0], np.cumsum(load.astype(np.float64) * cost.durations)])
    return _window(area, cand.out_after, cand.back_before)


def swdoa(cand: Candidates, cost: Cost, load: np.ndarray) -> np.ndarray:
    """Submodular WDOA: WDOA recomputed on the updated load after each greedy selection.

    Returns:
        Per candidate, its WDOA at the moment it was selected. These values never grow
        from one selection to the next (the load only shrinks), so sorting by them
        descending reproduces the greedy selection order.
    """
    n = len(load)
    current = load.astype(np.float64)
    score = np.empty(len(cand), dtype=np.float64)
    remaining = np.ones(len(cand), dtype=bool)
    for _ in range(len(cand)):
        values = wdoa(cand, cost, current)
        values[~remaining] = -np.inf
        best = int(np.argmax(values))
        score[best] = values[best]
        remaining[best] = False
        current[absent_mask(n, int(cand.out_after[best]), int(cand.back_before[best]))] -= cand.nbytes[best]
    return score


def all_scores(cand: Candidates, cost: Cost, load: np.ndarray) -> dict[str, np.ndarray]:
    """The four priority scores of §IV-B, by name."""
    return {"aoa": aoa(cand, cost), "doa": doa(cand, cost), "wdoa": wdoa(cand, cost, load),
            "swdoa": swdoa(cand, cost, load)}


def standardize(x: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance (a constant score becomes all zeros)."""
    sd = float(np.std(x))
    return (x - float(np.mean(x))) / sd if sd > 0 else np.zeros_like(x, dtype=np.float64)
