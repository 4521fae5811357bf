"""What a plan can have away at each level it may run at, for the lower bound (`memplan.planners.bound`).

Every plan that fits runs hooked or interpreted (memplan.sim.lowering; plain runs nothing, and
nothing away fits no budget below the trace's load). So the least overhead of all plans is the
least of two: that of the plans run hooked and that of the plans run interpreted, and a lower
bound of each bounds the whole. The interpreted executor acts anywhere but pays its dispatch mode
on every op (memplan.sim.arrays.host_per_op); the hooked executor pays only its hooks but can have
a storage away only where a site can run its decision (memplan.model.hooksites), which
`HookedAway` over-approximates per storage and op:

- a storage no owner holds, only from its first pack on and before the last backward op (its
  decision ends at a backward op: memplan.model.hooksites' rule, `hook_movable` before);
- an owned storage (a parameter, gradient or optimizer state, swapped through its owner) at any op;
- either, never at an op between two consecutive hook points that also holds an access of it: its
  swap-out is moved to the first point after its last access before the gap, its prefetch to the
  last point at or before its trigger (memplan.sim._events.place_decisions), so it is resident
  from the point before such an access to the point after;
- recomputed only where some module call can run again to rebuild it (memplan.sim.regions: the
  lowering drops a recomputation no call can run, so a hooked plan has it resident there).
"""

from __future__ import annotations

import numpy as np

from ...model import Trace
from ...model.hooksites import HookSites
from ...sim.arrays import producer_ids
from ...sim.regions import Regions


class HookedAway:
    """Where a hooked plan may have each storage away (a superset: see the module docstring)."""

    def __init__(self, trace: Trace):
        sites = self.sites = HookSites(trace)
        never = np.iinfo(np.int64).max  # a storage autograd never saves: no pack, no hook finds it
        self.first_pack = np.where(sites.first_packed_at >= 0, sites.first_packed_at, never)
        self.last_backward = max((op.index for op in trace.ops if op.phase == "backward"), default=-1)
        self.owned = np.zeros(len(trace.storages), dtype=np.bool_)
        self.owned[[o.storage for o in trace.owners]] = True
        self.points = np.asarray(sites.points, dtype=np.int64)
        # which calls can run again is a fact of the trace (op times only price the runs: not read here)
        self.regions = Regions(trace, np.zeros(len(trace.ops)), sites, producer_ids(trace))
        # per storage, the stretches between consecutive points that hold an access of it
        self.blocked = [frozenset(self.stretch(np.asarray(acc, dtype=np.int64)).tolist()) for acc in trace.accesses]

    def stretch(self, ops: np.ndarray) -> np.ndarray:
        """Per op, the index of the stretch between consecutive hook points it lies in."""
        return np.searchsorted(self.points, ops, side="right") - 1

    def ops(self, sid: int, ops: np.ndarray) -> np.ndarray:
        """Those of `ops` at which a hooked plan may have storage `sid` away."""
        if not self.owned[sid]:
            ops = ops[(ops >= self.first_pack[sid]) & (ops < self.last_backward)]
        blocked = self.blocked[sid]
        if not blocked or not len(ops):
            return ops
        return ops[[k not in blocked for k in self.stretch(ops).tolist()]]

    def rebuildable(self, sid: int, due: int) -> bool:
        """Whether a hooked plan can recompute storage `sid` for op `due` (its gap's end: a rebuild
        before any op of the gap finds the same calls, none of them accessing it in between)."""
        return self.regions.can_rebuild(sid, due)

    def replays(self, sid: int, due: int) -> frozenset:
        """The ops a hooked plan's recomputation of storage `sid` for op `due` replays, whichever call
        runs again (memplan.sim.regions.Regions.least_run)."""
        return self.regions.least_run(sid, due)

    def at(self, i: int, storages: np.ndarray) -> np.ndarray:
        """bool per storage of `storages`: a hooked plan may have it away at op `i`."""
        stretch = int(self.stretch(np.array([i]))[0])
        base = self.owned[storages] | ((self.first_pack[storages] <= i) & (i < self.last_backward))
        return base & np.array([stretch not in self.blocked[s] for s in storages.tolist()], dtype=np.bool_)
