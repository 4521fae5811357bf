"""The host's work in the `milp` model, as the simulator prices it (memplan.sim.simulate, "host").

Where the cost model prices the host (a traced PyTorch step), every op is issued by the host
before the device runs it: the hooked executor's work per op (Python, autograd, launch, its
saved-tensor hooks), the interpreted executor's dispatch mode on top of it where some decision
cannot run at hook points (then the whole step runs interpreted: memplan.sim.lowering), and per
decision its executor actions (four a swap: out, release, prefetch, wait; two a recomputation:
drop, run) and a recomputation's run. A GPU's host runs ahead of the device, which waits only
when it catches up: no position's ops start before the host has issued its first op and all before it,
and the step ends no earlier than the host's work for all of it and the last op. The CPU is its own device: its
host work adds to the step.

What the model simplifies: a swap's release, prefetch and wait are counted where the storage is
due (the prefetch is issued earlier), an action at an op is issued by the next position, and a
decision's hook point is the simulator's (`Lowering.unhookable`) for its whole gap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cost.model import Cost
from ...model import Decision
from ...model.program import HOOKED
from ...sim.arrays import host_per_op
from ...sim.decisions import DecisionArrays
from ...sim.simulate import Simulator
from ..kit.linear import MS
from .layers import LayerProblem

SWAP_OUT_ACTIONS, SWAP_BACK_ACTIONS = 1, 3  # a swap's out; its release, prefetch and wait
RECOMPUTE_OUT_ACTIONS, RECOMPUTE_BACK_ACTIONS = 1, 1  # a recomputation's drop; its run


@dataclass(frozen=True, kw_only=True)
class HostPrice:
    """What the host's work costs the plans of one LayerProblem."""

    before_ms: np.ndarray  # per position: the hooked executor's host work for its first op and every op before it
    total_ms: float  # ... for every op of the step
    last_ms: float  # the device's time for the last op (it runs after the host issued it)
    mode_before_ms: np.ndarray  # per position: the interpreted executor's extra work for those ops
    mode_total_ms: float  # ... for every op
    action_ms: float  # per executor action
    run_ms: float  # per recomputation's run (a region's or a replay's, the less)
    interpreted: np.ndarray  # per unit: its decision cannot run at hook points (the step runs interpreted)
    asynchronous: bool  # a GPU's host (runs ahead); else the CPU's (adds to the step)


def host_price(problem: LayerProblem, simulator: Simulator, cost: Cost) -> HostPrice | None:
    """The host prices of `problem`'s plans (None where the cost model prices no host work)."""
    if not cost.priced_host:
        return None
    trace = simulator.trace
    per_op = MS * host_per_op(trace, cost)[HOOKED]
    mode = MS * cost.executor_s("mode_op") * np.ones(len(per_op))
    before = np.concatenate([[0.0], np.cumsum(per_op)])
    mode_before = np.concatenate([[0.0], np.cumsum(mode)])
    units = problem.units
    decisions = [Decision(storage=u.storage, action="swap", out_after=u.out_after, back_before=u.back_before)
                 for u in units]
    if simulator.lowering is None or not trace.saved:
        interpreted = np.ones(len(units), dtype=np.bool_)
    else:
        interpreted = simulator.lowering.unhookable(DecisionArrays.of(decisions))
    run_s = min(cost.executor_s("region"), cost.executor_s("replay_op")) + cost.host_op_s
    return HostPrice(before_ms=before[problem.positions + 1], total_ms=float(before[-1]),
                     last_ms=MS * float(problem.op_s[-1]) if len(problem.op_s) else 0.0,
                     mode_before_ms=mode_before[problem.positions + 1], mode_total_ms=float(mode_before[-1]),
                     action_ms=MS * cost.executor_s("action"), run_ms=MS * run_s, interpreted=interpreted,
                     asynchronous=cost.host_async)


def add_host_rows(builder, host: HostPrice) -> None:
    """The host's rows in the model `builder` builds (memplan.planners.milp.model._Builder): a running
    sum of the actions issued before each position, a binary for the interpreted level, and the
    positions' and the step's end's waits for the host."""
    m, c, p = builder.m, builder.c, builder.p
    n_pos = len(p.positions)
    interpreted = int(c.add(1, ub=1, integer=True)[0])
    for k in np.flatnonzero(host.interpreted).tolist():
        c.ge([(interpreted, 1), (m.s[k], -1), (m.r[k], -1)], 0)
    acted: list[list] = [[] for _ in range(n_pos)]  # per position: the actions issued in the segment before it
    for k, u in enumerate(p.units):
        out, back = p.position_of(u.out_after) + 1, p.position_of(u.back_before) + 1
        if out < n_pos:
            acted[out] += [(m.s[k], -host.action_ms * SWAP_OUT_ACTIONS), (m.r[k], -host.action_ms * RECOMPUTE_OUT_ACTIONS)]
        if back < n_pos:
            acted[back] += [(m.s[k], -host.action_ms * SWAP_BACK_ACTIONS),
                            (m.r[k], -(host.action_ms * RECOMPUTE_BACK_ACTIONS + host.run_ms))]
    issued = c.add(n_pos)  # actions (ms) issued before each position
    c.ub[issued[0]] = 0
    for i in range(1, n_pos):
        c.ge([(issued[i], 1), (issued[i - 1], -1)] + acted[i], 0)
    every = [(m.s[k], -host.action_ms * (SWAP_OUT_ACTIONS + SWAP_BACK_ACTIONS)) for k in range(len(p.units))] + \
        [(m.r[k], -(host.action_ms * (RECOMPUTE_OUT_ACTIONS + RECOMPUTE_BACK_ACTIONS) + host.run_ms))
         for k in range(len(p.units))]
    baseline_ms = MS * p.baseline_s
    if host.asynchronous:
        for i in range(n_pos):  # the device starts no position before the host issued what comes before it
            c.ge([(builder.o[i], 1), (issued[i], -1), (interpreted, -host.mode_before_ms[i])], host.before_ms[i])
        c.ge([(builder.overhead, 1), (interpreted, -host.mode_total_ms)] + every,
             host.total_ms + host.last_ms - baseline_ms)
    else:  # the CPU: its host work adds to the step's device work
        last = n_pos - 1
        c.ge([(builder.overhead, 1), (builder.o[last], -1), (interpreted, -host.mode_total_ms)] + every,
             MS * p.seg_s[last] - baseline_ms + host.total_ms)
