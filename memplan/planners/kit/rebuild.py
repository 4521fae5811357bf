"""Can a storage be recomputed before an op, given the gaps decided so far?

The rules are the validator's (RECOMPUTE_INPUT_ABSENT, RECOMPUTE_INPUT_OVERWRITTEN, which
`memplan.sim.validate` checks independently; the second is `memplan.planners.kit.replayable`'s
`input_overwritten`): replaying the ops that wrote a storage needs each of their inputs
there, either resident (alive and not inside one of its gaps) or itself rebuilt from
resident storages; a swapped-away input is on the host and cannot be rebuilt; no input may
have been written again since the replayed op read it. Planners that add recompute
decisions one at a time ask this before each one.

Each storage has at most one gap here (the planners using it decide a storage once).
"""

from __future__ import annotations

from ...model import Trace
from ...sim.chains import MAX_CHAIN_DEPTH
from .gaps import alive_at
from .replayable import input_overwritten


class Rebuilder:
    """Answers rebuild questions for one trace as gaps are added."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.away: dict[int, tuple[int, int, str]] = {}  # storage -> (out_after, back_before, action)
        self._overwritten: dict[tuple[int, int], bool] = {}

    def add(self, sid: int, out_after: int, back_before: int, action: str) -> None:
        """Record that `sid` is away over (out_after, back_before) by `action` ("swap" or "recompute")."""
        self.away[sid] = (out_after, back_before, action)

    def remove(self, sid: int) -> None:
        """Forget the gap of `sid`."""
        self.away.pop(sid, None)

    def absent(self, sid: int, op: int) -> str | None:
        """The action that keeps `sid` away at `op`, or None when it is not inside its gap."""
        gap = self.away.get(sid)
        return gap[2] if gap is not None and gap[0] < op < gap[1] else None

    def resident(self, sid: int, op: int) -> bool:
        """Alive at `op` in the trace and not inside its gap."""
        return alive_at(self.trace, sid, op) and self.absent(sid, op) is None

    def rebuild(self, sid: int, op: int, fetch_swapped: bool = False) -> set[int] | None:
        """The storages a recomputation of `sid` right before `op` relies on, or None when it cannot run.

        The set holds every input read at any depth (resident, rebuilt or fetched): a later
        gap of one of them can break the recomputation.

        Args:
            fetch_swapped: count an input swapped away at `op` as there (the caller brings
                it back by `op`, ending its gap there) instead of failing.
        """
        relied: set[int] = set()
        return relied if self._rebuildable(sid, op, relied, {sid}, 0, fetch_swapped) else None

    def temporaries(self, relied: set[int], op: int) -> int:
        """Bytes of the inputs in `relied` rebuilt at `op` for a while (neither resident nor swapped away)."""
        return sum(int(self.trace.nbytes[r]) for r in relied
                   if not self.resident(r, op) and self.absent(r, op) != "swap")

    def _rebuildable(self, sid: int, op: int, relied: set[int], path: set[int], depth: int, fetch: bool) -> bool:
        trace = self.trace
        if depth > MAX_CHAIN_DEPTH or not trace.recomputable(sid) or self.overwritten(sid, op):
            return False
        for r in trace.lineage(sid, op)[1]:
            relied.add(r)
            if self.resident(r, op) or (fetch and self.absent(r, op) == "swap"):
                continue
            if r in path or self.absent(r, op) == "swap":
                return False
            if not self._rebuildable(r, op, relied, path | {r}, depth + 1, fetch):
                return False
        return True

    def overwritten(self, sid: int, op: int) -> bool:
        """`input_overwritten(trace, sid, op)`, remembered (planners ask it again and again)."""
        key = (sid, op)
        if key not in self._overwritten:
            self._overwritten[key] = input_overwritten(self.trace, sid, op)
        return self._overwritten[key]
