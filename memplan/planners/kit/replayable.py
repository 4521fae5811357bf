"""Which recomputations can really be replayed: a rule for every planner that recomputes.

Recomputing storage `s` before op `t` replays the ops that wrote it (`Trace.lineage(s, t)`).
That works only when every input of those ops is there at `t` and still holds the value
the op read:

1. an input is resident at `t` (alive, and not inside one of its own gaps), or it can be
   rebuilt there the same way (it has a producer, is not swapped out at `t`, and its own
   inputs follow this rule; a cycle cannot be rebuilt);
2. no op writes an input again between the replayed op and `t` (the replay would read
   the new value), for the target's ops and for every op a rebuild replays
   (`input_overwritten`, the one definition of this rule).

A storage freed by the framework before backward whose producer read something that is
gone by then (an imported log's released constant, an input freed early) cannot be
rebuilt, and an in-place update of an input after its use makes the old value unreadable:
a checkpointing planner keeps such a storage instead of recomputing it (it becomes a
segment boundary). Keeping a storage never makes another recomputation impossible, so
dropping the broken decisions until none is left converges.
"""

from __future__ import annotations

import bisect

from ...model import Decision, Trace
from .gaps import alive_at


def input_overwritten(trace: Trace, sid: int, before: int) -> bool:
    """Rule 2: True when an op replayed to rebuild `sid` before op `before` reads a storage
    (other than `sid`) that is written again after that op and before `before`."""
    for j in trace.lineage(sid, before)[0]:
        for r in trace.ops[j].reads:
            writers = trace.writers[r]
            later = bisect.bisect_right(writers, j)  # the first write of r after op j (writers ascend)
            if r != sid and later < len(writers) and writers[later] < before:
                return True
    return False


def can_replay(trace: Trace, sid: int, before: int) -> bool:
    """True when `sid` can be rebuilt before op `before` by replaying its writers, whatever else
    is away: it has a producer in the trace (`Trace.recomputable`) and rule 2 holds."""
    return trace.recomputable(sid) and not input_overwritten(trace, sid, before)


def replayable(trace: Trace, decisions: list[Decision]) -> list[Decision]:
    """`decisions` without the recomputations that cannot be replayed (rules in the module docstring).

    Args:
        trace: the trace.
        decisions: structurally valid decisions (swaps and recomputes).
    Returns:
        The decisions kept, in their order.
    """
    decisions = list(decisions)
    while True:
        broken = _unreplayable(trace, decisions)
        if not broken:
            return decisions
        decisions = [d for d in decisions if id(d) not in broken]


def _unreplayable(trace: Trace, decisions: list[Decision]) -> set[int]:
    """ids of the recompute decisions that break a rule under `decisions`."""
    gaps: dict[int, list[Decision]] = {}
    for d in decisions:
        gaps.setdefault(d.storage, []).append(d)
    check = _Replay(trace, gaps)
    return {id(d) for d in decisions if d.action == "recompute" and not check.can_replay(d.storage, d.back_before, ())}


class _Replay:
    """Answers "can storage s be replayed right before op t?" under one set of gaps."""

    def __init__(self, trace: Trace, gaps: dict[int, list[Decision]]):
        self.trace = trace
        self.gaps = gaps
        self.memo: dict[tuple[int, int], bool] = {}

    def can_replay(self, sid: int, t: int, path: tuple[int, ...]) -> bool:
        """Rule 2 for `sid`'s ops before `t`, and rule 1 for each of their inputs."""
        if (sid, t) not in self.memo:
            inputs = self.trace.lineage(sid, t)[1]
            self.memo[(sid, t)] = not input_overwritten(self.trace, sid, t) and all(
                self.present(r, t) or self.rebuildable(r, t, (*path, sid)) for r in inputs)
        return self.memo[(sid, t)]

    def present(self, sid: int, t: int) -> bool:
        """Alive at op t and not inside one of its gaps (a gap ends before back_before)."""
        return alive_at(self.trace, sid, t) and not any(d.away_at(t) for d in self.gaps.get(sid, ()))

    def rebuildable(self, sid: int, t: int, path: tuple[int, ...]) -> bool:
        """Recomputable, not on the host at t, not already being rebuilt, and replayable."""
        swapped = any(d.action == "swap" and d.away_at(t) for d in self.gaps.get(sid, ()))
        return (sid not in path and not swapped and self.trace.recomputable(sid)
                and self.can_replay(sid, t, path))
