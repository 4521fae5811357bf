"""The planner registry and `memplan.plan`.

A planner is a plain function `fn(trace, budget_bytes, cost, *, seed, **params) -> Plan`
registered under one or more names (`family` or `family:variant`). It returns the
decisions (and optionally pool offsets or micro-batches); `plan()` times it, fills the
metadata and attaches the simulator's prediction.
"""

from __future__ import annotations

import importlib
import inspect
import time
from dataclasses import dataclass
from typing import Callable

from ..cost.model import Cost
from ..cost.profiles import DeviceProfile
from ..errors import InfeasibleBudgetError, MemplanError, unknown_name
from ..model import Plan, Trace
from ..units import format_bytes, parse_budget

PlannerFn = Callable[..., Plan]

# Modules that register planners when imported; a family's module is listed here once.
PLANNER_MODULES = (
    "memplan.planners.baselines",   # none, save-on-cpu, checkpoint-all, sqrt-n
    "memplan.planners.smartpool",    # smartpool, smartpool-bestfit, smartpool-firstfit
    "memplan.planners.autoswap",    # autoswap:doa/aoa/wdoa/swdoa/bo (+smartpool)
)


@dataclass(frozen=True)
class PlannerSpec:
    """One registered planner name."""

    name: str  # e.g. "autoswap:bo"
    fn: PlannerFn  # the planning function
    defaults: dict  # fixed keyword arguments this name passes (e.g. the variant)
    summary: str  # one line for `memplan planners`


_REGISTRY: dict[str, PlannerSpec] = {}


def register(name: str, summary: str = "", **defaults) -> Callable[[PlannerFn], PlannerFn]:
    """Decorator: register `fn` under `name`, passing `defaults` as keyword arguments."""

    def wrap(fn: PlannerFn) -> PlannerFn:
        doc = summary or (inspect.getdoc(fn) or "").split("\n")[0]
        _REGISTRY[name] = PlannerSpec(name=name, fn=fn, defaults=defaults, summary=doc)
        return fn

    return wrap


def _load_all() -> None:
    for module in PLANNER_MODULES:
        importlib.import_module(module)


def known_planners() -> dict[str, PlannerSpec]:
    """All registered planners by name."""
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def get_planner(name: str) -> PlannerSpec:
    """The planner registered as `name`.

    Raises:
        UnknownNameError: listing the known names.
    """
    planners = known_planners()
    if name not in planners:
        raise unknown_name("planner", name, planners)
    return planners[name]


def plan(trace: Trace, budget: str | int | None = None, planner: str = "none",
         device: str | DeviceProfile = "h100", seed: int = 0, cost: Cost | None = None,
         simulate_result: bool = True, **params) -> Plan:
    """Plan where every storage of `trace` lives under a memory `budget`.

    Args:
        trace: the traced iteration.
        budget: bytes, a size string ("8GiB") or a share of the unconstrained peak ("60%");
            None means no limit.
        planner: a registered planner name (see `known_planners()`).
        device: profile name or file for the cost model.
        seed: random seed for search planners.
        cost: a precomputed Cost for this trace (overrides `device`).
        simulate_result: attach the simulator's prediction in `plan.predicted`.
        **params: the planner's hyper-parameters.
    Returns:
        The Plan, with metadata filled in.
    Raises:
        UnknownNameError: unknown planner or parameter.
        InfeasibleBudgetError: no plan of this planner fits; names the smallest feasible load.
    """
    spec = get_planner(planner)
    budget_bytes = resolve_budget(trace, budget)
    cost = cost or Cost.for_trace(trace, device)
    _check_params(spec, params)
    started = time.perf_counter()
    result = spec.fn(trace, budget_bytes, cost, seed=seed, **spec.defaults, **params)
    elapsed = time.perf_counter() - started
    result = result.with_meta(planner=planner, params=dict(params), seed=seed, budget_bytes=budget_bytes,
                              trace_digest=trace.digest, planning_s=elapsed)
    if simulate_result:
        from ..sim.simulate import simulate

        result = result.with_meta(predicted=simulate(trace, result, cost=cost, budget=budget_bytes).summary())
    return result


def resolve_budget(trace: Trace, budget: str | int | None) -> int:
    """Budget in bytes; None means the unconstrained peak (no limit binds)."""
    if budget is None:
        return trace.peak_load_bytes
    return parse_budget(budget, trace.peak_load_bytes)


def infeasible(budget_bytes: int, min_feasible_bytes: int, planner: str) -> InfeasibleBudgetError:
    """The error a planner raises when `budget_bytes` is below what it can reach."""
    return InfeasibleBudgetError(
        f"budget {format_bytes(budget_bytes)} is infeasible for planner {planner!r}: "
        f"the smallest feasible load is {format_bytes(min_feasible_bytes)} ({min_feasible_bytes} bytes)",
        budget_bytes=budget_bytes, min_feasible_bytes=min_feasible_bytes)


def _check_params(spec: PlannerSpec, params: dict) -> None:
    signature = inspect.signature(spec.fn)
    if any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
        return
    accepted = set(signature.parameters) - {"trace", "budget_bytes", "cost", "seed"} - set(spec.defaults)
    for name in params:
        if name not in accepted:
            raise MemplanError(f"planner {spec.name!r} has no parameter {name!r}; "
                               f"it takes: {', '.join(sorted(accepted)) or 'none'}")
