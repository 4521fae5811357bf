"""What memplan's own executor costs the host, measured by running it (`memplan calibrate`).

`memplan.cost.calibrate_host` measures what any executor pays (a step's host work per op, a saved-tensor
hook, a dispatch mode); the hooked executor's own work per hook call, per action and per module call it
runs again is measured here, with the executor itself, on a chain of tiny layers (so the copies move next
to nothing) trained plainly and under three plans: every saved activation swapped (two or three hook
calls an action), the momentum swapped between steps (a hundred and ninety actions at two hook calls),
and every block recomputed by running its call again. The first two fix a hook call's and an action's
price (two equations, two unknowns: a plan's Python work is its hook calls and its actions); the third,
less what those and the layers run again cost, a region run's. The interpreted executor's check of every
op's arguments while a storage is away (`guard_op_s`) is measured the same way: the momentum plan run
interpreted keeps a storage away at every op of forward and backward, and a parameter away over the
shortest gap between two of its uses keeps one away at a few: what each step costs beyond plain
training, its identity hooks', its actions' and its copies, is its ops at the executor's price per op
in its mode (`mode_op_s`, the executor's own: its mode does more than one that only calls each op)
plus its ops guarded at `guard_op_s` (two equations, two unknowns). Last, with every block recomputed
by the interpreted executor (sqrt-n, run op by op), the executor's own clock on its recording of the ops
it may replay, per op recorded, is `record_op_s` (a residual of the step would carry the other prices'
errors: on this chain it came out at a fifth of the recording's measured 15 us). Each figure is the
median of a few rounds.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np
import torch

from ..cost.calibrate_host import host_clock
from ..cost.profiles import DeviceProfile
from ..model import Decision, Plan, Trace
from ..model.program import HOOKED, INTERPRETED
from ..problem import cost_of
from ..sim.arrays import guarded_ops
from .optimize import optimize

BLOCKS, WIDTH, BATCH = 12, 16, 4  # blocks of Linear-Tanh-Linear-Tanh: what a block saves inside is recomputed
STEPS, ROUNDS = 5, 3


def with_executor_costs(profile: DeviceProfile, device: str = "cpu") -> DeviceProfile:
    """`profile` with `hook_call_s`, `action_s`, `region_s`, and the interpreted executor's `mode_op_s`,
    `guard_op_s` and `record_op_s`, measured on `device`."""
    model, step, inputs = _chain(device)
    plain = _step_s(lambda: step(*inputs), device)
    swap, swaps = _planned_s(model, step, inputs, profile, device, planner="save-on-cpu")
    state, states = _planned_s(model, step, inputs, profile, device, plan=_state_between_steps)
    hook_call, action = _per_call_and_action(swap - plain, swaps, state - plain, states)
    recompute, runs = _planned_s(model, step, inputs, profile, device, planner="sqrt-n", segments=BLOCKS)
    per_op = plain / max(1, runs["ops"])
    region = max(0.0, recompute - plain - runs["calls"] * hook_call - runs["actions"] * action
                 - runs["rerun_ops"] * per_op) / max(1, runs["regions"])
    few_s, few = _planned_s(model, step, inputs, profile, device, plan=_param_briefly_away)
    all_s, every = _planned_s(model, step, inputs, profile, device, plan=_state_interpreted)
    mode_op, guard = _per_op_and_guard(few_s - plain, few, all_s - plain, every, profile.hook_s, action)
    _, replays = _planned_s(model, step, inputs, profile, device, planner="sqrt-n", segments=BLOCKS,
                            executor="interpreted")
    record = replays["record_s"] / max(1, replays["captured"])
    return replace(profile, hook_call_s=hook_call, action_s=action, region_s=region, mode_op_s=mode_op,
                   guard_op_s=guard, record_op_s=record)


def _per_op_and_guard(extra_a: float, a: dict, extra_b: float, b: dict, hook_s: float,
                      action_s: float) -> tuple[float, float]:
    """Seconds per op in the interpreted executor's mode and per op guarded, from two interpreted plans'
    extra seconds a step: each, its identity hooks, actions and copies taken out, is its ops at the first
    price plus its ops guarded at the second. Where the two plans do not tell them apart (or one comes out
    negative), the price per op carries what the plan with fewer ops guarded costs, the guard the rest."""
    ya, yb = ((extra - p["hooks"] * hook_s - p["actions"] * action_s - p["copies_s"]) for extra, p in
              ((extra_a, a), (extra_b, b)))
    solved = _two_prices(ya, a["ops"], a["guarded_ops"], yb, b["ops"], b["guarded_ops"])
    if solved is not None:
        return solved
    per_op = max(0.0, ya) / max(1, a["ops"])
    return per_op, max(0.0, yb - b["ops"] * per_op) / max(1, b["guarded_ops"])


def _per_call_and_action(extra_a: float, a: dict, extra_b: float, b: dict) -> tuple[float, float]:
    """Seconds per hook call and per action from two plans' extra seconds a step: each, its copies taken
    out, is its hook calls at a call's price plus its actions at an action's. Where the two plans do not
    tell the prices apart (or one comes out negative), the action's price carries all."""
    ya, yb = extra_a - a["copies_s"], extra_b - b["copies_s"]
    solved = _two_prices(ya, a["calls"], a["actions"], yb, b["calls"], b["actions"])
    return solved if solved is not None else (0.0, max(0.0, ya) / max(1, a["actions"]))


def _two_prices(ya: float, a1: float, a2: float, yb: float, b1: float, b2: float) -> tuple[float, float] | None:
    """(x, y) with x * a1 + y * a2 = ya and x * b1 + y * b2 = yb (two plans' counts of two kinds of work,
    and their extra seconds), or None where the plans do not tell them apart or a price comes out negative."""
    det = a1 * b2 - b1 * a2
    if not det:
        return None
    x, y = (ya * b2 - yb * a2) / det, (a1 * yb - b1 * ya) / det
    return (x, y) if x >= 0 and y >= 0 else None


def _chain(device: str):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(),
                                                      torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh())
                                  for _ in range(BLOCKS)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)  # momentum: state to move between steps
    x, y = torch.randn(BATCH, WIDTH, device=device), torch.randn(BATCH, WIDTH, device=device)

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    return model, step, (x, y)


def _state_between_steps(trace: Trace) -> Plan:
    """Every momentum buffer away from the optimizer's step to its next: many actions, all taken at the
    optimizer step's two hooks."""
    decisions = [Decision(storage=s.id, action="swap", out_after=trace.accesses[s.id][-1],
                          back_before=trace.accesses[s.id][0])
                 for s in trace.storages if s.kind == "optimizer_state" and trace.accesses[s.id]]
    return Plan(decisions=decisions, level=HOOKED)  # at its hooks, though the dispatch mode would peak lower


def _state_interpreted(trace: Trace) -> Plan:
    """`_state_between_steps` run by the interpreted executor: a storage away at every op of forward and
    backward, each op's arguments checked against it."""
    return replace(_state_between_steps(trace), level=INTERPRETED)


def _param_briefly_away(trace: Trace) -> Plan:
    """One parameter away, run interpreted, over the shortest gap between two of its uses that holds an op:
    few ops run while it is away."""
    gaps = [(b - a, s.id, a, b) for s in trace.storages if s.kind == "param"
            for a, b in zip(trace.accesses[s.id], trace.accesses[s.id][1:]) if b - a >= 2]
    _, sid, out_after, back_before = min(gaps)
    return Plan(decisions=(Decision(storage=sid, action="swap", out_after=out_after, back_before=back_before),),
                level=INTERPRETED)


def _planned_s(model, step, inputs, profile: DeviceProfile, device: str, plan=None, **params):
    """The step's time under a plan (`plan(trace)`, or the named planner's with no budget), and what
    its executor did per step."""
    if plan is not None:
        first = optimize(step, *inputs, planner="none", model=model, measure=False, fake=False, profile=profile)
        first.close()
        params["plan"], params["trace"] = plan(first.trace), first.trace
    run = optimize(step, *inputs, model=model, measure=False, fake=False, profile=profile, **params)
    try:
        seconds = _step_s(lambda: run(*inputs), device)
        program, stats = run.program, run.stats()
    finally:
        run.close()
    n = max(1, stats["steps"])
    trace, cost = run.trace, cost_of(run.trace, profile)
    swapped = [trace.storages[d.storage].nbytes for d in run.plan.decisions if d.action == "swap"]
    return seconds, {"actions": len(program.actions), "calls": stats["hook_calls"] / n,
                     "copies_s": sum(cost.d2h_s(b) + cost.h2d_s(b) for b in swapped),
                     "regions": stats["regions_recomputed"] / n,
                     "rerun_ops": sum(r.stop - trace.calls[r.call].first_op for r in set(program.regions.values())),
                     "ops": len(trace.ops),
                     "hooks": len(trace.saved) + sum(s.unpacked_at is not None for s in trace.saved),
                     "guarded_ops": int(guarded_ops(len(trace.ops), *_gaps(program)).sum()),
                     "record_s": stats["record_s"] / n, "captured": len(program.captured_ops)}


def _gaps(program) -> tuple[np.ndarray, np.ndarray]:
    """The program's decisions' out_after and back_before, as columns."""
    return (np.array([d.out_after for d in program.decisions], dtype=np.int64),
            np.array([d.back_before for d in program.decisions], dtype=np.int64))


def _step_s(fn, device: str) -> float:
    """Median seconds (`host_clock`) of a step over ROUNDS rounds of STEPS steps (after one)."""
    clock = host_clock(device)
    fn()
    rounds = []
    for _ in range(ROUNDS):
        if device == "cuda":
            torch.cuda.synchronize()
        started = clock()
        for _ in range(STEPS):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        rounds.append((clock() - started) / STEPS)
    return statistics.median(rounds)

