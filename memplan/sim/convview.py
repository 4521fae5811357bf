"""A plan's convolution decisions as the simulator sees them.

A trace of aten ops sees no convolution workspace, and the cost model prices a
convolution as one roofline kernel. A plan's `MicroBatch` decisions say what each
decided kernel really costs; the simulator charges that by simulating the trace as it
would have been recorded had the kernels been visible:

- a decided op runs for the sum of its kernels' times (they run one after the other);
- it writes one more storage, of kind `workspace`, alive only while the op runs
  ([op, op+1)): allocated with the op's outputs, released when the op ends, as large as
  the largest temporary of its kernels (each frees its workspace before the next starts).

Being an output of the op, the workspace is also held while a recomputation replays the
op (memplan.sim.chains counts an op's other new outputs while it runs). The same view is
what a swap/recompute planner composed with a convolution planner (`X+ucudnn:wd`) plans on,
so its load curve includes the workspaces.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..model import Storage, Trace, conv_temps

WORKSPACE_KIND = "workspace"


def conv_view(trace: Trace, durations: np.ndarray, microbatches) -> tuple[Trace, np.ndarray]:
    """The trace and op durations that `microbatches` imply (unchanged when there are none).

    Args:
        trace: the traced iteration.
        durations: seconds per op (the cost model's).
        microbatches: the plan's conv decisions (checked against the trace: memplan.model.check).
    Returns:
        (view, durations): the view keeps every storage id and op index of `trace`; its new
        workspace storages come after the trace's storages.
    """
    if not microbatches:
        return trace, durations
    seconds, temps = conv_temps(microbatches)
    durations = np.array(durations, dtype=np.float64, copy=True)
    durations[list(seconds)] = list(seconds.values())
    storages, ops = list(trace.storages), list(trace.ops)
    for op in sorted(i for i, nbytes in temps.items() if nbytes > 0):
        sid = len(storages)
        storages.append(Storage(id=sid, nbytes=temps[op], kind=WORKSPACE_KIND, alloc_op=op, free_op=op + 1,
                                name=f"workspace of op {op}"))
        ops[op] = replace(ops[op], writes=ops[op].writes + (sid,))
    return replace(trace, storages=tuple(storages), ops=tuple(ops)), durations
