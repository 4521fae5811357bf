"""A MILP for scipy.optimize.milp (HiGHS): its columns and sparse rows, and the built model
with where its variables are, solved whole, with some choices fixed, or relaxed."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from ...model import Decision
from ..kit.linear import Columns
from ..kit.prefetch import in_issue_order
from .layers import LayerProblem


@dataclass
class Model:
    """A built MILP and where its variables are."""

    problem: LayerProblem  # what it was built from
    cols: Columns  # columns and rows
    objective: np.ndarray = None  # cost per column
    s: np.ndarray = None  # swap, per unit
    r: np.ndarray = None  # recompute, per unit
    triggers: dict = field(default_factory=dict)  # unit -> [(position, v column)]
    members: dict = field(default_factory=dict)  # group -> its units (LayerProblem.groups)
    _matrix: object = None  # the constraint matrix, assembled at the first solve

    def solve(self, time_limit_s: float, mip_rel_gap: float, fixed: dict | None = None, relax: bool = False):
        """scipy.optimize.milp's result (HiGHS) within `time_limit_s`.

        Args:
            time_limit_s: wall-clock limit.
            mip_rel_gap: relative gap at which HiGHS stops.
            fixed: group -> (unit, action) or None (kept): those groups' choices are fixed.
            relax: solve the LP relaxation (its optimum bounds the MILP's from below).
        """
        c = self.cols
        lb, ub = np.array(c.lb), np.array(c.ub)
        for group, choice in (fixed or {}).items():
            for k in self.members[group]:
                ub[self.s[k]] = lb[self.s[k]] = float(choice == (k, "swap"))
            ub[self.r[group]] = lb[self.r[group]] = float(choice == (group, "recompute"))
        if self._matrix is None:
            self._matrix = c.matrix()
        integrality = np.zeros(len(lb)) if relax else np.array(c.integer)
        return milp(self.objective, integrality=integrality, bounds=Bounds(lb, np.maximum(lb, ub)),
                    constraints=LinearConstraint(self._matrix, c.row_lb, c.row_ub),
                    options={"time_limit": max(time_limit_s, 1e-3), "mip_rel_gap": mip_rel_gap, "disp": False})

    def choices(self, x: np.ndarray) -> dict:
        """group -> (unit, action) or None, in a solution."""
        out = {group: None for group in self.members}
        for k in range(len(self.problem.units)):
            if x[self.s[k]] > 0.5:
                out[self.problem.units[k].group] = (k, "swap")
            elif x[self.r[k]] > 0.5:
                out[k] = (k, "recompute")
        return out

    def decisions(self, x: np.ndarray) -> tuple[Decision, ...]:
        """The plan's decisions in a solution, in order of first backward access (the prefetch order)."""
        out = []
        for k, u in enumerate(self.problem.units):
            if x[self.s[k]] > 0.5:
                issued = next(q for q, col in self.triggers[k] if x[col] > 0.5)
                out.append(Decision(storage=u.storage, action="swap", out_after=u.out_after,
                                    back_before=u.back_before, trigger=int(self.problem.positions[issued])))
            elif x[self.r[k]] > 0.5:
                out.append(Decision(storage=u.storage, action="recompute", out_after=u.out_after,
                                    back_before=u.back_before))
        return in_issue_order(out)
