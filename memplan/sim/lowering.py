"""Lower a plan onto what the executor can act on without interpreting every op.

Lower the plan, do not interpret it (docs/executor.md, "How it runs"). A plan runs at one of three levels:

- plain: no decision; nothing is installed in the step.
- hooked: the decisions take tensors autograd saved (`Trace.saved`) out of memory until backward
  needs them (then autograd alone holds them: memplan.exec.hooked, rule 1). The executor (memplan.exec.hooked) acts only at saved-tensor packs and unpacks, the
  step's points with a hook (memplan.model.hookpoints), and recomputes by running a module call
  again (a region) as ordinary PyTorch. So the plan is moved onto those points: a swap-out or
  drop after op i happens at the first hook point at or after i + 1, a prefetch at the last one
  at or before its trigger, a recomputation at the last one at or before its op (a gap left
  empty is dropped: the storage stays). Recompute decisions due at one point are run by module
  calls as memplan.sim.regions chooses them; a decision none can run is dropped (kept
  resident): `dropped` counts them.
- interpreted: the dispatch-mode runner (memplan.exec.runner) acts before and after every op and
  recomputes by replaying ops (memplan.sim.chains): for micro-batched convolutions, a trace
  without hook records, or a plan whose hooked form does not fit its budget (the simulator
  decides: memplan.sim.simulate).

The simulator simulates the lowered plan, so what it predicts is what the executor runs. Plans
are lowered as columns (memplan.sim.decisions); the moved Decisions are made only when asked for
(`Lowered.decisions`: the step program needs them, a search does not).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from ..model import Decision, Trace
from ..model.hookpoints import first_packs, hook_points
from ..model.program import HOOKED, INTERPRETED, PLAIN, RegionRun
from .chains import Chain
from .decisions import DecisionArrays
from .arrays import producer_ids
from .regions import Regions


@dataclass(frozen=True, kw_only=True, eq=False)
class Lowered:
    """A plan's decisions at the level the executor runs them."""

    level: str  # one of memplan.model.program.LEVELS
    arrays: DecisionArrays  # the decisions as columns; hooked: moved onto hook points
    source: tuple[Decision, ...]  # the plan's decisions
    kept: np.ndarray | None = None  # hooked: the positions in `source` of the decisions run (None: all, unmoved)
    regions: dict[int, RegionRun] = field(default_factory=dict)  # hooked: recompute decision -> its run
    carriers: tuple[tuple[int, Chain], ...] = ()  # hooked: (decision, chain) of the decision that carries
    # each run's time and memory (memplan.sim.regions)
    read_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # hooked: sorted
    # op * storages + storage of what the runs due at op read
    runs_of: Regions | None = None  # hooked: the regions it was lowered with (its `holds` come from them)
    dropped: int = 0  # hooked: decisions left out (kept resident): no hook point or region runs them
    reason: str = ""  # why the first dropped decision was, or why the plan is interpreted

    @cached_property
    def holds(self) -> dict[int, int]:
        """Hooked: storage -> the later free_op its region run's hold gives it (memplan.sim.regions;
        made when first asked for: a plan whose hooked form cannot fit never needs them)."""
        return {} if self.runs_of is None else self.runs_of.holds(self.arrays, self.regions)

    @cached_property
    def decisions(self) -> tuple[Decision, ...]:
        """The decisions run (hooked: moved onto hook points), indexed as `arrays`, `regions` and the program."""
        if self.kept is None:
            return self.source
        a = self.arrays
        return tuple(replace(d, out_after=int(a.out_after[j]), back_before=int(a.back_before[j]))
                     if d.action == "recompute" else
                     replace(d, out_after=int(a.out_after[j]), trigger=int(a.prefetch_at[j]), overlap=False)
                     for j, d in enumerate(self.source[k] for k in self.kept.tolist()))


@dataclass(frozen=True, kw_only=True, eq=False)
class Placed:
    """A plan's decisions moved onto hook points, before module calls are chosen to recompute."""

    arrays: DecisionArrays  # the decisions that can run at hook points and keep a gap there, moved onto them
    index: np.ndarray  # their positions in the plan
    reason: str  # why the first decision that cannot run at hook points cannot ("" when all can)


def as_given(level: str, decisions: tuple[Decision, ...], arrays: DecisionArrays, reason: str = "") -> Lowered:
    """`decisions` run as planned at `level` (interpreted, or plain without decisions)."""
    return Lowered(level=level, arrays=arrays, source=decisions, reason=reason)


class Lowering:
    """Lowers plans of one trace (per-trace facts are computed once; search planners lower many)."""

    def __init__(self, trace: Trace, durations: np.ndarray, place_decisions):
        self.trace = trace
        self._place = place_decisions  # memplan.sim._events.place_decisions, compiled or interpreted
        self.points = hook_points(trace.saved, len(trace.ops))
        every = np.arange(len(trace.ops) + 1)  # per point p: the first hook point at or after it, the last before
        self._after = np.array(self.points)[np.searchsorted(self.points, every)]
        self._before = np.array(self.points)[np.searchsorted(self.points, every, side="right") - 1]
        self.first_pack = first_packs(trace.saved)  # storage -> index of its first pack
        n = len(trace.storages)
        self._first_packed_at = np.full(n, -1, dtype=np.int64)  # the point of its first pack (-1: never packed)
        for sid, k in self.first_pack.items():
            self._first_packed_at[sid] = trace.saved[k].packed_at
        self._backward = np.array([op.phase == "backward" for op in trace.ops], dtype=np.bool_)
        self.regions = Regions(trace, durations, self.first_pack, producer_ids(trace))

    # --- points ------------------------------------------------------------------------------

    def after(self, point: int) -> int:
        """The first hook point at or after `point`."""
        return self.points[bisect.bisect_left(self.points, point)]

    def before(self, point: int) -> int:
        """The last hook point at or before `point`."""
        return self.points[bisect.bisect_right(self.points, point) - 1]

    # --- plans -------------------------------------------------------------------------------

    def lower(self, decisions: tuple[Decision, ...], arrays: DecisionArrays | None = None) -> Lowered:
        """The hooked form of `decisions` (`arrays`: their columns, when at hand; interpreted where it
        cannot be hooked at all)."""
        decisions = tuple(decisions)
        arrays = DecisionArrays.of(decisions) if arrays is None else arrays
        return self.given(decisions, arrays) or self.with_regions(decisions, self.place(decisions, arrays))

    def given(self, decisions: tuple[Decision, ...], arrays: DecisionArrays) -> Lowered | None:
        """`decisions` as they run where they have no hooked form (plain without decisions, else
        interpreted), None where they have one."""
        if not decisions:
            return as_given(PLAIN, decisions, arrays)
        if not self.trace.saved:
            return as_given(INTERPRETED, decisions, arrays,
                            "the trace has no saved-tensor records (traced before memplan recorded them)")
        if self.trace.engine_owned and arrays.recompute.any():  # DDP and FSDP2 hook their modules' calls
            return as_given(INTERPRETED, decisions, arrays,
                            "a data-parallel engine's module calls do not run again alone: replayed op by op")
        return None

    def place(self, decisions: tuple[Decision, ...], arrays: DecisionArrays) -> Placed:
        """The decisions of a plan with a hooked form (`given` is None) moved onto hook points."""
        moved, unhookable, left = self._moved(arrays)
        index = np.flatnonzero(~unhookable & ~left)
        return Placed(arrays=moved.take(index), index=index,
                      reason=self._unhookable(decisions[int(np.argmax(unhookable))]) if unhookable.any() else "")

    def with_regions(self, decisions: tuple[Decision, ...], placed: Placed) -> Lowered:
        """The hooked form of `decisions` from their placed form: each recompute decision given its region
        run (memplan.sim.regions), those none can run dropped."""
        candidates, index = placed.arrays, placed.index
        runs = self.regions.assign(candidates)
        regions, unmade, carriers = runs.regions, runs.unmade, runs.carriers
        why = placed.reason or (f"no module call can recompute storage {candidates.storage[unmade[0]]}"
                                if unmade else "")
        if unmade:
            made = np.ones(len(index), dtype=np.bool_)
            made[unmade] = False
            position = (np.cumsum(made) - 1).tolist()
            regions = {position[k]: run for k, run in regions.items()}
            carriers = [(position[k], chain) for k, chain in carriers]
            index, candidates = index[made], candidates.take(made)
        if not len(index):  # nothing left to act on
            return Lowered(level=PLAIN, arrays=candidates, source=decisions, kept=index,
                           dropped=len(decisions), reason=why)
        return Lowered(level=HOOKED, arrays=candidates, source=decisions, kept=index, regions=regions,
                       carriers=tuple(carriers), read_codes=runs.read_codes,
                       runs_of=self.regions, dropped=len(decisions) - len(index),
                       reason=why)

    def unhookable(self, a: DecisionArrays) -> np.ndarray:
        """Per decision of `a`: it cannot run at hook points at all (`_unhookable` says why)."""
        return self._moved(a)[1]

    def _moved(self, a: DecisionArrays) -> tuple[DecisionArrays, np.ndarray, np.ndarray]:
        """Every decision moved onto hook points, which of them cannot run at hook points at all
        (`_unhookable`), and which have an empty gap there (left out, the storage stays)."""
        out, back, prefetch, sync, unhookable, left = self._place(
            self._after, self._before, self._first_packed_at, self._backward, a.storage, a.recompute, a.out_after,
            a.back_before, a.prefetch_at, a.sync)
        moved = DecisionArrays(storage=a.storage, recompute=a.recompute, out_after=out, back_before=back,
                               prefetch_at=prefetch, sync=sync, ratio=a.ratio)
        return moved, unhookable, left

    def _unhookable(self, d: Decision) -> str:
        """Why `d` cannot run at hook points ("" when it can)."""
        first = self.first_pack.get(d.storage)
        if first is None:
            return f"storage {d.storage} is not a tensor autograd saves"
        if d.wraps or self.trace.ops[d.back_before].phase != "backward":
            return f"storage {d.storage} is away until op {d.back_before}, not until backward unpacks it"
        if self.trace.saved[first].packed_at > self.after(d.out_after + 1):
            return f"storage {d.storage} leaves before autograd saves it"
        return ""
