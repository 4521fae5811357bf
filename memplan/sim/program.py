"""Compile a Plan into the step program the executor runs (memplan.model.program).

The program is what the simulator did while simulating the plan under its budget: the
kernel emits every action in order, including the points where a swap-out's memory was
released (lazily once its copy completed, or when an allocation had to wait for it). The
program's predicted result is that simulation, so a plan's reported overhead and peak are
those of the program the executor runs.
"""

from __future__ import annotations

from dataclasses import replace

from ..cost.model import Cost
from ..errors import MemplanError
from ..model import Plan, Trace
from ..model.program import ACTION_KINDS, Action, ReplayStep, StepProgram
from . import _codes as K
from .simulate import Simulator

_KIND_NAMES = dict(zip((K.A_RELEASE, K.A_PREFETCH, K.A_RECOMPUTE, K.A_WAIT, K.A_SWAP_OUT, K.A_DROP), ACTION_KINDS))


def compile_program(trace: Trace, plan: Plan, cost: Cost, budget_bytes: int | None = None,
                    simulator: Simulator | None = None) -> StepProgram:
    """The step program of `plan` under `budget_bytes` (default: the plan's own budget).

    Raises:
        MemplanError: the plan is for another trace, or it does not fit its budget.
    """
    if plan.trace_digest is not None and plan.trace_digest != trace.digest:
        raise MemplanError(f"plan was made for trace {plan.trace_digest}, not this one ({trace.digest})")
    budget = plan.budget_bytes if budget_bytes is None else budget_bytes
    result, rows, chains = (simulator or Simulator(trace, cost)).program_rows(plan, budget)
    if not result.feasible:
        raise MemplanError(f"the plan does not fit its budget of {budget} bytes: op {result.infeasible_op} is "
                           f"{result.shortfall_bytes} bytes short")
    actions = tuple(Action(op=int(op), after=bool(after), kind=_KIND_NAMES[int(kind)], decision=int(d))
                    for op, after, kind, d in rows)
    replays = {k: tuple(ReplayStep(storage=s.storage, ops=s.ops, temporary=s.temporary) for s in chain.steps)
               for k, chain in chains.items()}
    frees = {k: chain.frees for k, chain in chains.items() if chain.frees}
    start_away = tuple(k for k, d in enumerate(plan.decisions)
                       if d.action == "swap" and d.wraps and d.prefetch_at <= d.back_before)
    source = "none" if budget is None else "plan" if budget_bytes is None else "given"
    return StepProgram(decisions=plan.decisions, actions=actions, start_away=start_away, replays=replays, frees=frees,
                       microbatches=plan.microbatches, budget_bytes=budget, trace_digest=trace.digest,
                       predicted=replace(result, budget_bytes=budget, budget_source=source).summary())


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
    away_at_start = {program.decisions[k].storage for k in program.start_away}
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
    executor cancels the swap: see StepRunner._prefetch), so that gap has no interval break.
    """
    out, open_at, how, kept = [], (None if away_at_start else s.alloc_op), "plain", set()
    for a in actions:
        at = a.op + 1 if a.after else a.op
        if a.kind in ("prefetch", "recompute") and open_at is not None:
            kept.add(a.decision)
        elif a.kind in ("prefetch", "recompute"):
            open_at, how = at, "fetched"
        elif a.kind in ("release", "drop") and a.decision not in kept and open_at is not None:
            out.append((s.id, open_at, max(at, open_at + 1), "offload" if a.kind == "release" else how))
            open_at = None
    if open_at is not None:
        out.append((s.id, open_at, min(max(s.free_op, open_at + 1), n), how))
    return out
