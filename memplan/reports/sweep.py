"""Run planners over a range of budgets: the overhead-against-memory curves of paper 000
(Fig. 9 against the load limit, Fig. 11 against the footprint).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, replace

from .. import Cost, Plan, Trace, simulate, validate
from ..services import get_planner, load_min_bytes, plan_problem
from ..budget import Budget, limited, parse_budget
from ..errors import InfeasibleBudgetError, MemplanError
from ..plots import save_figure, subplots
from ..problem import DEFAULT_PROFILE, Problem
from ..progress import progress_bar
from ..units import format_bytes

log = logging.getLogger(__name__)

PERCENT = 100.0
# The reference planners: in a sweep, each keeps its plan of a tighter budget where that one is faster,
# so that their overhead never rises with the budget (for the same time limit).
KEEPS_TIGHTER = ("milp", "auto")


@dataclass(frozen=True, kw_only=True)
class SweepPoint:
    """One planner at one budget."""

    planner: str  # registry name
    budget_bytes: int  # the memory load limit asked for
    peak_load_bytes: int | None  # simulated peak load (None when infeasible)
    footprint_bytes: int | None  # pool size when the plan lays out a pool, else None
    overhead: float | None  # simulated time / baseline - 1 (None when infeasible)
    planning_s: float  # wall-clock seconds the planner took (with the check against a tighter budget's plan)
    error: str | None = None  # why there is no plan (e.g. below load_min)


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """All points of a sweep, and the trace's load_min."""

    load_min_bytes: int  # lowest load reachable by swapping every AutoSwap candidate once
    peak_load_bytes: int  # the unconstrained peak (the 100% budget)
    points: tuple[SweepPoint, ...]  # in planner order, then budget order

    def to_json(self) -> dict:
        """The JSON object `memplan sweep --json` prints."""
        return {"load_min_bytes": self.load_min_bytes, "peak_load_bytes": self.peak_load_bytes,
                "points": [asdict(p) for p in self.points]}


def sweep(trace: Trace, planners: list[str], budgets: list[Budget | str | int | float],
          profile: str = DEFAULT_PROFILE, *, seed: int = 0, params: dict | None = None,
          progress: bool = False) -> SweepResult:
    """Plan and simulate every planner at every budget.

    Args:
        trace: the iteration.
        planners: registered planner names.
        budgets: caps as `memplan.plan` takes them (a `Budget`, bytes, "60%", ...).
        profile: the cost model's device profile.
        seed: seed for every planner.
        params: per planner name, extra keyword parameters.
        progress: show a progress bar on stderr.
    Returns:
        The points; an infeasible budget gives a point with overhead None and the reason.
    """
    for name in planners:
        get_planner(name)  # fail on an unknown name before any work
    problem = Problem.of(trace, profile=profile, seed=seed)
    caps = [parse_budget(b).bytes_for(trace.peak_load_bytes) for b in budgets]
    if not all(limited(cap) for cap in caps):
        raise MemplanError("each budget of a sweep is a cap (bytes or a share of the peak), not 'none'")
    points = {}
    with progress_bar("sweep", total=len(planners) * len(caps), unit=" plans", enabled=progress) as bar:
        for name in planners:
            tighter = None  # the plan at the tighter budget before (its planner keeps it where it is faster)
            for b in sorted(set(caps)):
                bar.set_postfix_str(f"{name} at {format_bytes(b)}")
                points[name, b], made = _point(problem.at(b), name, (params or {}).get(name, {}),
                                               tighter if name in KEEPS_TIGHTER else None)
                tighter = made or tighter
                bar.update(caps.count(b))
    return SweepResult(load_min_bytes=load_min_bytes(trace), peak_load_bytes=trace.peak_load_bytes,
                       points=tuple(points[name, b] for name in planners for b in caps))


def _point(problem: Problem, planner: str, params: dict, tighter: Plan | None = None) -> tuple[SweepPoint, Plan | None]:
    """The planner's point at the problem's cap and its plan; with `tighter` (the plan at a tighter
    budget), that plan instead where it simulates faster at this cap and validates there."""
    trace, budget, cost = problem.trace, problem.budget_bytes, problem.cost
    started = time.perf_counter()
    error = None
    try:
        result = plan_problem(problem, planner, simulate_result=False, **params)
    except InfeasibleBudgetError as exc:
        result, error = None, str(exc)
    if tighter is not None:
        result = _faster(trace, cost, budget, result, tighter)
    if result is None:
        return SweepPoint(planner=planner, budget_bytes=budget, peak_load_bytes=None, footprint_bytes=None,
                          overhead=None, planning_s=time.perf_counter() - started, error=error), None
    sim = simulate(trace, result, cost=cost, budget=budget)
    log.info("%s at %d bytes: overhead %s", planner, budget, sim.overhead)
    return SweepPoint(planner=planner, budget_bytes=budget,
                      peak_load_bytes=int(sim.peak_load_bytes) if sim.feasible else None,
                      footprint_bytes=result.pool_bytes, overhead=float(sim.overhead) if sim.feasible else None,
                      planning_s=time.perf_counter() - started,
                      error=None if sim.feasible else f"infeasible in simulation at op {sim.infeasible_op}"), result


def _faster(trace: Trace, cost: Cost, budget: int, made: Plan | None, tighter: Plan) -> Plan | None:
    """`made` (None: the planner found nothing here), or the tighter budget's plan (given this budget)
    when it is valid here and simulates faster within it."""
    kept = replace(tighter, budget_bytes=budget)
    other = simulate(trace, kept, cost=cost, budget=budget)
    if not other.feasible or other.peak_load_bytes > budget or validate(trace, kept, budget):
        return made
    if made is None or other.time_s < simulate(trace, made, cost=cost, budget=budget).time_s:
        return kept.with_meta(report={**(tighter.report or {}), "kept_from_budget_bytes": tighter.budget_bytes})
    return made


def plot_pareto(result: SweepResult, path: str | os.PathLike, title: str = "") -> None:
    """Overhead (%) against memory, one line per planner (paper 000 Fig. 9 / Fig. 11 style).

    The left panel puts the peak load on the x-axis; when any plan lays out a pool, a
    right panel puts the footprint (pool size) there.
    """
    with_pool = any(p.footprint_bytes for p in result.points)
    fig, axes = subplots(1, 2 if with_pool else 1, figsize=(12 if with_pool else 7, 4.5), squeeze=False)
    _panel(axes[0][0], result, "peak_load_bytes", "peak memory load (MiB)")
    axes[0][0].axvline(result.load_min_bytes / 2**20, color="grey", ls=":", lw=1, label="load_min")
    axes[0][0].legend(fontsize=7)
    if with_pool:
        _panel(axes[0][1], result, "footprint_bytes", "footprint: pool size (MiB)")
    fig.suptitle(title or "overhead against memory")
    save_figure(fig, path)


def _panel(ax, result: SweepResult, field: str, xlabel: str) -> None:
    for name in dict.fromkeys(p.planner for p in result.points):
        pts = sorted((getattr(p, field), p.overhead) for p in result.points
                     if p.planner == name and p.overhead is not None and getattr(p, field))
        if pts:
            ax.plot([x / 2**20 for x, _ in pts], [y * PERCENT for _, y in pts], marker="o", ms=3, lw=1, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("overhead (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
