"""mu-cuDNN (paper 003): convolution kernels split into micro-batches so faster algorithms fit a
workspace limit. Registered names: `ucudnn:wr` (Workspace Reuse: each kernel its own
`workspace`, per-kernel dynamic programming) and `ucudnn:wd` (Workspace Division:
`workspace` is the network's total, Pareto fronts and a 0-1 ILP).

The plan keeps every storage resident and decides every convolution kernel of the trace
(memplan.model.conv); the simulator charges the chosen times and workspaces. Under a
budget each op's workspace must fit the room the trace leaves it, so a budget at or above
the trace's peak is always met (the zero-workspace implicit GEMM fits anywhere). To
also swap or recompute, compose: `autoswap:bo+ucudnn:wd` (memplan.planners.base).
"""

from __future__ import annotations

import numpy as np

from ..conv.decide import decide
from ..model import Plan
from ..problem import Problem
from ..units import ByteSize
from .base import infeasible, register

DEFAULT_WORKSPACE = ByteSize(64 * 2**20)  # Caffe2's default per-layer limit, the paper's "64 MiB"
DEFAULT_POLICY = "powerOfTwo"  # the paper's quick policy; "all" is exact, "undivided" is plain cuDNN


@register("ucudnn:wr", "mu-cuDNN WR: per-kernel DP over micro-batches under a per-kernel workspace (paper 003)",
          decides=("microbatch",), mode="wr", composed=False)
@register("ucudnn:wd", "mu-cuDNN WD: Pareto fronts + 0-1 ILP under a total workspace (paper 003)",
          decides=("microbatch",), mode="wd", composed=False)
def ucudnn_planner(problem: Problem, *, mode="wr", composed=False,
                   workspace: ByteSize = DEFAULT_WORKSPACE, policy: str = DEFAULT_POLICY, source: str = "model",
                   db: str = "") -> Plan:
    """Micro-batch every convolution kernel; `workspace` per kernel (wr) or in total (wd).

    Args:
        composed: part of `X+ucudnn:...`: ops where the trace exceeds the budget get no
            workspace, and a budget below the peak is X's business (memplan.planners.base.compositions.compose).
        workspace: the workspace limit in bytes ("64MiB" on the command line).
        policy: batch-size policy: "all", "powerOfTwo" or "undivided".
        source: benchmark source: "model" (for the cost's device), "cpu" or "cudnn".
        db: benchmark database file to reuse and extend ("" keeps benchmarks in memory).
    """
    trace, budget_bytes, cost = problem.trace, problem.budget_bytes, problem.cost
    if budget_bytes < trace.peak_load_bytes and not composed:
        raise infeasible(budget_bytes, trace.peak_load_bytes, f"ucudnn:{mode}")
    microbatches = decide(trace, cost.profile, mode=mode, workspace=int(workspace), policy=policy, source=source,
                          db=db or None, headroom=np.maximum(budget_bytes - trace.load, 0))
    return Plan(microbatches=microbatches)
