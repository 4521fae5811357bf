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
from ..model import Plan, Trace, expect_trace
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

    The budget bounds device memory: the memory load under the plan and, when the plan
    lays out a pool, the pool's size (a plan whose pool exceeds the budget is infeasible).

    Args:
        trace: the traced iteration.
        budget: bytes, a size string ("8GiB"), a share of the unconstrained peak ("60%",
            or a float in (0, 1]); None means no limit (the plan records none).
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
        MemplanError: a bad budget or parameter value, or `trace` is not a Trace.
        InfeasibleBudgetError: no plan of this planner fits; names the smallest feasible load.
    """
    expect_trace(trace, "plan")
    spec = get_planner(planner)
    budget_bytes = resolve_budget(trace, budget)
    cost = cost or Cost.for_trace(trace, device)
    _check_params(spec, params)
    started = time.perf_counter()
    result = spec.fn(trace, budget_bytes, cost, seed=seed, **spec.defaults, **params)
    elapsed = time.perf_counter() - started
    recorded = None if budget is None else budget_bytes
    if recorded is not None and result.pool_bytes is not None and result.pool_bytes > recorded:
        raise pool_over_budget(recorded, result.pool_bytes, planner)
    result = result.with_meta(planner=planner, params=dict(params), seed=seed, budget_bytes=recorded,
                              trace_digest=trace.digest, planning_s=elapsed)
    if simulate_result:
        from ..sim.simulate import simulate

        result = result.with_meta(predicted=simulate(trace, result, cost=cost).summary())
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


def pool_over_budget(budget_bytes: int, pool_bytes: int, planner: str) -> InfeasibleBudgetError:
    """The error for a plan whose pool does not fit the budget (the pool is device memory too)."""
    return InfeasibleBudgetError(
        f"budget {format_bytes(budget_bytes)} is infeasible for planner {planner!r}: the pool it laid out needs "
        f"{format_bytes(pool_bytes)}; the smallest feasible load it found is {format_bytes(pool_bytes)} "
        f"({pool_bytes} bytes)", budget_bytes=budget_bytes, min_feasible_bytes=pool_bytes)


def _check_params(spec: PlannerSpec, params: dict) -> None:
    """Unknown names, and values of the wrong type or sign, fail in one line before planning."""
    signature = inspect.signature(spec.fn)
    if any(p.kind == p.VAR_KEYWORD for p in signature.parameters.values()):
        return
    accepted = set(signature.parameters) - {"trace", "budget_bytes", "cost", "seed"} - set(spec.defaults)
    for name, value in params.items():
        if name not in accepted:
            raise MemplanError(f"planner {spec.name!r} has no parameter {name!r}; "
                               f"it takes: {', '.join(sorted(accepted)) or 'none'}")
        _check_value(spec.name, name, value, signature.parameters[name])


_SIMPLE_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}


def _check_value(planner: str, name: str, value, parameter: inspect.Parameter) -> None:
    """Check `value` against the parameter's declared simple type (int, float, bool, str, None)."""
    allowed = _declared_types(parameter)
    if allowed is None:
        return  # a callable or structured parameter: the planner checks it
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    fits = isinstance(value, allowed) and (bool in allowed or not isinstance(value, bool))
    if not fits and not (number and isinstance(value, int) and float in allowed):
        kinds = " or ".join(t.__name__ if t is not type(None) else "None" for t in allowed)
        raise MemplanError(f"planner {planner!r}: parameter {name} must be {kinds}, not {value!r}")
    if number and not (value >= 0):  # also refuses NaN
        raise MemplanError(f"planner {planner!r}: parameter {name} must not be negative, not {value!r}")


def _declared_types(parameter: inspect.Parameter) -> tuple | None:
    """The types a parameter's annotation names, if all are simple; else those of a numeric default."""
    note = parameter.annotation
    if isinstance(note, str):
        names = [part.strip() for part in note.split("|")]
        if all(n in _SIMPLE_TYPES for n in names):
            return tuple(_SIMPLE_TYPES[n] for n in names)
        return None
    default = parameter.default
    if note is inspect.Parameter.empty and isinstance(default, (bool, int, float)):
        return (type(default),)
    return None
