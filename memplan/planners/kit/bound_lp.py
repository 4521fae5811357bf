"""The lower bound's linear program (see `memplan.planners.kit.bound` for what it relaxes).

Time in milliseconds, memory in MiB (HiGHS' absolute tolerances far below a nanosecond and a byte).

Columns: per time op j (a check op, a release or a due op) the delay delta_j: how much later op j
starts than without a plan (non-decreasing in j), and delta_end, the step's overhead. Per unit k
and check op i where it may be away: x (away by a swap), y (away by a recomputation), and their
running maxima: z (swapped and away at some op <= i: its copy out is done by i), w (swapped and
away at some op >= i: its copy back starts after i) and r (recomputed and away at some op >= i:
its replay runs after i).

Rows, at every check op i: the load without what is away fits the budget; at every cut op i (a
subset of the check ops): the copies out done by i and started after op v fit between v and i on
the device-to-host lane, for every release op v; the copies back started after i and landed by
op v fit between them on the host-to-device lane, for every due op v; the replays after i fit
between i and the step's end. Each lane's sum is a running column over the release (or due)
ops, so that a cut row has three terms.
"""

from __future__ import annotations

import numpy as np

from .columns import MIB, Columns
from .absences import Absence


class BoundLP:
    """The LP over `units` with memory rows at `check_ops` and lane rows at `cut_ops`."""

    def __init__(self, durations_ms: np.ndarray, excess_bytes: np.ndarray, check_ops: np.ndarray,
                 cut_ops: np.ndarray, units: list[Absence]):
        self.c, self.units = Columns(), units
        self.start = np.concatenate([[0.0], np.cumsum(durations_ms)])  # op start times without a plan
        self.durations = durations_ms
        times = set(check_ops.tolist()) | {u.release for u in units if u.release is not None} | \
            {u.due for u in units if u.due is not None}
        self.times = sorted(times)
        self.delta = dict(zip(self.times, self.c.add(len(self.times)).tolist()))
        self.end = int(self.c.add(1)[0])
        for a, b in zip(self.times, self.times[1:] + [None]):
            self.c.ge([(self.end if b is None else self.delta[b], 1), (self.delta[a], -1)], 0)
        self._unit_columns()
        self._memory(check_ops, excess_bytes)
        for i in cut_ops.tolist():
            self._cuts(i)

    def _unit_columns(self) -> None:
        """x, y and their running maxima z, w, r per unit and op (see the module docstring)."""
        c = self.c
        self.x, self.y, self.z, self.w, self.r = [], [], [], [], []
        for u in self.units:
            n = len(u.ops)
            x = c.add(n, ub=1)
            y = c.add(n, ub=u.recompute_share) if u.recompute_share > 0 else None
            if y is not None:
                for a, b in zip(x, y):
                    c.le([(a, 1), (b, 1)], 1)
            self.x.append(x)
            self.y.append(y)
            self.z.append(None if u.release is None else self._running(x, forward=True))
            self.w.append(None if u.due is None else self._running(x, forward=False))
            self.r.append(None if y is None else self._running(y, forward=False))

    def _running(self, cols: np.ndarray, forward: bool) -> np.ndarray:
        """Columns m_t >= cols[t] and >= m_(t-1) (forward) or m_(t+1) (backward)."""
        c, out = self.c, self.c.add(len(cols), ub=1)
        for t, (m, v) in enumerate(zip(out, cols)):
            c.ge([(m, 1), (v, -1)], 0)
            prev = t - 1 if forward else t + 1
            if 0 <= prev < len(out):
                c.ge([(m, 1), (out[prev], -1)], 0)
        return out

    def _memory(self, check_ops: np.ndarray, excess_bytes: np.ndarray) -> None:
        rows: dict[int, list] = {int(i): [] for i in check_ops}
        for k, u in enumerate(self.units):
            size = u.nbytes / MIB
            for t, i in enumerate(u.ops.tolist()):
                rows[i].append((self.x[k][t], size))
                if self.y[k] is not None:
                    rows[i].append((self.y[k][t], size))
        for i, terms in rows.items():
            self.c.ge(terms, excess_bytes[i] / MIB)

    def _cuts(self, i: int) -> None:
        """The lane and replay rows at cut op i."""
        out, back, replay = {}, {}, {}
        for k, u in enumerate(self.units):
            if u.release is not None and u.ops[0] <= i:
                t = int(np.searchsorted(u.ops, i, side="right")) - 1
                out.setdefault(u.release, []).append((self.z[k][t], u.d2h_ms))
            if u.ops[-1] >= i:
                t = int(np.searchsorted(u.ops, i, side="left"))
                if u.due is not None:
                    back.setdefault(u.due, []).append((self.w[k][t], u.h2d_ms))
                if self.r[k] is not None:
                    replay.setdefault(u.due, []).append((self.r[k][t], u.recompute_ms))
        d_i = self.delta[i]
        for v, total in self._running_sums(out, descending=True):  # copies out in [start of v, start of i]
            self.c.ge([(d_i, 1), (self.delta[v], -1), (total, -1)], -(self.start[i] - self.start[v]))
        for v, total in self._running_sums(back, descending=False):  # copies back in [end of i, start of v]
            self.c.ge([(self.delta[v], 1), (d_i, -1), (total, -1)], -(self.start[v] - self.start[i + 1]))
        for v, total in self._running_sums(replay, descending=False):  # replays after i, before v starts
            self.c.ge([(self.delta[v], 1), (d_i, -1), (total, -1)], 0)

    def _running_sums(self, terms: dict, descending: bool):
        """(op, column) pairs: the column is at least the sum of the terms of every op from there on
        (descending: at or after it; else at or before it)."""
        previous = None
        for v in sorted(terms, reverse=descending):
            col = int(self.c.add(1)[0])
            self.c.ge([(col, 1)] + ([(previous, -1)] if previous is not None else []) +
                      [(z, -coef) for z, coef in terms[v]], 0)
            previous = col
            yield v, col
