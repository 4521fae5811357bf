"""Compile a Plan into the step program the executor runs (memplan.model.program).

The program is what the simulator did while simulating the plan under its budget: the
kernel emits every action in order, including the points where a swap-out's memory was
released (lazily once its copy completed, or when an allocation had to wait for it). The
program's predicted result is that simulation, so a plan's reported overhead and peak are
those of the program the executor runs.
"""

from __future__ import annotations


from ..budget import budget_in_force
from ..cost.profiles import DeviceProfile
from ..errors import MemplanError
from ..model import Plan, Trace
from ..model.program import INTERPRETED, Action, ActionKind, Prediction, Rebuild, ReplayStep, StepProgram
from ..problem import Problem
from .simulate import Simulator, simulator_of
from .stage import problem_of


def compile_plan(source: Problem | Trace, plan: Plan, profile: str | DeviceProfile | None = None, *,
                 hooks: bool = True) -> StepProgram:
    """The step program of `plan` (`memplan.compile`): what the executor does at each op, and the
    simulator's prediction of it, on the Problem's costs (or with a trace, on the cost `profile`;
    None: the one the plan was made for).

    Raises:
        MemplanError: the plan is for another trace, or it does not fit its budget.
    """
    return compile_program(problem_of(source, plan, profile, stage="compile"), plan, hooks=hooks)


def compile_program(problem: Problem, plan: Plan, *, hooks: bool = True,
                    simulator: Simulator | None = None) -> StepProgram:
    """The step program of `plan` under its own budget, at the level it runs (memplan.sim.lowering;
    with `hooks` false, interpreted: the dispatch-mode runner, which needs no model), simulated by the
    problem's simulator (or `simulator`, one of the problem's trace and cost).

    Raises:
        MemplanError: the plan is for another trace, or it does not fit its budget.
    """
    trace = problem.trace
    if plan.trace_digest is not None and plan.trace_digest != trace.digest:
        raise MemplanError(f"plan was made for trace {plan.trace_digest}, not this one ({trace.digest})")
    budget_bytes, source = budget_in_force(None, plan.budget_bytes, trace.peak_load_bytes)
    simulator = simulator or simulator_of(problem, hooks)
    result, rows, chains, lowered = simulator.program_rows(plan, budget_bytes)
    decisions = lowered.decisions
    if not result.feasible:
        raise MemplanError(f"the plan does not fit its budget of {budget_bytes} bytes: op {result.infeasible_op} is "
                           f"{result.shortfall_bytes} bytes short")
    actions = tuple(Action(op=int(op), after=bool(after), kind=ActionKind.of_code(int(kind)), decision=int(d))
                    for op, after, kind, d in rows)
    rebuilds = {k: Rebuild(steps=tuple(ReplayStep(storage=s.storage, ops=s.ops, temporary=s.temporary)
                                       for s in chain.steps), frees=chain.frees)
                for k, chain in chains.items()} if lowered.level == INTERPRETED else {}
    start_away = tuple(k for k, d in enumerate(decisions)
                       if d.action == "swap" and d.wraps and d.prefetch_at <= d.back_before)
    predicted = Prediction(**{**result.summary(), "budget_bytes": budget_bytes, "budget_source": str(source)})
    return StepProgram(decisions=decisions, actions=actions, start_away=start_away, rebuilds=rebuilds,
                       microbatches=plan.microbatches, budget_bytes=budget_bytes, trace_digest=trace.digest,
                       predicted=predicted, level=lowered.level, regions=lowered.regions, holds=lowered.holds,
                       whole_step=lowered.whole_step)


_FETCHES = (ActionKind.PREFETCH, ActionKind.RECOMPUTE)  # actions that bring a storage's bytes back
_FREES = (ActionKind.RELEASE, ActionKind.DROP)  # actions that free them


def residencies(trace: Trace, program: StepProgram) -> list[tuple[int, int, int, str]]:
    """Every interval a storage occupies device memory under the program.

    Returns:
        (storage, start, end, how) with [start, end) half-open in ops; `how` says how the
        interval begins and ends: "plain", "offload" (ends with a swap-out's release) or
        "fetched" (begins with a prefetch or a recomputation).
    """
    n = trace.num_steps
    by_storage: dict[int, list] = {}
    for a in program.actions:
        by_storage.setdefault(program.decisions[a.decision].storage, []).append(a)
    carried = program.carried_over  # on the device, still copying, until their release
    away_at_start = {program.decisions[k].storage for k in program.start_away if k not in carried}
    out = []
    for s in trace.storages:
        if s.nbytes <= 0 or s.free_op <= s.alloc_op:
            continue
        actions = by_storage.get(s.id)
        if not actions:
            out.append((s.id, s.alloc_op, s.free_op, "plain"))
            continue
        out += _intervals(s, actions, n, s.id in away_at_start)
    return out


def _intervals(s, actions, n: int, away_at_start: bool) -> list[tuple[int, int, int, str]]:
    """The residency intervals of one storage, walking its actions in program order.

    A prefetch due while its swap-out is still in flight keeps the bytes where they are (the
    executor cancels the swap: see InterpretedRunner._prefetch), so that gap has no interval break.
    """
    out, open_at, how, kept = [], (None if away_at_start else s.alloc_op), "plain", set()
    for a in actions:
        at = a.op + 1 if a.after else a.op
        if a.kind in _FETCHES and open_at is not None:
            kept.add(a.decision)
        elif a.kind in _FETCHES:
            open_at, how = at, "fetched"
        elif a.kind in _FREES and a.decision not in kept and open_at is not None:
            out.append((s.id, open_at, max(at, open_at + 1), "offload" if a.kind == ActionKind.RELEASE else how))
            open_at = None
    if open_at is not None:
        out.append((s.id, open_at, min(max(s.free_op, open_at + 1), n), how))
    return out
