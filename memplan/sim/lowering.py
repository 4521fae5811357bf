"""Lower a plan onto what the executor can act on without interpreting every op.

Lower the plan, do not interpret it (docs/executor.md, "How it runs"). A plan runs at one of three
levels, fixed by its decisions alone (and by its planner where it chose the interpreted one:
`Plan.level`), which the simulator simulates and the executor runs:

- plain: no decision; nothing is installed in the step.
- hooked: the decisions that can run at the sites of the step (memplan.model.hooksites: a storage
  an owner holds, or one autograd saved and away until backward; the others are left out, kept
  resident, and the reason names the first). The executor (memplan.exec.hooked)
  acts only at those hooks and recomputes by running a module call again (a region) as ordinary
  PyTorch. So the plan is moved onto the sites' points: a swap-out or drop after op i happens at
  the first point at or after i + 1, a prefetch at the last one at or before its trigger, a
  recomputation at the last one at or before its op (a gap left empty is dropped: the storage
  stays). Recompute decisions due at one point are run by module calls as memplan.sim.regions
  chooses them; a decision none can run is dropped (kept resident): `dropped` counts them. The
  sites its program needs, and what their hooks cost the host, are `Lowered.sites`.
- interpreted: the dispatch-mode runner (memplan.exec.interpreted) acts before and after every op and
  recomputes by replaying ops (memplan.sim.chains): for micro-batched convolutions, a trace without
  hook records, and where the planner chose it (`Plan.level`: no plan of its hooked form fits, or
  it runs slower; memplan.planners.base.hooks_fit).

The simulator simulates the lowered plan, so what it predicts is what the executor runs. Plans
are lowered as columns (memplan.sim.decisions); the moved Decisions are made only when asked for
(`Lowered.decisions`: the step program needs them, a search does not).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..model import Decision, Trace
from ..model.hooksites import HookSites, Installed
from ..model.program import HOOKED, INTERPRETED, PLAIN, RegionRun
from .chains import Chain
from .decisions import DecisionArrays
from .arrays import producer_ids
from .regions import NOTHING, Assigned, Regions


@dataclass(frozen=True, kw_only=True, eq=False)
class Lowered:
    """A plan's decisions at the level the executor runs them."""

    level: str  # one of memplan.model.program.LEVELS
    arrays: DecisionArrays  # the decisions as columns; hooked: moved onto hook points
    source: tuple[Decision, ...]  # the plan's decisions
    kept: np.ndarray | None = None  # hooked: the positions in `source` of the decisions run (None: all, unmoved)
    assigned: Assigned = NOTHING  # hooked: the region runs of its recompute decisions (memplan.sim.regions)
    runs_of: Regions | None = None  # hooked: the regions it was lowered with (its `holds` come from them)
    dropped: int = 0  # hooked: decisions left out (kept resident): no hook point or region runs them
    reason: str = ""  # why the first dropped decision was, or why the plan is interpreted
    whole_step: bool = False  # hooked: lowered without the hooks inside the optimizer's step (Simulator.whole_step_lowering)

    @property
    def regions(self) -> dict[int, RegionRun]:
        """Hooked: recompute decision -> its run."""
        return self.assigned.regions

    @property
    def carriers(self) -> list[tuple[int, Chain]]:
        """Hooked: (decision, chain) of the decision that carries each run's time and memory."""
        return self.assigned.carriers

    @property
    def read_codes(self) -> np.ndarray:
        """Hooked: sorted op * storages + storage of what the runs due at op read."""
        return self.assigned.read_codes

    @cached_property
    def sites(self) -> Installed | None:
        """Hooked: the sites its program needs (memplan.model.hooksites; made when first asked for)."""
        if self.level != HOOKED:
            return None
        a, sites = self.arrays, self.runs_of.sites
        points = np.concatenate([a.out_after + 1, a.prefetch_at, sites.before_of[a.back_before]])
        return sites.installed(points, np.unique(a.storage), {run.call for run in self.regions.values()})

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
    reason: str  # why the first decision no site can run cannot ("" when all can)


def as_given(level: str, decisions: tuple[Decision, ...], arrays: DecisionArrays, reason: str = "") -> Lowered:
    """`decisions` run as planned at `level` (interpreted, or plain without decisions)."""
    return Lowered(level=level, arrays=arrays, source=decisions, reason=reason)


class Lowering:
    """Lowers plans of one trace (per-trace facts are computed once; search planners lower many)."""

    def __init__(self, trace: Trace, durations: np.ndarray, place_decisions, whole_step: bool = False):
        self.trace = trace
        self.whole_step = whole_step  # its trace was left without update marks: the optimizer's step runs whole
        self._place = place_decisions  # memplan.sim._events.place_decisions, compiled or interpreted
        self.sites = HookSites(trace)
        self.points = self.sites.points
        self.regions = Regions(trace, durations, self.sites, producer_ids(trace))

    # --- points ------------------------------------------------------------------------------

    def after(self, point: int) -> int:
        """The first hook point at or after `point`."""
        return self.sites.after(point)

    def before(self, point: int) -> int:
        """The last hook point at or before `point`."""
        return self.sites.before(point)

    # --- plans -------------------------------------------------------------------------------

    def lower(self, decisions: tuple[Decision, ...], arrays: DecisionArrays | None = None) -> Lowered:
        """`decisions` at the level they run (`arrays`: their columns, when at hand)."""
        decisions = tuple(decisions)
        arrays = DecisionArrays.of(decisions) if arrays is None else arrays
        return self.given(decisions, arrays) or self.with_regions(decisions, self.place(decisions, arrays))

    def given(self, decisions: tuple[Decision, ...], arrays: DecisionArrays) -> Lowered | None:
        """`decisions` as they run where they have no hooked form (plain without decisions, else
        interpreted, the reason naming why), None where they have one."""
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
        """The decisions of a plan with a hooked form (`given` is None) moved onto hook points, those no
        site can run left out (`reason` names the first)."""
        moved, left = self._moved(arrays)
        unhooked = self.unhookable(arrays)
        index = np.flatnonzero(~unhooked & ~left)
        return Placed(arrays=moved.take(index), index=index,
                      reason=self.sites.reason(decisions[int(np.argmax(unhooked))]) if unhooked.any() else "")

    def with_regions(self, decisions: tuple[Decision, ...], placed: Placed) -> Lowered:
        """The hooked form of `decisions` from their placed form: each recompute decision given its region
        run (memplan.sim.regions), those none can run dropped."""
        candidates, index = placed.arrays, placed.index
        runs = self.regions.assign(candidates)
        unmade = runs.unmade
        why = placed.reason or (f"no module call can recompute storage {candidates.storage[unmade[0]]}"
                                if unmade else "")
        if unmade:
            made = np.ones(len(index), dtype=np.bool_)
            made[unmade] = False
            runs = runs.without_unmade(len(index))
            index, candidates = index[made], candidates.take(made)
        if not len(index):  # nothing left to act on
            return Lowered(level=PLAIN, arrays=candidates, source=decisions, kept=index,
                           dropped=len(decisions), reason=why)
        return Lowered(level=HOOKED, arrays=candidates, source=decisions, kept=index, assigned=runs,
                       runs_of=self.regions, dropped=len(decisions) - len(index), reason=why, whole_step=self.whole_step)

    def unhookable(self, a: DecisionArrays) -> np.ndarray:
        """Per decision of `a`: it cannot run at hook points at all (memplan.model.hooksites says why)."""
        return self.sites.unhooked(a.storage, a.recompute, a.out_after, a.back_before)

    def _moved(self, a: DecisionArrays) -> tuple[DecisionArrays, np.ndarray]:
        """Every decision moved onto hook points, and which have an empty gap there (left out, the storage stays)."""
        out, back, prefetch, sync, left = self._place(
            self.sites.after_of, self.sites.before_of, a.recompute, a.out_after, a.back_before, a.prefetch_at, a.sync)
        moved = DecisionArrays(storage=a.storage, recompute=a.recompute, out_after=out, back_before=back,
                               prefetch_at=prefetch, sync=sync, ratio=a.ratio)
        return moved, left
