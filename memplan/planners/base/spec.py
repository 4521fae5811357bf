"""What a registered planner is: its name, function, what it decides and its parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...model import Plan

PlannerFn = Callable[..., Plan]
DECIDES = ("swap", "recompute", "pool", "microbatch")  # what a planner may decide
ABOUT_OPS = ("swap", "recompute", "microbatch")  # decisions that need ops (a pool-only trace has none)


@dataclass(frozen=True)
class Param:
    """One planner parameter: its name, type (from the annotation) and default."""

    name: str  # keyword name
    type: type  # int, float, bool, str or ByteSize; object when unannotated
    default: object  # the default value


@dataclass(frozen=True)
class PlannerSpec:
    """One registered planner name."""

    name: str  # e.g. "autoswap:bo"
    fn: PlannerFn  # the planning function
    defaults: dict  # fixed keyword arguments this name passes (e.g. the variant)
    summary: str  # one line for `memplan planners`
    decides: frozenset  # a subset of DECIDES
    params: tuple[Param, ...]  # what a user may set
    # it keeps, of the plans it tries, the one the simulator runs fastest at the level each runs at
    # (auto): planning it again under a smaller load for its hooked form would only repeat its search
    simulated: bool = False

    @property
    def needs_ops(self) -> bool:
        """True when it decides something about ops, so a pool-only trace cannot be planned by it."""
        return bool(self.decides & set(ABOUT_OPS))

    def describe(self) -> dict:
        """The JSON-ready record `memplan planners --json` prints."""
        return {"name": self.name, "summary": self.summary, "decides": sorted(self.decides),
                "params": {p.name: {"type": p.type.__name__, "default": p.default} for p in self.params}}
