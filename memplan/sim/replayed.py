"""The price of a step replayed as one CUDA graph: the same device work, no host work per op.

A captured step is launched by one call a step (memplan.exec.graphed): no Python runs per op,
per saved-tensor hook or per action, and no kernel is launched from the host. So the replay
is simulated with the cost model's host costs set to zero (`replay_cost`): the ops, copies and
recomputations are the same, and each op keeps the launch latency its roofline charges (a
graph's kernels still start one after another on the device). The simulator then says what
a host-bound eager step loses to its host (memplan.sim.simulate, "host").
"""

from __future__ import annotations

from dataclasses import replace

from ..budget import NO_LIMIT
from ..cost.model import Cost
from ..model import Plan, Trace
from .simulate import Simulator

# The profile's host costs (memplan.cost.profiles.DeviceProfile): none is paid by a replay.
HOST_COSTS = ("host_op_s", "hook_s", "hook_call_s", "mode_op_s", "guard_op_s", "replay_op_s", "record_op_s", "action_s",
              "region_s")


def replay_cost(cost: Cost) -> Cost:
    """`cost` for a step replayed as a CUDA graph: the same durations, every host cost zero."""
    profile = replace(cost.profile, **{name: 0.0 for name in HOST_COSTS})
    return Cost(profile=profile, durations=cost.durations, host_in_durations=cost.host_in_durations, captured=True)


def replay_time_s(trace: Trace, plan: Plan | None, cost: Cost, budget_bytes: int = NO_LIMIT) -> float | None:
    """Simulated seconds of one replay of `plan`'s step under `budget_bytes` (None: infeasible there)."""
    result = Simulator(trace, replay_cost(cost)).run(plan, budget_bytes)
    return result.time_s if result.feasible else None
