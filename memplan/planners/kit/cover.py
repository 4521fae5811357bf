"""The largest storages first: a plan of few swaps, for steps whose host pays per decision.

Where the host's work is priced, every decision costs actions on the host (four a swap), and a
step that runs interpreted or is host-bound pays each of them in full. The planners that choose
among feature maps move many small activations; this plan moves the fewest storages it can: at
the op most over the budget, it swaps the largest storage away there (any gap of any storage of
at least `min_bytes` that spans the op: a weight, an optimizer state across the iteration
boundary, an activation), and again until no op is over; prefetches in the §4.5 order
(`memplan.planners.kit.prefetch.gap_decisions`). `auto` scores it beside the fast planners.
"""

from __future__ import annotations

import numpy as np

from ...model import Decision, Trace
from .candidates import find_candidates
from .gaps import gap_covers, load_without
from .prefetch import gap_decisions


def largest_first(trace: Trace, budget_bytes: int, min_bytes: int) -> tuple[Decision, ...] | None:
    """The swaps of the largest storages first (module docstring); None when the storages that
    may move cannot bring every op within `budget_bytes`."""
    cand = find_candidates(trace, max(min_bytes, 1), multi_swap=True)
    largest = [(int(cand.storage[k]), int(cand.out_after[k]), int(cand.back_before[k]))
               for k in np.argsort(-cand.nbytes, kind="stable")
               if int(cand.storage[k]) not in trace.engine_owned]  # a data-parallel engine moves its own
    away: list[tuple[int, int, int]] = []
    load = trace.load
    while (load > budget_bytes).any():
        op = int(np.argmax(load))
        taken = {sid for sid, _, _ in away}
        gap = next((g for g in largest if g[0] not in taken and gap_covers(g[1], g[2], op)), None)
        if gap is None:
            return None
        away.append(gap)
        load = load_without(trace, away)
    return gap_decisions(trace, away, [], cap=budget_bytes) if away else None
