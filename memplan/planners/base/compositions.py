"""Planner compositions `X+Y`: Y decides micro-batches (`compose`) or lays out the pool (`compose_pool`)."""

from __future__ import annotations

from typing import Callable

from ...errors import InfeasibleBudgetError, MemplanError
from ...model import Plan, Trace
from ...pool import with_pool
from ...problem import Problem
from ...sim.convview import conv_view
from ...budget import NO_LIMIT, limited
from ...units import format_bytes
from .spec import Param, PlannerSpec

POOL_TRIES = 6  # X+pool: plans of X under shrinking loads until its pool fits the budget
MIN_CUT = 0.005  # the least share a load shrinks by between two of those plans
LOAD_MARGINS = (0.0, 0.02, 0.1)  # above a lower bound, the loads tried for one where X+pool fits


def compose(base: PlannerSpec, conv: PlannerSpec) -> PlannerSpec:
    """`base+conv`: the conv planner decides every convolution first, called with
    `composed=True` (a planner deciding micro-batches registers `composed=False` as a fixed
    argument): then it gives an op workspace only within the room the trace leaves it under
    the budget, and raises nothing for a budget below the trace's peak. So the workspaces
    never add to what must be freed, and a budget `base` meets alone it still meets. Then
    `base` plans swaps and recomputes under the budget on the trace as those decisions make
    it (memplan.sim.convview: the chosen conv times, and each op's workspace as a storage
    alive while it runs). Parameters go to the planner that has them.

    Raises:
        MemplanError: `base` decides micro-batches or lays out a pool (its buffers would not
            include the workspaces), or both take a parameter of the same name.
    """
    name = f"{base.name}+{conv.name}"
    if base.decides & {"microbatch", "pool"}:
        raise MemplanError(f"cannot compose {name!r}: {base.name} decides {', '.join(sorted(base.decides))}; "
                           f"compose a convolution planner with a swap or recompute planner")
    clash = {p.name for p in base.params} & {p.name for p in conv.params}
    if clash:
        raise MemplanError(f"cannot compose {name!r}: both planners take {', '.join(sorted(clash))}")
    conv_names = {p.name for p in conv.params}

    def fn(problem: Problem, **params):
        trace, cost = problem.trace, problem.cost
        convs = conv.fn(problem, **{**conv.defaults, "composed": True},
                        **{k: v for k, v in params.items() if k in conv_names})
        view, durations = conv_view(trace, cost.durations, convs.microbatches)
        plan_ = base.fn(problem.on(view, cost.carried(durations)), **base.defaults,
                        **{k: v for k, v in params.items() if k not in conv_names})
        # decisions on the view's workspace storages (not in the trace) would mean nothing
        kept = tuple(d for d in plan_.decisions if d.storage < len(trace.storages))
        return plan_.with_meta(decisions=kept, microbatches=convs.microbatches)

    return PlannerSpec(name=name, fn=fn, defaults={}, summary=f"{base.name} on the trace as {conv.name} makes it",
                       decides=base.decides | conv.decides, params=base.params + conv.params)


def compose_pool(base: PlannerSpec, pool: PlannerSpec) -> PlannerSpec:
    """`base+pool`: base's plan, then pool's layout over its buffers (paper 000 §V: swap, then pool).

    The layout is of the program the executor runs under the budget. A layout needs more than
    the load it lays out where buffers fragment it, and the pool is device memory too, so it
    must fit the budget: when it does not, base plans again under a smaller load (`_fit`).
    When none fits, the error names a load at which the composition does (`_pooled_load`).
    The pool's own parameters are `pool_<name>` (`pool_time_limit_s`).

    Raises:
        MemplanError: `base` lays out a pool or decides micro-batches (their workspaces are
            not buffers of the trace the layout sees).
    """
    name = f"{base.name}+{pool.name}"
    if base.decides & {"microbatch", "pool"}:
        raise MemplanError(f"cannot compose {name!r}: {base.name} decides {', '.join(sorted(base.decides))}; "
                           f"lay a pool out over a swap or recompute planner's plan")
    pool_params = tuple(Param(name=f"pool_{p.name}", type=p.type, default=p.default) for p in pool.params)

    def fn(problem: Problem, **params):
        trace, budget_bytes, cost, seed = problem.trace, problem.budget_bytes, problem.cost, problem.seed
        options = {k.removeprefix("pool_"): v for k, v in params.items() if k.startswith("pool_")}
        mine = {k: v for k, v in params.items() if not k.startswith("pool_")}
        layouts: dict = {}  # (decisions, budget) -> the laid-out plan: a plan that did not change is not laid out again

        def pooled(load: int, budget: int) -> Plan:
            """base's plan at `load`, laid out as the program the executor runs under `budget`
            (the budget decides where compute waits for swap-outs to free memory)."""
            plan_ = base.fn(problem.at(load), **base.defaults, **mine)
            plan_ = plan_.with_meta(budget_bytes=budget)
            key = (plan_.decisions, plan_.budget_bytes)
            if key not in layouts:
                layouts[key] = with_pool(trace, plan_, allocator=pool.defaults.get("allocator", pool.name), seed=seed,
                                         cost=cost, **options)
            return layouts[key]

        return _fitted_pool(trace, budget_bytes, pooled, name)

    return PlannerSpec(name=name, fn=fn, defaults={}, summary=f"{base.name} with the {pool.name} layout over its plan",
                       decides=base.decides | pool.decides, params=base.params + pool_params)


Pooled = Callable[[int, int], Plan]  # pooled(load, budget): base's plan at load, laid out as run under budget


def _fitted_pool(trace: Trace, budget_bytes: int, pooled: Pooled, name: str) -> Plan:
    """The plan of `_fit`, or the infeasible-budget error naming a load where the composition fits."""
    fitted = _fit(trace, budget_bytes, pooled)
    if isinstance(fitted, Plan):
        return fitted
    if isinstance(fitted, InfeasibleBudgetError):  # the budget itself is out of the base planner's reach
        found = _pooled_load(trace, fitted.min_feasible_bytes, pooled)
        raise InfeasibleBudgetError(f"{fitted}; with its pool ({name}), the smallest feasible load it found is "
                                    f"{format_bytes(found)} ({found} bytes)", budget_bytes=budget_bytes,
                                    min_feasible_bytes=found)
    found = _pooled_load(trace, fitted, pooled)
    raise InfeasibleBudgetError(
        f"budget {format_bytes(budget_bytes)} is infeasible for planner {name!r}: the pool it laid out needs "
        f"{format_bytes(fitted)} over its plan; the smallest feasible load it found is "
        f"{format_bytes(found)} ({found} bytes)", budget_bytes=budget_bytes, min_feasible_bytes=found)


def _fit(trace: Trace, budget_bytes: int, pooled: Pooled) -> Plan | InfeasibleBudgetError | int:
    """The composition at `budget_bytes`: the first plan whose pool fits, in at most `POOL_TRIES`
    plans of base. Each overflow cuts the load base plans under by the overflow, or by twice the
    cut before when base's plan did not change (it moved too little to matter); a load out of
    base's reach is bisected with the last one it planned. The plan's report says how many plans
    it took (`pool_tries`) and under which load base planned (`planned_load_bytes`).

    Returns:
        The plan; else the smallest pool laid out, or base's error when it cannot plan at the
        budget itself.
    """
    load = budget_bytes if limited(budget_bytes) else trace.peak_load_bytes  # no limit: nothing need move
    cut, smallest, before = MIN_CUT, None, None
    reached, out_of_reach = load, None  # the last load base planned, the highest it did not
    for tries in range(1, POOL_TRIES + 1):
        try:
            result = pooled(load, budget_bytes)
        except InfeasibleBudgetError as exc:
            if smallest is None:
                return exc
            out_of_reach = load
        else:
            if result.pool_bytes <= budget_bytes:
                return result.with_meta(report={**result.report, "pool_tries": tries, "planned_load_bytes": load})
            smallest, reached = min(smallest or result.pool_bytes, result.pool_bytes), load
            cut = 2 * cut if result.decisions == before else max(MIN_CUT, result.pool_bytes / budget_bytes - 1)
            before = result.decisions
        load = reached - max(1, int(reached * cut))
        if out_of_reach is not None and load <= out_of_reach:
            load = (reached + out_of_reach) // 2
    return smallest


def _pooled_load(trace: Trace, bound: int, pooled: Pooled) -> int:
    """A load at which the composition plans (as `plan` at that budget does, `_fit`): `bound` (a
    lower bound: base's smallest load, or a pool that overflowed) or a margin above it; at last
    the layout of base's plan at the peak (where nothing need move), at its own footprint."""
    for margin in LOAD_MARGINS:
        load = int(bound * (1 + margin))
        if isinstance(_fit(trace, load, pooled), Plan):
            return load
    try:
        unmoved = pooled(trace.peak_load_bytes, NO_LIMIT).pool_bytes  # what it moves at the peak (mostly nothing)
    except InfeasibleBudgetError as exc:  # a planner that moves storages whatever the budget (sqrt-n)
        unmoved = pooled(exc.min_feasible_bytes, NO_LIMIT).pool_bytes
    return max(trace.peak_load_bytes, unmoved)
