"""Workspace Reuse (paper 003 §III-B): the fastest configuration of one kernel under a workspace limit.

Dynamic programming over micro-batch sizes: T(b) = min over benchmarked sizes s <= b of
T(b - s) + T1(s), where T1(s) is the fastest algorithm on s samples whose workspace fits
the limit. Time adds over micro-batches and the workspace is their largest, so a limit on
each micro-batch is a limit on the configuration. The table is filled for many limits at
once (one row per limit): WR asks for one limit, WD's Pareto front (memplan.conv.wd) for
every workspace value an option has. A split weight gradient also holds its accumulator,
so a split of such a kernel must fit `limit - accumulator`.
"""

from __future__ import annotations

import numpy as np

from ..errors import MemplanError
from .options import Config, Option

try:
    from numba import njit
except ImportError:  # numba is a dependency; without it the DP runs as plain Python, slowly
    def njit(*args, **kwargs):
        return (lambda fn: fn) if not args or not callable(args[0]) else args[0]

_NONE = -1  # "no option fits" in the choice tables


def best_config(options: dict[int, list[Option]], batch: int, limit: int, accumulator: int = 0) -> Config:
    """The fastest configuration of a kernel whose memory (workspace plus accumulator) fits `limit`.

    Args:
        options: per benchmarked micro-batch size (the policy's), the algorithms' options;
            must include `batch` itself.
        batch: the kernel's batch.
        limit: workspace limit in bytes.
        accumulator: bytes a split of this kernel holds besides its workspace.
    Raises:
        MemplanError: no configuration fits (no option of any size fits the limit).
    """
    configs = configs_at(options, batch, np.array([limit], dtype=np.int64), accumulator)
    if configs[0] is None:
        raise MemplanError(f"no algorithm fits a workspace of {limit} bytes at any micro-batch size")
    return configs[0]


def configs_at(options: dict[int, list[Option]], batch: int, limits: np.ndarray, accumulator: int = 0) -> list:
    """The fastest configuration under each of `limits` (None where nothing fits)."""
    sizes = np.array(sorted(s for s in options if s <= batch), dtype=np.int64)
    if batch not in options:
        raise ValueError(f"options must include the batch size {batch}")
    whole_t, whole_k = _fastest(options[batch], limits)
    split_limits = limits - accumulator
    t1, k1 = _table(options, sizes, split_limits)
    total, choice = _dp(t1, sizes, batch)
    split_t, first = _split(total, t1, sizes, batch)
    out = []
    for row in range(len(limits)):
        if whole_t[row] <= split_t[row] and whole_k[row] != _NONE:
            opt = options[batch][whole_k[row]]
            out.append(Config(sizes=(batch,), algos=(opt.algo,), time_s=opt.time_s, workspace_bytes=opt.workspace_bytes))
        elif np.isfinite(split_t[row]):
            out.append(_rebuild(options, sizes, k1[:, row], choice[:, row], first[row], batch, accumulator))
        else:
            out.append(None)
    return out


def _fastest(options: list[Option], limits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per limit, the time and index of the fastest option whose workspace fits (inf, _NONE if none)."""
    if not options:
        return np.full(len(limits), np.inf), np.full(len(limits), _NONE)
    ws = np.array([o.workspace_bytes for o in options], dtype=np.int64)
    times = np.array([o.time_s for o in options])
    order = np.lexsort((times, ws))
    running = np.minimum.accumulate(times[order])
    # index of the option reaching the running minimum, for each prefix of the workspace order
    at = np.maximum.accumulate(np.where(times[order] <= running, np.arange(len(order)), 0))
    count = np.searchsorted(ws[order], limits, side="right")
    fits = count > 0
    last = np.maximum(count - 1, 0)
    return np.where(fits, running[last], np.inf), np.where(fits, order[at[last]], _NONE)


def _table(options, sizes: np.ndarray, limits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """T1 and its option index, sizes x limits."""
    t1 = np.empty((len(sizes), len(limits)))
    k1 = np.empty((len(sizes), len(limits)), dtype=np.int64)
    for j, s in enumerate(sizes):
        t1[j], k1[j] = _fastest(options[int(s)], limits)
    return t1, k1


def _dp(t1: np.ndarray, sizes: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """T(b) for b = 0..batch under every limit (rows b, columns limits), and the size index
    of the last micro-batch."""
    return _dp_kernel(np.ascontiguousarray(t1), np.ascontiguousarray(sizes, dtype=np.int64), batch)


@njit(cache=True)
def _dp_kernel(t1, sizes, batch):
    n_limits = t1.shape[1]
    total = np.full((batch + 1, n_limits), np.inf)
    total[0, :] = 0.0
    choice = np.full((batch + 1, n_limits), _NONE, dtype=np.int64)
    for b in range(1, batch + 1):
        for j in range(sizes.shape[0]):
            s = sizes[j]
            if s > b:
                break
            for row in range(n_limits):
                t = total[b - s, row] + t1[j, row]
                if t < total[b, row]:
                    total[b, row] = t
                    choice[b, row] = j
    return total, choice


def _split(total: np.ndarray, t1: np.ndarray, sizes: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The fastest configuration of `batch` in at least two micro-batches: time and first size index."""
    k = int(np.searchsorted(sizes, batch, side="left"))  # sizes below the batch
    if k == 0:
        return np.full(t1.shape[1], np.inf), np.full(t1.shape[1], _NONE)
    cand = total[batch - sizes[:k]] + t1[:k]
    j = np.argmin(cand, axis=0)
    return np.take_along_axis(cand, j[None], axis=0)[0], j


def _rebuild(options, sizes, k1_row, choice_row, first: int, batch: int, accumulator: int) -> Config:
    """The micro-batches of a split configuration, largest first."""
    parts = [int(first)]
    left = batch - int(sizes[first])
    while left:
        parts.append(int(choice_row[left]))
        left -= int(sizes[parts[-1]])
    chosen = sorted(((int(sizes[j]), options[int(sizes[j])][k1_row[j]]) for j in parts),
                    key=lambda p: (-p[0], p[1].algo))
    return Config(sizes=tuple(s for s, _ in chosen), algos=tuple(o.algo for _, o in chosen),
                  time_s=float(sum(o.time_s for _, o in chosen)),
                  workspace_bytes=max(o.workspace_bytes for _, o in chosen), accumulator_bytes=accumulator)
