"""A plan prepared for the simulator's kernel at the levels it may run at (memplan.sim.lowering).

Its hooked (or plain) form, its interpreted form, and lower bounds of their peaks, each made the
first time it is needed: a search simulates one plan under many caps, and a plan whose bound
exceeds a cap is never simulated there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..budget import limited
from .decisions import DecisionArrays
from .lowering import HOOKED, INTERPRETED, PLAIN, Lowered, Placed, as_given
from .prepare import KernelInputs, Priced

CHOSEN = "planned so: its hooked form missed the budget it was made for, or ran slower"  # why Plan.level says so


@dataclass(frozen=True, kw_only=True)
class Level:
    """A plan at one level and the kernel's arrays for it."""

    lowered: Lowered  # the plan at that level (memplan.sim.lowering)
    inputs: KernelInputs  # the kernel's arrays (memplan.sim.prepare)


class Prepared:
    """One plan prepared for the kernel: its columns, its hooked (or plain) form, and its interpreted
    form, each made the first time it is needed."""

    def __init__(self, decisions: tuple, sim):
        self.decisions = decisions  # the plan's decisions (the key is their identity: kept alive here)
        self._sim = sim
        self.arrays = DecisionArrays.of(decisions)

    @cached_property
    def priced(self) -> Priced:
        """What each decision moves over the link (memplan.sim.prepare.Priced; a plan a floor rules out
        is never priced)."""
        return self._sim._prepare.priced(self.arrays)

    @cached_property
    def given(self) -> Lowered | None:
        """The plan as it runs where it has no hooked form (memplan.sim.lowering), else None."""
        sim = self._sim
        if sim.lowering is None:
            return as_given(PLAIN if not self.decisions else INTERPRETED, self.decisions, self.arrays,
                            "" if not self.decisions else "the trace has no ops to hook")
        return sim.lowering.given(self.decisions, self.arrays)

    @cached_property
    def placed(self) -> Placed:
        """Its decisions moved onto hook points (where it has a hooked form)."""
        return self._sim.lowering.place(self.decisions, self.arrays)

    @cached_property
    def lowered(self) -> Lowered:
        """The plan at the level its decisions allow (memplan.sim.lowering)."""
        return self.given or self._sim.lowering.with_regions(self.decisions, self.placed)

    @cached_property
    def first(self) -> Level:
        """The form simulated first: hooked where the plan has one, else as it runs."""
        return self._level(self.lowered)

    @cached_property
    def whole(self) -> Level | None:
        """Its hooked form with the optimizer's step run whole (no hook inside it), where its hooked form
        splits the step (memplan.tracing.stepwise), else None."""
        lowered = self.lowered
        if lowered.level != HOOKED or not lowered.sites.updates:
            return None
        whole = self._sim.whole_step_lowering.lower(self.decisions, self.arrays)
        return self._level(whole) if whole.level == HOOKED else None

    def _level(self, lowered: Lowered) -> Level:
        """`lowered` (a form of this plan) with the kernel's arrays for the decisions it runs."""
        priced = self.priced if lowered.kept is None else self.priced.take(lowered.kept)
        return Level(lowered=lowered, inputs=self._sim._prepare.inputs(lowered, priced))

    @cached_property
    def interpreted_inputs(self) -> KernelInputs:
        """The kernel's arrays of its interpreted form (`interpreted`, whose reason they do not read: a
        search simulates them without asking why, which would need the hooked form)."""
        return self._sim._prepare.inputs(as_given(INTERPRETED, self.decisions, self.arrays), self.priced)

    @cached_property
    def interpreted(self) -> Level:
        """The plan as the interpreted runner runs it, when its hooked form does not fit."""
        why = (self.placed.reason if self.given is None else "") or self.lowered.reason
        lowered = as_given(INTERPRETED, self.decisions, self.arrays,
                           f"its hooked form does not fit ({why or 'later hook points'})")
        return Level(lowered=lowered, inputs=self.interpreted_inputs)

    @cached_property
    def chosen(self) -> Level:
        """The plan run interpreted because its planner chose that (`Plan.level`)."""
        why = self.placed.reason or self.lowered.reason
        lowered = replace(self.interpreted.lowered, reason=f"{CHOSEN} ({why or 'actions at later hook points'})")
        return Level(lowered=lowered, inputs=self.interpreted.inputs)

    def hooked_cannot_fit(self, budget: int) -> bool:
        """True when the plan has a hooked form that surely cannot run under `budget` (a lower bound of its
        peak, which no timing lowers, exceeds it: first before its region runs are chosen, then after):
        then it runs interpreted, and only that is simulated."""
        if self.given is not None or not limited(budget):
            return False
        return (self.placed_floor > budget or self._unrun_over(budget)
                or (self.lowered.level == HOOKED and self.lowered_floor > budget))

    def _unrun_over(self, budget: int) -> bool:
        """`unrun_floor` exceeds `budget` (not computed where it cannot: leaving a decision out adds at
        most its storage's bytes to the load at any op)."""
        never = self.never_run
        if not never.any():
            return False
        placed = self.placed.arrays
        return (self.placed_floor + int(self._sim.trace.nbytes[placed.storage[never]].sum()) > budget
                and self.unrun_floor > budget)

    @cached_property
    def never_run(self) -> np.ndarray:
        """Per placed decision: a recompute decision no module call can run in any plan (memplan.sim.regions)."""
        return self._sim.lowering.regions.never_run(self.placed.arrays)

    def cannot_fit(self, budget: int, chosen: str = "") -> bool:
        """True when no level the plan could run at fits `budget` (a lower bound of its peak there exceeds
        it): its own level where it has one (`Plan.level`), else neither its hooked form (above) nor its
        interpreted one. The interpreted form's bound decides that alone: the hooked form's is at least as
        high (`placed_floor`), so where that one exceeds the budget, so does the hooked form's; and where the
        plan has no hooked form, so does its bound with its replay chains (`replayed_floor`)."""
        if not limited(budget):
            return False
        if chosen and self.given is None and chosen != INTERPRETED:
            return self.placed_floor > budget or (self.lowered.level == HOOKED and self.lowered_floor > budget)
        if self.interpreted_floor > budget:
            return True
        given = self.given
        return given is not None and given.level == INTERPRETED and self.replayed_floor > budget

    @cached_property
    def placed_floor(self) -> int:
        """A lower bound of its hooked form's peak before its region runs are chosen (memplan.sim._events.floor_load);
        never below `interpreted_floor`: placing a decision on hook points only narrows the ops its storage
        is away at, or drops it (memplan.sim._events.place_decisions), and a gap that wraps, which that
        bound counts away over the storage's whole life, holds every narrower one."""
        return self._sim._prepare.floor_bytes(self.placed.arrays)

    @cached_property
    def unrun_floor(self) -> int:
        """`placed_floor` without the decisions no module call can run in any plan (memplan.sim.regions),
        which its hooked form drops: a bound its region runs need not be chosen for. Where the hooked form
        runs some decision, its peak's bound (`lowered_floor`) is at least this one (fewer decisions away,
        more memory), and where it runs none, it is the plain run, whose bound (the trace's peak) is too;
        0 where every decision is such (the plain run is then bounded by `lowered`'s level alone)."""
        never = self.never_run
        if never.all():
            return 0
        return self._sim._prepare.floor_bytes(self.placed.arrays.take(~never)) if never.any() else self.placed_floor

    @cached_property
    def lowered_floor(self) -> int:
        """The same with its region runs' memory."""
        return self._sim._prepare.floor_bytes(self.lowered.arrays, self.lowered.carriers)

    @cached_property
    def interpreted_floor(self) -> int:
        """A lower bound of its peak as planned (interpreted)."""
        return self._sim._prepare.floor_bytes(self.arrays)

    @cached_property
    def replayed_floor(self) -> int:
        """The same with its replay chains' memory (memplan.sim.chains), which its interpreted form's kernel
        arrays are made from: a search asks it before those are made, and a plan over the budget by it is
        not simulated interpreted (most plans a search finds not to fit are so: on resnet50@256 at 1/3, all
        4,006 of home:fast's that `interpreted_floor` let through)."""
        prepare = self._sim._prepare
        return prepare.floor_bytes(self.arrays, chains=prepare.replays(self.arrays).arrays)
