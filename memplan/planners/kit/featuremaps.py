"""Feature maps and keep/swap/recompute policies over them (HOME, Capuchin, SuperNeurons).

A feature map is a saved activation with room in its gap (`memplan.planners.kit.saved`), at
least `min_bytes` large (and never empty); it is one storage, and one entry of a policy vector:
an Action: KEEP (0), SWAP (1) or RECOMPUTE (2), HOME's numbering (paper 004 §3.3). Its gap runs from
its last forward access to its first backward access. A swap's prefetch is issued
`lead` backward layers (`Trace.layers`) before the layer that needs it
(`memplan.planners.kit.prefetch.lead_trigger`): HOME's Fig. 4 issues PRE2 when BWD4 starts
for BWD3.

A policy becomes decisions through one rule set (`Decoder`), so that every policy,
random ones included, is a plan the validator accepts:
- recompute only storages the trace can rebuild, and whose lineage inputs are not written
  again before the recomputation (RECOMPUTE_INPUT_OVERWRITTEN);
- a recomputation reads its lineage inputs at its op: an input recomputed away there (or
  freed by the framework) is rebuilt with it, recursively (`memplan.sim.chains`); an input
  swapped away there is brought back for it (its swap's gap ends at that op, HOME's
  executor fetching the dependency the recomputation needs); a lineage that cannot be
  rebuilt, or only deeper than the simulator follows, keeps the storage instead.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ...model import Action, Decision, Trace
from ...sim.chains import MAX_CHAIN_DEPTH
from ...sim.memo import MISS, ProbeMemo
from .gaps import alive_at
from .prefetch import DEFAULT_LEAD, backward_layer_starts, lead_trigger
from .replayable import can_replay
from .saved import saved_gaps

DEFAULT_MIN_BYTES = 1 << 20  # smaller activations stay resident: a copy's latency would cost more than they save
# Rebuilds nested deeper than this keep the storage instead: well inside the depth the simulator
# follows, whatever order it walks a lineage in.
MAX_DEPTH = MAX_CHAIN_DEPTH // 2


@dataclass(frozen=True, kw_only=True, eq=False)
class FeatureMaps:
    """The policy's dimensions: one entry per feature map, in forward order of production."""

    trace: Trace  # the iteration
    storage: np.ndarray  # storage ids
    out_after: np.ndarray  # last forward access
    back_before: np.ndarray  # first backward access
    nbytes: np.ndarray  # sizes
    recomputable: np.ndarray  # bool: RECOMPUTE is allowed (rebuildable, inputs not overwritten)
    layer_starts: tuple[int, ...]  # first op of every backward layer, ascending (prefetch triggers)

    def __len__(self) -> int:
        return len(self.storage)

    def allowed(self) -> np.ndarray:
        """(n, 3) bool: which Action (by its number) each feature map may take."""
        out = np.ones((len(self), 3), dtype=np.bool_)
        out[:, Action.RECOMPUTE] = self.recomputable
        return out

    def trigger(self, k: int, back: int, lead: int = DEFAULT_LEAD) -> int:
        """The prefetch op of feature map `k` when it must be back before op `back`."""
        return lead_trigger(self.layer_starts, int(self.out_after[k]), back, lead)


def feature_maps(trace: Trace, min_bytes: int = DEFAULT_MIN_BYTES) -> FeatureMaps:
    """The feature maps of `trace`: saved activations of at least `min_bytes` (and at least a byte)
    with room in their gap, in forward order of production."""
    gaps = sorted(saved_gaps(trace, max(min_bytes, 1)), key=lambda g: (trace.producer(g.storage) or 0, g.storage))
    sid = np.array([g.storage for g in gaps], dtype=np.int64)
    back = np.array([g.back_before for g in gaps], dtype=np.int64)
    return FeatureMaps(trace=trace, storage=sid, out_after=np.array([g.last_forward for g in gaps], dtype=np.int64),
                       back_before=back, nbytes=trace.nbytes[sid] if len(sid) else np.zeros(0, np.int64),
                       recomputable=np.array([can_replay(trace, int(s), int(b)) for s, b in zip(sid, back)],
                                             dtype=np.bool_),
                       layer_starts=backward_layer_starts(trace) or (0,))


class Decoder:
    """Turns policies over one trace's feature maps into decisions, by the rules of the module
    docstring; whether a recomputation can be rebuilt is reused between policies that agree
    on what it looks at (memplan.sim.memo), and Decision objects are made once."""

    def __init__(self, fm: FeatureMaps, lead: int = DEFAULT_LEAD):
        self.fm, self.lead = fm, lead
        self.index = {int(s): k for k, s in enumerate(fm.storage)}
        self._out, self._back = fm.out_after.tolist(), fm.back_before.tolist()
        self.memo = ProbeMemo()
        self._made: dict[tuple, Decision] = {}  # (feature map, back_before or -1 for recompute, trigger override)
        self._recompute_of: list = [None] * len(fm)  # per feature map, its recomputation and its usual swap
        self._swap_of: list = [None] * len(fm)
        self._replayable: dict[tuple[int, int], bool] = {}
        self._away: dict[tuple[int, tuple], tuple[int, ...]] = {}  # (op, feature maps) -> those away at op

    def __call__(self, policy: np.ndarray, triggers: dict[int, int] | None = None) -> tuple[Decision, ...]:
        """The decisions of `policy` (an Action per feature map; RECOMPUTE only where
        allowed); `triggers` overrides the prefetch op of some swapped feature maps (kept inside their gap)."""
        policy = np.asarray(policy, dtype=np.int64).tolist()  # plain lists: this runs for every policy scored
        back, early = self._back, {}  # early: a swapped feature map's back_before brought forward
        recomputes = []
        action_of = policy.__getitem__

        def actions(ks: tuple[int, ...]) -> tuple[int, ...]:  # the memo's probe (`_fetched` asks it)
            return tuple(map(action_of, ks))

        roots = self.memo.roots
        for k in [k for k, action in enumerate(policy) if action == Action.RECOMPUTE]:
            node = roots.get(k)  # the memo's walk (ProbeMemo.lookup), inlined: it runs per recomputation
            while node is not None and node.item is not MISS:
                node = node.children.get(tuple(map(action_of, node.item)))
            fetched = node.value if node is not None else MISS
            if fetched is MISS:
                fetched = self.memo.record(k, actions, functools.partial(self._fetched, k, back[k]))
            if fetched is None:
                policy[k] = Action.KEEP  # its lineage cannot be rebuilt: it stays, and later chains find it
                continue
            op = back[k]
            for j in fetched:
                if op < early.get(j, back[j]):
                    early[j] = op
            recomputes.append(k)
        made = [self._recomputed(k) for k in recomputes]
        for k, action in enumerate(policy):
            if action == Action.SWAP:
                to = early.get(k, back[k])
                trigger = triggers.get(k) if triggers else None
                if self._out[k] + 1 < to:
                    made.append(self._swapped(k) if to == back[k] and trigger is None else
                                self._decision(k, to, trigger))
        return tuple(made)

    def _recomputed(self, k: int) -> Decision:
        made = self._recompute_of[k]
        if made is None:
            made = self._recompute_of[k] = self._decision(k, -1, None)
        return made

    def _swapped(self, k: int) -> Decision:
        """Feature map `k` swapped over its whole gap, prefetched at its lead trigger."""
        made = self._swap_of[k]
        if made is None:
            made = self._swap_of[k] = self._decision(k, self._back[k], None)
        return made

    def _decision(self, k: int, back: int, trigger: int | None) -> Decision:
        made = self._made.get((k, back, trigger))
        if made is None:
            fm = self.fm
            if back < 0:
                made = Decision(storage=int(fm.storage[k]), action="recompute", out_after=self._out[k],
                                back_before=self._back[k])
            else:
                op = fm.trigger(k, back, self.lead) if trigger is None else min(max(trigger, self._out[k] + 1), back)
                made = Decision(storage=int(fm.storage[k]), action="swap", out_after=self._out[k],
                                back_before=back, trigger=op)
            self._made[(k, back, trigger)] = made
        return made

    def _away_at(self, op: int, ks: tuple[int, ...]) -> tuple[int, ...]:
        """Those of the feature maps `ks` away at `op` (in their gap): only their actions matter there, the
        others are as good as KEEP (a fact of the feature maps, kept)."""
        away = self._away.get((op, ks))
        if away is None:
            out, back = self._out, self._back
            away = self._away[(op, ks)] = tuple(j for j in ks if out[j] < op < back[j])
        return away

    def _fetched(self, k: int, op: int, actions) -> tuple[int, ...] | None:
        """The swapped feature maps a recomputation of feature map `k` before `op` needs back, or
        None when its lineage cannot be rebuilt there (within MAX_DEPTH). `actions` gives the policy's
        actions of feature maps (the memo's probe: it is asked only of those away at `op`)."""
        trace, fetched = self.fm.trace, []
        stack, seen = [(int(self.fm.storage[k]), 0)], {int(self.fm.storage[k])}
        while stack:
            node, depth = stack.pop()
            inputs = [r for r in trace.lineage(node, op)[1] if r not in seen]
            seen.update(inputs)
            away = self._away_at(op, tuple(self.index[r] for r in inputs if r in self.index))
            state = dict(zip(away, actions(away))) if away else {}
            for r in inputs:
                action = state.get(self.index.get(r), Action.KEEP)
                if alive_at(trace, r, op) and action != Action.RECOMPUTE:
                    if action == Action.SWAP:
                        fetched.append(self.index[r])
                    continue
                if depth + 1 >= MAX_DEPTH or not self._can_replay(r, op):
                    return None
                stack.append((r, depth + 1))
        return tuple(fetched)

    def _can_replay(self, sid: int, op: int) -> bool:
        key = (sid, op)
        if key not in self._replayable:
            self._replayable[key] = can_replay(self.fm.trace, sid, op)
        return self._replayable[key]
