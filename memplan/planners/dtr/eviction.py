"""DTR's online eviction, replayed over a trace: which activation leaves memory when, by h_DTR.

Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021) runs the program op by op
under a memory cap. When an allocation would exceed the cap it evicts the resident,
evictable tensor with the smallest

    h_DTR(t) = cost(e*(t)) / (size(t) x staleness(t))

where staleness is the time since t was last used and e*(t) is t's evicted neighbourhood:
t itself plus the evicted tensors that a rematerialization of t, or of an evicted tensor
that depends on t, would have to recompute (evicted ancestors and descendants, followed
through evicted tensors only). Here e* is computed exactly by walking those neighbours
(the paper's h_DTR; not its union-find approximation), with "ancestor" meaning an input of
the ops that wrote t and "descendant" a storage written by an op that reads t. The cost of
a storage is the compute time of the ops that wrote it so far.

An access to an evicted storage rematerializes it before the op (its evicted inputs are
rebuilt for the replay and dropped again, as `memplan.sim.chains` runs a recompute chain).
Each eviction becomes one recompute gap: from the storage's last access before the
eviction to its next access. Evictable: non-persistent activations with a producer in the
trace (`Trace.recomputable`) that some later op reads, and whose replay there would read the
values its producer read (no input written again in between: `memplan.planners.kit.replayable`'s rule
2); parameters, gradients, optimizer state and inputs stay. The op's own operands are locked
while it runs.
"""

from __future__ import annotations

import bisect

import numpy as np

from ...model import Trace
from ..kit.gaps import alive_at
from ..kit.rebuild import Rebuilder

MIN_STALENESS_S = 1e-12  # a storage used by the op just before still has a non-zero staleness


class DtrRun:
    """One pass of DTR over `trace` under `cap_bytes`; `gaps()` gives the recompute gaps it made."""

    def __init__(self, trace: Trace, durations: np.ndarray, cap_bytes: int):
        self.trace, self.durations, self.cap = trace, durations, int(cap_bytes)
        self.nbytes = trace.nbytes
        self.evictable = np.array([s.kind == "activation" and s.nbytes > 0 and trace.recomputable(s.id)
                                   for s in trace.storages], dtype=bool)
        self.children = _children(trace)
        self.rebuilder = Rebuilder(trace)  # only its static rule: inputs overwritten before the replay
        self.resident: set[int] = set()  # alive and in memory
        self.evicted: dict[int, int] = {}  # alive, evicted -> its last access before the eviction
        self.last_used = np.zeros(len(trace.storages))  # clock of the last access
        self.load = 0
        self.clock = 0.0
        self.made: list[tuple[int, int, int]] = []  # (storage, out_after, back_before)

    def gaps(self) -> list[tuple[int, int, int]]:
        """Run DTR over every op; the (storage, out_after, back_before) recompute gaps, in order made."""
        trace = self.trace
        frees = _by_op(len(trace.ops), ((s.free_op, s.id) for s in trace.storages))
        allocs = _by_op(len(trace.ops), ((s.alloc_op, s.id) for s in trace.storages))
        for i, op in enumerate(trace.ops):
            for sid in frees[i]:
                self._release(sid)
            locked = set(op.reads) | set(op.writes)
            for sid in sorted(locked):
                if sid in self.evicted:
                    self._rematerialize(sid, i, locked)
            for sid in allocs[i]:
                self._make_room(int(self.nbytes[sid]), i, locked)
                self.resident.add(sid)
                self.load += int(self.nbytes[sid])
            for sid in locked:
                self.last_used[sid] = self.clock
            self.clock += float(self.durations[i])
        return self.made

    # --- memory --------------------------------------------------------------------------

    def _release(self, sid: int) -> None:
        """The storage's lifetime ended: it leaves memory (or the evicted set) for good."""
        if sid in self.resident:
            self.resident.discard(sid)
            self.load -= int(self.nbytes[sid])
        self.evicted.pop(sid, None)

    def _rematerialize(self, sid: int, op: int, locked: set[int]) -> None:
        """Bring `sid` back before `op`: room for it and its evicted inputs rebuilt for the replay."""
        ancestors = self._evicted_ancestors(sid, op)
        temporary = sum(int(self.nbytes[r]) for r in ancestors) + self._transient(ancestors | {sid}, op)
        self._make_room(int(self.nbytes[sid]) + temporary, op, locked | ancestors | {sid})
        self.made.append((sid, self.evicted.pop(sid), op))
        self.resident.add(sid)
        self.load += int(self.nbytes[sid])

    def _make_room(self, need: int, op: int, locked: set[int]) -> None:
        """Evict by smallest h_DTR until `need` more bytes fit under the cap (or nothing is left)."""
        while self.load + need > self.cap:
            victim = self._victim(op, locked)
            if victim is None:
                return
            accesses = self.trace.accesses[victim]
            self.evicted[victim] = accesses[bisect.bisect_left(accesses, op) - 1]
            self.resident.discard(victim)
            self.load -= int(self.nbytes[victim])

    # --- the heuristic ---------------------------------------------------------------------

    def _victim(self, op: int, locked: set[int]) -> int | None:
        """The evictable resident storage with the smallest h_DTR (ties: the lowest id)."""
        best, best_h = None, np.inf
        for sid in sorted(self.resident - locked):
            if not self.evictable[sid]:
                continue
            back = self._next_access(sid, op)
            if back is None or self.rebuilder.overwritten(sid, back):  # its replay there would read new values
                continue
            staleness = max(self.clock - self.last_used[sid], MIN_STALENESS_S)
            h = self._neighbourhood_cost(sid, op) / (int(self.nbytes[sid]) * staleness)
            if h < best_h:
                best, best_h = sid, h
        return best

    def _next_access(self, sid: int, op: int) -> int | None:
        """The first access to `sid` after `op`, when it was also accessed before `op` (else None)."""
        accesses = self.trace.accesses[sid]
        k = bisect.bisect_right(accesses, op)
        return accesses[k] if 0 < k < len(accesses) and accesses[k - 1] < op else None

    def _neighbourhood_cost(self, sid: int, op: int) -> float:
        """Compute seconds of `sid` and its evicted neighbourhood e*."""
        seen, stack = {sid}, [sid]
        while stack:
            for other in self._neighbours(stack.pop(), op):
                if other not in seen:
                    seen.add(other)
                    stack.append(other)
        return sum(self._cost(s, op) for s in seen)

    def _neighbours(self, sid: int, op: int):
        yield from (r for r in self.trace.lineage(sid, op)[1] if self._absent(r, op))
        yield from (c for c in self.children[sid] if c in self.evicted)

    def _cost(self, sid: int, op: int) -> float:
        return float(self.durations[list(self.trace.lineage(sid, op)[0])].sum())

    def _transient(self, rebuilt: set[int], op: int) -> int:
        """The largest memory one replayed op holds while it runs beside what it rebuilds: its other
        outputs, discarded, and copies of what it updates in place (`memplan.sim.chains`)."""
        trace, most = self.trace, 0
        for sid in rebuilt:
            for j in trace.lineage(sid, op)[0]:
                most = max(most, sum(int(self.nbytes[w]) for w in set(trace.ops[j].writes) if w not in rebuilt))
        return most

    def _evicted_ancestors(self, sid: int, op: int) -> set[int]:
        """Absent storages a replay of `sid` before `op` rebuilds first: inputs evicted or no longer
        (or not yet) alive, followed through absent inputs only."""
        out, stack = set(), [sid]
        while stack:
            for r in self.trace.lineage(stack.pop(), op)[1]:
                if r not in out and self._absent(r, op):
                    out.add(r)
                    stack.append(r)
        return out

    def _absent(self, sid: int, op: int) -> bool:
        return sid in self.evicted or not alive_at(self.trace, sid, op)


def _children(trace: Trace) -> list[list[int]]:
    """Per storage, the storages written by an op that reads it."""
    out: list[set[int]] = [set() for _ in trace.storages]
    for op in trace.ops:
        for r in op.reads:
            out[r].update(w for w in op.writes if w != r)
    return [sorted(c) for c in out]


def _by_op(n: int, pairs) -> list[list[int]]:
    """Storage ids grouped by op index (indices outside [0, n) dropped)."""
    out: list[list[int]] = [[] for _ in range(n)]
    for i, sid in pairs:
        if 0 <= i < n:
            out[i].append(sid)
    return out
