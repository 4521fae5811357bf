"""Columns and sparse rows of a linear program for scipy (HiGHS): the MILP of `milp` and the LP of
the lower bound (`memplan.planners.bound`) are assembled with them."""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

INF = np.inf
MS = 1e3  # model time unit: milliseconds per second
MIB = 2.0**20  # model memory unit: bytes per MiB


class Columns:
    """Columns and sparse rows of a MILP, assembled for scipy.optimize.milp."""

    def __init__(self):
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[int] = []
        self.rows: list[list[tuple[int, float]]] = []
        self.row_lb: list[float] = []
        self.row_ub: list[float] = []

    def add(self, n: int = 1, ub: float | np.ndarray = INF, integer: bool = False) -> np.ndarray:
        """`n` new columns with bounds [0, ub] (ub: one for all, or one each); returns their indices."""
        first = len(self.lb)
        self.lb += [0.0] * n
        self.ub += np.broadcast_to(np.asarray(ub, dtype=np.float64), (n,)).tolist()
        self.integer += [int(integer)] * n
        return np.arange(first, first + n)

    def ge(self, terms, rhs: float) -> None:
        """sum(coef * x[col]) >= rhs."""
        self._row(terms, rhs, INF)

    def le(self, terms, rhs: float) -> None:
        """sum(coef * x[col]) <= rhs."""
        self._row(terms, -INF, rhs)

    def eq(self, terms, rhs: float) -> None:
        """sum(coef * x[col]) == rhs."""
        self._row(terms, rhs, rhs)

    def _row(self, terms, lb: float, ub: float) -> None:
        self.rows.append([(int(c), float(v)) for c, v in terms])
        self.row_lb.append(lb)
        self.row_ub.append(ub)

    def matrix(self) -> csr_matrix:
        """The constraint matrix (duplicate entries of a row are summed)."""
        data = [(i, c, v) for i, row in enumerate(self.rows) for c, v in row]
        i, c, v = (np.array(a) for a in zip(*data)) if data else (np.zeros(0),) * 3
        return csr_matrix((v, (i, c)), shape=(len(self.rows), len(self.lb)))
