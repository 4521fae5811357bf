"""`dtr`: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021) as a peer planner.

DTR is an online rematerializer: it runs the program under a memory cap and, when an
allocation does not fit, evicts the activation with the smallest h_DTR = cost / (size x
staleness), rematerializing an evicted tensor when it is used again
(`memplan.planners._dtr_sim` has the policy). Replayed over the trace with the cost
model's op times, its evictions become an ordinary plan of recompute decisions that the
validator checks, the simulator times and the executor runs.

DTR's own bookkeeping counts what is resident, not the transient memory of a replay (a
replayed op's discarded outputs, inputs rebuilt along the way), so its plan at cap c can
need a little more than c in the simulator. The planner therefore runs DTR at the budget
and, while the simulator does not fit the plan under the budget, again at a cap lowered by
the shortfall (at most MAX_TRIES runs). Evictions whose replay cannot run (an input gone
or overwritten by then: `memplan.planners._replay`) are kept instead.
"""

from __future__ import annotations

from ..cost.model import Cost
from ..model import Decision, Plan, Trace
from ..sim.simulate import Simulator
from ..sim.validate import static_load
from ._dtr_sim import DtrRun
from ._policy_eval import smallest_cap
from ._replay import replayable
from .base import infeasible, register

MAX_TRIES = 6  # DTR runs at lowered caps before the budget counts as out of reach
MIN_STEP = 0.01  # a lowered cap drops by at least this share of the budget
NAMING_TRIES = 4  # loads tried for the smallest feasible one an infeasible budget names


@register("dtr", "Dynamic Tensor Rematerialization (ICLR'21): greedy online eviction by h_DTR = cost / "
                 "(size x staleness), rematerialized on access", decides=("recompute",))
def plan_dtr(trace: Trace, budget_bytes: int, cost: Cost, *, seed: int = 0) -> Plan:
    """DTR's evictions under `budget_bytes`, as recompute decisions.

    Args:
        trace, budget_bytes, cost, seed: see `memplan.planners.base` (DTR is deterministic).
    Raises:
        InfeasibleBudgetError: no DTR run fits under the budget; names a load at which it does.
    """
    if budget_bytes >= trace.peak_load_bytes:
        return Plan()
    simulator = Simulator(trace, cost)
    found, best = _fitting(trace, cost, simulator, budget_bytes)
    if found is not None:
        return found
    raise infeasible(budget_bytes, _feasible_load(trace, cost, simulator, best, budget_bytes), "dtr")


def dtr_decisions(trace: Trace, cost: Cost, cap_bytes: int) -> tuple[Decision, ...]:
    """The replayable recompute decisions of one DTR run at `cap_bytes`."""
    gaps = DtrRun(trace, cost.durations, cap_bytes).gaps()
    decisions = [Decision(storage=s, action="recompute", out_after=o, back_before=b) for s, o, b in gaps]
    return tuple(sorted(replayable(trace, decisions), key=lambda d: (d.back_before, d.storage)))


def _fitting(trace: Trace, cost: Cost, simulator: Simulator, budget: int) -> tuple[Plan | None, Plan]:
    """(a DTR plan that fits `budget`, or None; the last plan tried)."""
    cap, plan = budget, Plan()
    for _ in range(MAX_TRIES):
        plan = Plan(decisions=dtr_decisions(trace, cost, cap))
        result = simulator.run(plan, budget)
        if result.feasible and static_load(trace, plan.decisions).max() <= budget:
            return plan, plan
        cap -= max(int(result.shortfall_bytes or 0), int(budget * MIN_STEP))
        if cap <= 0:
            break
    return None, plan


def _feasible_load(trace: Trace, cost: Cost, simulator: Simulator, plan: Plan, budget: int) -> int:
    """A load above `budget` at which this planner returns a plan (its promise when refusing `budget`).

    Starts from the smallest cap the last plan fits, and checks that the planner, run there,
    finds a plan; the trace's own peak (where nothing is evicted) always works.
    """
    load = budget
    for _ in range(NAMING_TRIES):
        load = max(load + 1, smallest_cap(simulator, plan, load))
        if load >= trace.peak_load_bytes:
            break
        found, plan = _fitting(trace, cost, simulator, load)
        if found is not None:
            return load
    return trace.peak_load_bytes
