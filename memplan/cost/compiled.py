"""What a step costs when torch.compile runs it: fused kernels, and no Python at every op.

Inductor leaves the ops that compute (matmuls, convolutions, attention: those with FLOPs) to
the libraries eager PyTorch calls, and fuses the rest (elementwise ops, reductions,
normalisations) into kernels that write only what leaves them; a view is no work. Its
generated code launches the kernels without eager PyTorch's per-op work (Python, the
dispatcher, autograd's bookkeeping). So in a compiled forward or backward:

- an op with FLOPs costs its duration less the eager per-op work measured durations hold (no
  less than its roofline);
- any other op that writes costs the larger of writing its result at the device's memory
  bandwidth (what it reads was made in the same kernel, or is counted where it was written)
  and, where durations were measured on the CPU, its own work (its duration less the eager
  per-op work): a CPU's elementwise kernels are bound by their arithmetic (tanh, exp), not memory;
- an op that moves no data costs nothing.

The eager per-op work is the median duration of the trace's ops that move no data, which is
that work alone (0 where durations are the device's: CUDA events, rooflines). The optimizer's
step stays eager (memplan compiles the model's forward): its ops keep their prices. The host's
work per op and per executor action is not priced (`priced_host` false): a compiled step has no
executor at its ops, and a plan's decisions are the partitioner's. Not priced either: Dynamo's
guards and AOTAutograd's wrappers, a fixed cost per compiled call (about 0.5 ms a step on this
project's CPU host, docs/compile.md).
"""

from __future__ import annotations

import numpy as np

from ..model import Trace
from .model import Cost, roofline_s

COMPILED_PHASES = ("forward", "backward")  # what torch.compile runs of a step whose model's forward is compiled


def compiled_cost(trace: Trace, cost: Cost) -> Cost:
    """`cost` as a compiled step pays it (the module docstring says how).

    Args:
        trace: the traced step.
        cost: its eager cost model on the same profile.
    Returns:
        A Cost with the compiled durations and no host work priced.
    """
    profile = cost.profile
    measured = cost.host_in_durations  # wall-clock durations, eager per-op work in them
    overhead = _eager_op_work(trace, cost) if measured else 0.0
    bandwidth = profile.hbm_bytes_per_s * profile.memory_efficiency
    durations = cost.durations.copy()
    for op in trace.ops:
        if op.phase not in COMPILED_PHASES:
            continue
        work = max(durations[op.index] - overhead, 0.0) if measured else 0.0
        if op.flops > 0:
            floor = roofline_s(op.flops, op.bytes_accessed, None, profile) - profile.launch_s
            durations[op.index] = max(work, floor) if measured else durations[op.index]
        elif op.bytes_accessed > 0 and op.writes:
            written = min(op.bytes_accessed, sum(trace.storages[w].nbytes for w in op.writes))
            durations[op.index] = max(work, written / bandwidth)
        else:
            durations[op.index] = 0.0
    return Cost(profile=profile, durations=durations, host_in_durations=measured, priced_host=False)


def _eager_op_work(trace: Trace, cost: Cost) -> float:
    """The eager per-op work in measured durations: the median duration of the compiled phases'
    ops that move no data."""
    idle = [cost.durations[op.index] for op in trace.ops
            if op.phase in COMPILED_PHASES and op.flops == 0 and op.bytes_accessed == 0]
    return float(np.median(idle)) if idle else 0.0
