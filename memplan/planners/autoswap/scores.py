"""AutoSwap's priority scores (paper 000 §IV-B) of its candidate gaps
(`memplan.planners.kit.candidates`, §IV-A).

Everything here works on numpy arrays indexed by candidate; times are the unconstrained op
start times of the cost model.
"""

from __future__ import annotations

import numpy as np

from ...cost.model import Cost
from ..kit.candidates import Candidates
from ..kit.gaps import away_mask
from ..kit.ops import op_starts

def _window(prefix: np.ndarray, out_after: np.ndarray, back_before: np.ndarray) -> np.ndarray:
    """Sum of a per-op quantity (given as its prefix sums) over each gap, wrapping around."""
    total = prefix[-1]
    inner = prefix[back_before] - prefix[out_after + 1]
    return np.where(back_before > out_after, inner, inner + total)


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
        current[away_mask(n, int(cand.out_after[best]), int(cand.back_before[best]))] -= cand.nbytes[best]
    return score


def all_scores(cand: Candidates, cost: Cost, load: np.ndarray) -> dict[str, np.ndarray]:
    """The four priority scores of §IV-B, by name."""
    return {"aoa": aoa(cand, cost), "doa": doa(cand, cost), "wdoa": wdoa(cand, cost, load),
            "swdoa": swdoa(cand, cost, load)}


def standardize(x: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance (a constant score becomes all zeros)."""
    sd = float(np.std(x))
    return (x - float(np.mean(x))) / sd if sd > 0 else np.zeros_like(x, dtype=np.float64)
