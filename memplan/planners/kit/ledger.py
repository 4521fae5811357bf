"""Gaps of saved activations decided one at a time (offload or remove), and the planned load they leave.

The planned load is the trace's load with every decided gap away from the op after its
action to its back_before (copies and recomputations taking no time), plus the inputs a
recomputation rebuilds for a while at its op: what the budget must hold whatever the
timing. A removal's recomputation may read another candidate: one that is offloaded then
is brought back early, by the recomputation's op (its gap ends there; the validator
forbids rebuilding from the host), and one that is removed too is rebuilt first. So an
offload is always possible; a removal is possible when its recomputation, and those of
the removed gaps that read it, can run (`memplan.planners.kit.rebuild`).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, replace

import numpy as np

from ...model import Action, Trace
from .rebuild import Rebuilder
from .saved import SavedGap



@dataclass(frozen=True, kw_only=True, eq=False)
class Removal:
    """What removing one gap at one node changes."""

    gap: int  # the candidate removed
    delta: np.ndarray  # change to the planned load, per op
    relied: dict  # removed gap -> storages its recomputation reads, after this removal
    extra: dict  # removed gap -> bytes it rebuilds for a while at its op, after this removal
    shrinks: dict  # offloaded gap -> its new (earlier) back_before
    limit: np.ndarray  # where an offload of each candidate would have to end, after this removal


class Ledger:
    """Decided gaps (candidate k = gaps[k]); the planned load; what each removal relies on."""

    def __init__(self, trace: Trace, gaps: list[SavedGap] | tuple[SavedGap, ...], target_bytes: int):
        self.trace = trace
        self.target = target_bytes
        self.sid = np.array([g.storage for g in gaps], dtype=np.int64)
        self.nbytes = np.array([g.nbytes for g in gaps], dtype=np.int64)
        self.first = np.array([g.last_forward for g in gaps], dtype=np.int64)
        self.need = np.array([g.back_before for g in gaps], dtype=np.int64)  # first backward access
        self.gap_of = {int(s): k for k, s in enumerate(self.sid)}
        self.last_forward = max((op.index for op in trace.ops if op.phase == "forward"), default=-1)
        self.decided = np.zeros(len(self.sid), dtype=np.int64)
        self.out_after = np.full(len(self.sid), -1, dtype=np.int64)
        self.back = self.need.copy()  # back_before of each gap (an offload may end early)
        self.limit = self.need.copy()  # where an offload decided now would have to end
        self.planned = trace.load.astype(np.int64).copy()
        self.rebuilder = Rebuilder(trace)
        self.relied: dict[int, set[int]] = {}
        self.extra: dict[int, int] = {}
        self.watchers: dict[int, set[int]] = collections.defaultdict(set)  # storage -> removed gaps reading it
        self._removals: dict[int, Removal | None] = {}  # per candidate, without its own absence
        self._reductions: dict[int, np.ndarray] = {}  # by earliest node (until the next decision)

    # --- queries ------------------------------------------------------------------------------------

    def open_at(self, c: int) -> np.ndarray:
        """Candidates an action at node c may take away (undecided, forward use done, a gap left)."""
        return np.flatnonzero((self.decided == 0) & (self.first <= c) & (self.limit > c + 1))

    def fits_from(self, op: int, planned: np.ndarray | None = None) -> bool:
        """True when the planned load of every op from `op` on is within the target."""
        planned = self.planned if planned is None else planned
        return planned[op:].max(initial=0) <= self.target

    def doomed(self, c: int, earliest: int, after: Removal | None = None) -> bool:
        """True when some op after node c stays over the target even if every open candidate were
        offloaded at the earliest node from `earliest` on (`after` a removal, when given)."""
        over = self.planned - self._reduction(earliest)
        if after is not None:
            over = over + after.delta
            self._uncover(over, after.gap, earliest, int(self.limit[after.gap]), 0)  # k is taken, not open
            for j in np.flatnonzero(after.limit != self.limit):  # open gaps that must now be back earlier
                self._uncover(over, j, earliest, int(self.limit[j]), int(after.limit[j]))
        return bool((over[c + 1:] > self.target).any())

    def _reduction(self, earliest: int) -> np.ndarray:
        """Per op: the bytes every open candidate would take away if offloaded at its earliest node."""
        if earliest not in self._reductions:
            n = len(self.planned)
            mask = self.decided == 0
            lo = np.maximum(self.first[mask], earliest)
            end = self.limit[mask]
            keep = (lo <= self.last_forward) & (end > lo + 1)
            sizes = self.nbytes[mask][keep]
            steps = np.bincount(lo[keep] + 1, sizes, minlength=n + 1) - np.bincount(end[keep], sizes, minlength=n + 1)
            self._reductions[earliest] = np.cumsum(steps)[:n].astype(np.int64)
        return self._reductions[earliest]

    def _uncover(self, over: np.ndarray, k: int, earliest: int, end: int, new_end: int) -> None:
        """Add back what candidate k's potential offload covered between new_end and end."""
        lo = max(int(self.first[k]), earliest)
        if lo <= self.last_forward and end > lo + 1:
            over[max(lo + 1, new_end):end] += self.nbytes[k]

    def triples(self, action: int) -> list[tuple[int, int, int]]:
        """(storage, out_after, back_before) of the gaps decided with `action`."""
        return [(int(self.sid[k]), int(self.out_after[k]), int(self.back[k]))
                for k in np.flatnonzero(self.decided == action)]

    # --- decisions ---------------------------------------------------------------------------------

    def offload(self, k: int, c: int) -> None:
        """Offload gap k after node c (until its limit: a removed gap may need it back earlier)."""
        end = int(self.limit[k])
        self._set(k, Action.SWAP, c, end)
        self.planned[c + 1:end] -= self.nbytes[k]

    def removal(self, k: int, c: int) -> Removal | None:
        """What removing gap k after node c would change; None when a recomputation could not run."""
        if k not in self._removals:  # all but k's own absence is the same at every node until a decision
            sid = int(self.sid[k])
            self.rebuilder.add(sid, int(self.first[k]), int(self.need[k]), "recompute")
            try:
                self._removals[k] = self._removal(k)
            finally:
                self.rebuilder.remove(sid)
        effect = self._removals[k]
        if effect is None:
            return None
        delta = effect.delta.copy()
        delta[c + 1:self.need[k]] -= self.nbytes[k]
        return replace(effect, delta=delta)

    def remove(self, effect: Removal, c: int) -> None:
        """Apply a removal computed by `removal` at node c."""
        k = effect.gap
        self._set(k, Action.RECOMPUTE, c, int(self.need[k]))
        self.planned += effect.delta
        self.limit = effect.limit
        for g, relied in effect.relied.items():
            for r in self.relied.get(g, ()):
                self.watchers[r].discard(g)
            self.relied[g] = relied
            for r in relied:
                self.watchers[r].add(g)
        self.extra.update(effect.extra)
        for j, end in effect.shrinks.items():
            self.back[j] = end
            self.rebuilder.add(int(self.sid[j]), int(self.out_after[j]), end, "swap")

    def _set(self, k: int, action: int, c: int, back: int) -> None:
        self._removals, self._reductions = {}, {}
        self.decided[k], self.out_after[k], self.back[k] = action, c, back
        self.rebuilder.add(int(self.sid[k]), c, back, Action(action).word)

    def _removal(self, k: int) -> Removal | None:
        """The effect of removing k but its own absence, with k marked away in the rebuilder."""
        sid, need = int(self.sid[k]), int(self.need[k])
        ops = {k: need, **{g: int(self.back[g]) for g in self.watchers.get(sid, ()) if self.back[g] < need}}
        relied = {}
        for g, op in ops.items():
            relied[g] = self.rebuilder.rebuild(int(self.sid[g]), op, fetch_swapped=True)
            if relied[g] is None:
                return None
        n = len(self.planned)
        delta = np.zeros(n + 1, dtype=np.int64)
        extra, shrinks, limit = {}, {}, self.limit.copy()
        for g, op in ops.items():
            extra[g] = self.rebuilder.temporaries(relied[g], op)
            delta[op] += extra[g] - self.extra.get(g, 0)
            delta[op + 1] -= extra[g] - self.extra.get(g, 0)
            for j in (self.gap_of[r] for r in relied[g] if r in self.gap_of):
                if self.decided[j] == 0:
                    limit[j] = min(limit[j], op)  # an offload decided later must be back by op
                elif self.decided[j] == Action.SWAP and self.out_after[j] < op < shrinks.get(j, self.back[j]):
                    if op <= self.out_after[j] + 1:
                        return None
                    shrinks[j] = op
        for j, end in shrinks.items():
            delta[end] += self.nbytes[j]
            delta[self.back[j]] -= self.nbytes[j]
        return Removal(gap=k, delta=np.cumsum(delta)[:n], relied=relied, extra=extra, shrinks=shrinks, limit=limit)
