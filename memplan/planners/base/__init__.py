"""The planner registry and `memplan.plan`.

A planner is a plain function `fn(problem, **params) -> Plan` (memplan.problem: the trace,
its cap in bytes, its costs and the seed) registered under one or more names (`family` or
`family:variant`), declaring what it decides (`DECIDES`). Its parameters are its keyword
arguments: their annotations and defaults are the typed parameter schema that checks and
converts what a user passes.
Every module of this package is a family, found by the registry (memplan.registry: a
new family is one module plus its test). `plan()` makes the Problem from what a user gives;
`plan_problem()` checks the parameters, times the planner, fills the plan's metadata and
attaches the simulator's prediction.
A name `X+Y`, where Y decides only micro-batches (a convolution planner such as
`ucudnn:wd`), composes any swap/recompute planner X with it; where Y decides
only the pool (`smartpool`...), Y lays the pool out over X's plan (memplan.planners.base.compositions).
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import Callable

from ...budget import UNLIMITED, Budget
from ...cost.model import Cost
from ...cost.profiles import DeviceProfile, profile_to_json
from ...errors import InfeasibleBudgetError, MemplanError, NeedsOpsError, unknown_name
from ...model import Plan, Trace, expect_trace
from ...problem import DEFAULT_PROFILE, Problem
from ...registry import Registry
from ...sim.stage import simulate
from ...units import ByteSize, format_bytes, parse_bytes
from .compositions import compose, compose_pool
from .hooks_fit import fit_hooked
from .spec import DECIDES, Param, PlannerFn, PlannerSpec

log = logging.getLogger(__name__)

_COMMON = ("problem",)  # the argument every planner takes


PLANNERS: Registry[PlannerSpec] = Registry("planner", "memplan.planners")


def register(name: str, summary: str = "", *, decides=(), simulated: bool = False,
             **defaults) -> Callable[[PlannerFn], PlannerFn]:
    """Decorator: register `fn` under `name`, passing `defaults` as keyword arguments.

    Args:
        name: "family" or "family:variant".
        summary: one line (default: the docstring's first line).
        decides: what the planner decides, a subset of DECIDES.
        simulated: it keeps the plan the simulator runs fastest, at its level (PlannerSpec.simulated).
        **defaults: fixed keyword arguments for this name.
    """
    unknown = set(decides) - set(DECIDES)
    if unknown:
        raise ValueError(f"planner {name!r}: cannot decide {sorted(unknown)}; known: {DECIDES}")

    def wrap(fn: PlannerFn) -> PlannerFn:
        doc = summary or (inspect.getdoc(fn) or "").split("\n")[0]
        PLANNERS.add(name, PlannerSpec(name=name, fn=fn, defaults=defaults, summary=doc, decides=frozenset(decides),
                                       params=_params_of(fn, defaults), simulated=simulated))
        return fn

    return wrap


def _params_of(fn: PlannerFn, fixed: dict) -> tuple[Param, ...]:
    hints = inspect.get_annotations(fn, eval_str=True)
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in _COMMON or p.name in fixed or p.kind == p.VAR_KEYWORD:
            continue
        out.append(Param(name=p.name, type=_scalar(hints.get(p.name, object)), default=p.default))
    return tuple(out)


def _scalar(hint) -> type:
    """int, float, bool, str or ByteSize for a hint of one of them (or `X | None`); object for anything else."""
    args = [a for a in getattr(hint, "__args__", (hint,)) if a is not type(None)]
    return args[0] if len(args) == 1 and args[0] in (int, float, bool, str, ByteSize) else object


def known_planners(decides: str | None = None) -> dict[str, PlannerSpec]:
    """All registered planners by name; with `decides`, those that decide that (e.g. "swap")."""
    return {name: spec for name, spec in PLANNERS.entries().items() if decides is None or decides in spec.decides}


def get_planner(name: str) -> PlannerSpec:
    """The planner registered as `name`, or the composition `X+Y` of a registered planner X
    with a registered convolution planner Y (one that decides only micro-batches) or pool
    planner Y (one that decides only the pool).

    Raises:
        UnknownNameError: listing the known names.
        MemplanError: a composition of planners that cannot be composed.
    """
    planners = known_planners()
    if name in planners:
        return planners[name]
    base, sep, other = name.rpartition("+")
    second = planners.get(other) if sep and base in planners else None
    if second is not None and second.decides == {"microbatch"}:
        return compose(planners[base], second)
    if second is not None and second.decides == {"pool"}:
        return compose_pool(planners[base], second)
    raise unknown_name("planner", name, planners)


def plan(trace: Trace | Problem, budget: Budget | str | int | float | None = UNLIMITED, planner: str = "none",
         profile: str | DeviceProfile = DEFAULT_PROFILE, seed: int = 0, cost: Cost | None = None,
         simulate_result: bool = True, **params) -> Plan:
    """Plan where every storage of `trace` lives under a memory `budget` (or plan a Problem already made).

    The budget bounds device memory: the memory load under the plan and, when the plan
    lays out a pool, the pool's size (a plan whose pool exceeds the budget is infeasible).

    Args:
        trace: the traced iteration; or a `memplan.Problem`, which brings its own budget, costs and
            seed (then leave those arguments out).
        budget: bytes, a size string ("8GiB"), a share of the unconstrained peak ("60%",
            or a float in (0, 1]), a `memplan.budget.Budget`; "none" (UNLIMITED) means no limit
            (the plan records none).
        planner: a registered planner name (see `known_planners()`).
        profile: the cost model's device profile, a name or a profile file.
        seed: random seed for search planners.
        cost: a precomputed Cost for this trace (overrides `profile`).
        simulate_result: attach the simulator's prediction in `plan.predicted`.
        **params: the planner's hyper-parameters.
    Returns:
        The Plan, with metadata filled in.
    Raises:
        UnknownNameError: unknown planner or parameter.
        MemplanError: a bad budget or parameter value, or `trace` is not a Trace.
        InfeasibleBudgetError: no plan of this planner fits; names the smallest feasible load.
        NeedsOpsError: the planner decides swaps, recomputes or micro-batches and the trace
            has no ops (a pool problem: plan it with a planner that decides only the pool).
    """
    if isinstance(trace, Problem):
        if budget not in (UNLIMITED, None) or profile != DEFAULT_PROFILE or seed != 0 or cost is not None:
            raise MemplanError("a Problem brings its own budget, costs and seed: give budget, profile, seed or "
                               "cost with a trace only")
        return plan_problem(trace, planner, simulate_result, **params)
    expect_trace(trace, "plan")
    return plan_problem(Problem.of(trace, budget, profile, seed=seed, cost=cost), planner, simulate_result,
                        **params)


def plan_problem(problem: Problem, planner: str = "none", simulate_result: bool = True, **params) -> Plan:
    """`plan` of a Problem already made (the library's own callers: they hold one).

    Raises:
        UnknownNameError: unknown planner or parameter.
        MemplanError: a bad parameter value.
        InfeasibleBudgetError: no plan of this planner fits; names the smallest feasible load.
        NeedsOpsError: the planner decides about ops and the trace has none.
    """
    spec = get_planner(planner)
    trace, budget_bytes = problem.trace, problem.budget_bytes
    if spec.needs_ops and not trace.ops:
        raise refuse_without_ops(spec)
    params = check_params(spec, params)
    started = time.perf_counter()
    result = planned_at(spec, problem, params)
    elapsed = time.perf_counter() - started
    if result.pool_bytes is not None and result.pool_bytes > budget_bytes:
        raise pool_over_budget(budget_bytes, result.pool_bytes, planner)
    result = result.with_meta(planner=planner, params=dict(params), seed=problem.seed, budget_bytes=budget_bytes,
                              profile=profile_to_json(problem.profile), trace_digest=trace.digest, planning_s=elapsed)
    if simulate_result:  # the level it runs at is fixed here, once (memplan.sim.simulate)
        predicted = simulate(problem, result)
        result = result.with_meta(predicted=predicted.summary(), level=predicted.level)
    return result


def searched_to_its_limit(spec: PlannerSpec, params: dict, seconds: float) -> bool:
    """Whether the planner took half its time limit or more: such a search is not planned again for
    its hooked form (memplan.planners.base.hooks_fit), as each try would take as long; the limit is
    the user's."""
    limit = params.get("time_limit_s", next((p.default for p in spec.params if p.name == "time_limit_s"), None))
    return limit is not None and seconds >= 0.5 * float(limit)


def planned_at(spec: PlannerSpec, problem: Problem, params: dict) -> Plan:
    """`spec`'s plan of `problem`, planned again under a smaller load where its hooked form misses
    the cap (memplan.planners.base.hooks_fit), unless the planner searched to its time limit or chose
    its plan by the simulator at the level it runs (`PlannerSpec.simulated`)."""
    started = time.perf_counter()
    result = _run_planner(spec, problem.at(planning_bytes(spec, problem)), params, limited=problem.limited)
    if problem.limited and spec.decides & {"swap", "recompute"} and not spec.simulated and \
            not searched_to_its_limit(spec, params, time.perf_counter() - started):
        result = fit_hooked(lambda load: _run_planner(spec, problem.at(load), params, limited=True),
                            problem, result, time.perf_counter() - started)
    return result


def planning_bytes(spec: PlannerSpec, problem: Problem) -> int:
    """The bytes a planner plans under: the cap; without one, the trace's unconstrained peak
    (no limit binds there), or for a planner deciding micro-batches or a pool no limit at all
    (workspaces and a layout's fragmentation may take memory above the trace's own peak)."""
    if problem.limited or spec.decides & {"microbatch", "pool"}:
        return problem.budget_bytes
    return problem.trace.peak_load_bytes


def _run_planner(spec: PlannerSpec, problem: Problem, params: dict, *, limited: bool) -> Plan:
    """`spec`'s plan of `problem`; without a budget (`limited` false), at whatever load it needs.

    Planners take the unconstrained peak for "no budget"; one whose plan needs more there (a
    recomputation's rebuilt inputs beside what is resident) says how much, and it is run
    again at that load, which the infeasible-budget error promises it fits.
    """
    try:
        return spec.fn(problem, **spec.defaults, **params)
    except InfeasibleBudgetError as exc:
        if limited:
            raise
        log.debug("planner %s needs %d bytes without a budget; planning there", spec.name, exc.min_feasible_bytes)
        return spec.fn(problem.at(exc.min_feasible_bytes), **spec.defaults, **params)


def infeasible(budget_bytes: int, min_feasible_bytes: int, planner: str) -> InfeasibleBudgetError:
    """The error a planner raises when `budget_bytes` is below what it can reach."""
    return InfeasibleBudgetError(
        f"budget {format_bytes(budget_bytes)} is infeasible for planner {planner!r}: "
        f"the smallest feasible load is {format_bytes(min_feasible_bytes)} ({min_feasible_bytes} bytes)",
        budget_bytes=budget_bytes, min_feasible_bytes=min_feasible_bytes)


def refuse_without_ops(spec: PlannerSpec) -> NeedsOpsError:
    """The refusal of a trace without ops (a minimalloc CSV) by a planner that decides about ops."""
    pool = ", ".join(name for name, other in known_planners().items() if other.decides == {"pool"})
    return NeedsOpsError(f"planner {spec.name!r} decides {', '.join(sorted(spec.decides))} between ops, and this "
                         f"trace has none (a pool problem, e.g. a minimalloc CSV); plan it with a pool planner "
                         f"({pool}) or lay it out with `memplan pool`")


def pool_over_budget(budget_bytes: int, pool_bytes: int, planner: str) -> InfeasibleBudgetError:
    """The error for a plan whose pool does not fit the budget (the pool is device memory too)."""
    return InfeasibleBudgetError(
        f"budget {format_bytes(budget_bytes)} is infeasible for planner {planner!r}: the pool it laid out needs "
        f"{format_bytes(pool_bytes)}; the smallest feasible load it found is {format_bytes(pool_bytes)} "
        f"({pool_bytes} bytes)", budget_bytes=budget_bytes, min_feasible_bytes=pool_bytes)


def check_params(spec: PlannerSpec, params: dict) -> dict:
    """`params` checked against the planner's schema and converted to its types.

    Raises:
        MemplanError: an unknown name, or a value that is not of the parameter's type.
    """
    schema = {p.name: p for p in spec.params}
    out = {}
    for name, value in params.items():
        if name not in schema:
            raise MemplanError(f"planner {spec.name!r} has no parameter {name!r}; "
                               f"it takes: {', '.join(sorted(schema)) or 'none'}")
        out[name] = _typed(spec.name, schema[name], value)
    return out


def _typed(planner: str, param: Param, value):
    """`value` as the parameter's type (strings from the command line are converted)."""
    if param.type is object or value is None and param.default is None:
        return value
    typed = _converted(param.type, value)
    if typed is None:
        wanted = "a byte size (64MiB, 1e9)" if param.type is ByteSize else param.type.__name__
        raise MemplanError(f"planner {planner!r}: parameter {param.name} must be {wanted}, got {value!r}")
    if param.type in (int, float) and not typed >= 0:  # also refuses NaN
        raise MemplanError(f"planner {planner!r}: parameter {param.name} must not be negative, got {value!r}")
    return typed


def _converted(typ: type, value):
    """`value` as `typ` (an int where a float is wanted, a string from the command line), or None."""
    if typ is ByteSize:
        try:
            return ByteSize(parse_bytes(str(value) if isinstance(value, float) else value))
        except MemplanError:
            return None
    if isinstance(value, typ) and not (typ is not bool and isinstance(value, bool)):
        return value
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and typ is not bool:
        try:
            return typ(value)
        except ValueError:
            return None
    return None
