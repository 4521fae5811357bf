"""Keep a plan's budget in real training: measure a step, and plan again with a margin if it is over.

A trace sees what the dispatcher sees. On a GPU the allocator's counters see more (what
memplan.cost.device_memory cannot model: an op's inner memory its isolated measurement
missed, a library's buffer, the allocator's slack). The first planned steps are metered;
when one measures more than the budget (on a GPU: allocated bytes, or reserved bytes beyond the
budget + 5%, memplan.workflows.optimize.judged_bytes), the excess over its simulated peak becomes a margin:
the planner plans again at the budget less the margin, before the next step. At most
MAX_REPLANS times; a margin the planner cannot meet leaves the last plan in place, with a
warning and the planner's error in `error`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InfeasibleBudgetError
from ..model import Plan
from ..units import format_bytes

log = logging.getLogger(__name__)

MAX_REPLANS = 2  # plans made again after the first one


@dataclass(kw_only=True)
class BudgetKeeper:
    """Watches measured steps against `budget_bytes` and says when to plan again.

    Args:
        budget_bytes: the budget the run must keep.
        make_plan: plans at a given budget in bytes (the same planner, seed and parameters).
    """

    budget_bytes: int
    make_plan: Callable[[int], Plan]
    margin_bytes: int = 0  # bytes the plan leaves free for what its trace does not see
    replanned: int = 0  # plans made again
    settled: bool = False  # a step kept the budget, or no more plans will be made
    error: str | None = None  # why the budget could not be kept by planning again
    history: list = field(default_factory=list)  # per measured step: measured, simulated, margin

    def after_step(self, measured_bytes: int, simulated_bytes: int) -> Plan | None:
        """A step measured `measured_bytes` under a plan simulated at `simulated_bytes`:
        the plan to run from now on, or None to keep the current one."""
        self.history.append({"measured_bytes": measured_bytes, "simulated_bytes": simulated_bytes,
                             "margin_bytes": self.margin_bytes})
        if self.settled or measured_bytes <= self.budget_bytes:
            self.settled = True
            return None
        if self.replanned >= MAX_REPLANS:
            return self._give_up(f"still {format_bytes(measured_bytes - self.budget_bytes)} over after "
                                 f"{self.replanned} plans")
        margin = max(self.margin_bytes, measured_bytes - simulated_bytes)
        if margin <= self.margin_bytes:  # the excess did not grow: only the plan's own slack is left
            margin = self.margin_bytes + measured_bytes - self.budget_bytes
        try:
            plan = self.make_plan(self.budget_bytes - margin)
        except InfeasibleBudgetError as exc:
            return self._give_up(str(exc))
        log.info("step measured %s over a budget of %s: planned again with a margin of %s",
                 format_bytes(measured_bytes - self.budget_bytes), format_bytes(self.budget_bytes),
                 format_bytes(margin))
        self.margin_bytes = margin
        self.replanned += 1
        return plan

    def _give_up(self, why: str) -> None:
        self.settled = True
        self.error = why
        log.warning("the run measures more than its budget of %s and planning again cannot fix it: %s",
                    format_bytes(self.budget_bytes), why)
        return None

    def report(self) -> dict:
        """JSON-ready: margin_bytes, replanned, error, history."""
        return {"margin_bytes": self.margin_bytes, "replanned": self.replanned, "replan_error": self.error,
                "budget_history": list(self.history)}
