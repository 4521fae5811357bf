"""How a run stays in sync with a trace made elsewhere (a fake trace, another device).

The runner (memplan.exec.interpreted) matches the step's ops against the trace by name, in order.
NOTE the rules for an op that is not the trace's next one:
 1. Ops that move no data and come and go between runs (`OPTIONAL_OPS`: lift_fresh, detach,
    `.item()`) pass without being matched.
 2. An op the trace has a little later (within RESYNC_WINDOW, reading storages of the same
    sizes) means the run skipped the trace's ops before it: their actions run without their
    tensors (a swap-out or drop there finds no storage and keeps it resident, counted
    `unresolved`), and the count goes on from there.
 3. Any other op is one the trace does not have: it runs unplanned (`inserted_ops`); more than
    INSERTED_LIMIT of them in a row leave the program for the step.
 4. A storage is dropped for recomputation only when every op its replay needs was recorded in
    this step, so a skipped op never leaves a storage that cannot be rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable

from ..model import Trace

RESYNC_WINDOW = 32  # trace ops looked ahead for an op the run makes out of turn (rule 2)
INSERTED_LIMIT = 64  # ops in a row the trace does not have before the step leaves the program (rule 3)


def op_ahead(trace: Trace, names: list[str], pos: int, name: str, reads: Callable[[], list],
             counted: Callable[[int], int]) -> int | None:
    """The first trace op after `pos`, within the window, named `name` whose read storages have
    the sizes of the call's (`reads()`: one tensor per storage it reads; `counted`: a size as the
    trace counts it); None: the call is one the trace does not have (rule 3)."""
    end = min(pos + 1 + RESYNC_WINDOW, len(names))
    candidates = [j for j in range(pos + 1, end) if names[j] == name]
    if not candidates:
        return None
    sizes = [counted(t.untyped_storage().nbytes()) for t in reads()]
    storages = trace.storages
    return next((j for j in candidates if [storages[s].nbytes for s in trace.ops[j].reads] == sizes), None)
