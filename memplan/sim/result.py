"""What a simulation returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..budget import NO_LIMIT, BudgetSource, bytes_to_json

BREAKDOWN_KEYS = ("compute_s", "memory_stall_s", "prefetch_stall_s", "recompute_s", "sync_stall_s", "overlap_s",
                  "host_s")


@dataclass(frozen=True, kw_only=True, eq=False)
class SimResult:
    """The simulated iteration under a plan and budget.

    `breakdown` holds, in seconds: compute_s (op time, recomputation excluded),
    memory_stall_s (compute waiting for memory under the budget), prefetch_stall_s (an op
    waiting for its prefetch to land), recompute_s (re-run producer chains plus compression
    kernels), sync_stall_s (compute waiting for synchronous swap-outs), overlap_s (copy
    time hidden behind compute).
    """

    feasible: bool  # False when some allocation can never fit under the budget
    time_s: float  # simulated iteration time (inf when infeasible)
    baseline_time_s: float  # the same trace with no plan and no budget
    peak_load_bytes: int  # largest memory load reached (resident plus in-flight copies)
    breakdown: dict  # see the class docstring
    host_peak_bytes: int = 0  # largest pinned host memory in use at once
    link_bytes: int = 0  # bytes moved over the host link, both directions
    infeasible_op: int | None = None  # the op whose allocation could not fit
    shortfall_bytes: int = 0  # by how much it did not fit
    timeline_t: np.ndarray | None = None  # event times (s) of the load timeline, when asked for
    timeline_load: np.ndarray | None = None  # load (bytes) from each event time on
    op_start_s: np.ndarray | None = None  # start time of each op, when a timeline was asked for
    lanes: dict = field(default_factory=dict)  # per lane ("compute", "d2h", "h2d") a list of (start, end)
    budget_bytes: int = NO_LIMIT  # the cap it was simulated under
    budget_source: BudgetSource = BudgetSource.NONE  # where that cap came from
    level: str = "plain"  # how the executor runs the plan: plain, hooked or interpreted (memplan.sim.lowering)
    dropped: int = 0  # hooked: decisions left out (kept resident), none of the executor's hooks can run them
    level_reason: str = ""  # why the level, or why decisions were dropped

    @property
    def overhead(self) -> float:
        """time / baseline - 1 (inf when infeasible)."""
        if not self.feasible or self.baseline_time_s <= 0:
            return float("inf") if not self.feasible else 0.0
        return self.time_s / self.baseline_time_s - 1.0

    def summary(self) -> dict:
        """JSON-ready numbers (no timeline arrays)."""
        return {
            "feasible": self.feasible,
            "time_s": self.time_s if self.feasible else None,
            "baseline_time_s": self.baseline_time_s,
            "overhead": self.overhead if self.feasible else None,
            "peak_load_bytes": int(self.peak_load_bytes),
            "breakdown": {k: float(self.breakdown.get(k, 0.0)) for k in BREAKDOWN_KEYS},
            "host_peak_bytes": int(self.host_peak_bytes),
            "link_bytes": int(self.link_bytes),
            "infeasible_op": self.infeasible_op,
            "shortfall_bytes": int(self.shortfall_bytes),
            "budget_bytes": bytes_to_json(self.budget_bytes),
            "budget_source": str(self.budget_source),
            "level": self.level,
            "dropped": self.dropped,
            "level_reason": self.level_reason,
        }
