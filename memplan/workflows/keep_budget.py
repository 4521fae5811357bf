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
        max_replans: plans it makes again at most.
    """

    budget_bytes: int
    make_plan: Callable[[int], Plan]
    max_replans: int = MAX_REPLANS  # plans it makes again at most
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
        if self.replanned >= self.max_replans:
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


@dataclass(kw_only=True)
class FitOnce(BudgetKeeper):
    """Keeps a compiled step's budget with one plan made again (two compilations at most).

    A plan is made on the trace's view of memory, which a compiled step does not hold as planned:
    the compiler fuses, and saves what it chooses beside the plan's decisions. So after the first
    compiled step the excess of the measured peak over the simulated one is the margin: a step over
    its budget is planned again under the budget less it (where no plan meets that, at the least load
    the planner reaches). One within it is planned again under the
    budget plus the memory the plan left unused (`filling`: the caller compiles that plan only if
    it simulates faster): the larger of what its peak left and what the compiler saved for backward
    less than the plan assumed (`saved_excess`, negative then), since a compiled step's peak may be
    elsewhere (the optimizer's step) and hide how far its activations are under the budget. The second plan stands if its step keeps the budget; if it does not and the first
    one did, `reverted` says to go back to the first (whose compiled graph is cached). One made to fill
    that the caller does not use is `decline`d.
    """

    filling: bool = False  # the plan made again uses memory the first left: worth it only if faster
    reverted: bool = False  # the second plan measured over the budget the first one kept

    def after_step(self, measured_bytes: int, simulated_bytes: int, saved_excess: int = 0) -> Plan | None:
        """As BudgetKeeper.after_step; after the second plan's step, `reverted` may be set.

        Args:
            saved_excess: what the compiled step saves for backward beyond what the plan assumed.
        """
        self.history.append({"measured_bytes": measured_bytes, "simulated_bytes": simulated_bytes,
                             "margin_bytes": self.margin_bytes})
        if self.settled:
            return None
        within = measured_bytes <= self.budget_bytes
        self.settled = True
        if self.replanned:
            self.reverted = not within and self.filling
            return None
        margin = measured_bytes - simulated_bytes
        if within:
            margin = min(margin, saved_excess)
            if margin >= 0:
                return None
        try:
            plan = self.make_plan(self.budget_bytes - margin)
        except InfeasibleBudgetError as exc:
            if within:
                return None
            plan = self._least(exc)  # no plan meets the margin: the least load the planner reaches comes closest
            if plan is None:
                return self._give_up(str(exc))
        log.info("a compiled step measured %s against a budget of %s: planned again with a margin of %s",
                 format_bytes(measured_bytes), format_bytes(self.budget_bytes), format_bytes(margin))
        self.settled, self.filling = False, within
        self.margin_bytes, self.replanned = margin, 1
        return plan

    def _least(self, exc: InfeasibleBudgetError) -> Plan | None:
        """The plan of the least load the planner names (its own refusal of that load: None)."""
        try:
            return least_load_plan(self.make_plan, exc, tries=1)
        except InfeasibleBudgetError:
            return None

    def decline(self) -> None:
        """The plan made again to fill the budget is not used (it would not be faster): settled as is."""
        self.settled, self.filling, self.replanned, self.margin_bytes = True, False, 0, 0


def least_load_plan(make_plan: Callable[[int], Plan], refusal: InfeasibleBudgetError, tries: int) -> Plan:
    """The plan of the least load the planner named in `refusal`, made by `make_plan(load)`; a refusal
    of that load naming a larger one is followed (a search may name a load it then misses), `tries`
    loads at most.

    Raises:
        InfeasibleBudgetError: the last load's refusal, or one that names no larger load.
    """
    for _ in range(tries - 1):
        load = refusal.min_feasible_bytes
        try:
            return make_plan(load)
        except InfeasibleBudgetError as exc:
            if exc.min_feasible_bytes <= load:
                raise
            refusal = exc
    return make_plan(refusal.min_feasible_bytes)
