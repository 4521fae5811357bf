"""The planning problem, made once at the edge and carried through the pipeline.

A `Problem` is what every stage below the edge (planners, simulator, pool, step-program
compiler) needs to know about one iteration: the trace, the cost model on one device
profile, the cap in bytes and the seed. The edge (the CLI, `memplan.optimize`, the public
stage functions, benchmarks) makes it with `Problem.of`, the one place below which a
profile name or a budget as a user writes it is turned into values; nothing under it calls
`Cost.for_trace` or parses a budget again. Code that needs only a trace's cost gets it from
`cost_of`, the one function that prices a trace.

Stages below the edge take the Problem whole. It also keeps what is made once per trace and
cost, whatever the cap or seed (`made_once`): the simulator (memplan.sim.simulate.simulator_of),
so that a plan is simulated by one Simulator from the planner to the executor's step program.

It lives above `memplan.cost` (it holds a Cost), not in `memplan.model`, which the cost
model itself builds on. Importing it is light (no numpy), so that a command's parser can
name DEFAULT_PROFILE: the cost model is imported where a Problem is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable

from .budget import NO_LIMIT, UNLIMITED, Budget, bytes_label, limited, parse_budget

if TYPE_CHECKING:
    from .cost.model import Cost
    from .cost.profiles import DeviceProfile
    from .model import Trace

DEFAULT_PROFILE = "h100"  # the cost model's profile where none is given


@dataclass(frozen=True)
class Problem:
    """One iteration to plan: its trace, what its ops cost on a profile, the cap, the seed."""

    trace: Trace
    cost: Cost  # op durations and the device profile they are priced on
    budget_bytes: int = NO_LIMIT  # the cap (memplan.budget.NO_LIMIT: none)
    seed: int = 0  # the seed of search planners
    # What is made once for the trace and cost (the simulator), shared by the problem under every cap and seed
    # (`at`, `with_seed`); another trace or cost starts afresh (`on`)
    made: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    @classmethod
    def of(cls, trace: Trace, budget: Budget | str | int | float | None = UNLIMITED,
           profile: str | DeviceProfile = DEFAULT_PROFILE, *, seed: int = 0, cost: Cost | None = None) -> Problem:
        """The problem of `trace` under `budget` (as `memplan.budget.parse_budget` reads it) on the
        cost `profile` (a name, a profile file or a DeviceProfile), unless `cost` is given.

        Raises:
            MemplanError: a bad budget; UnknownNameError: an unknown profile.
        """
        return cls(trace, cost_of(trace, profile, cost), parse_budget(budget).bytes_for(trace.peak_load_bytes),
                   int(seed))

    @property
    def profile(self) -> DeviceProfile:
        """The device profile the costs are priced on."""
        return self.cost.profile

    @property
    def limited(self) -> bool:
        """Whether the problem has a cap."""
        return limited(self.budget_bytes)

    def made_once(self, key, make: Callable[[], object]):
        """`make()`, made the first time `key` is asked for on this trace and cost (under any cap or seed)."""
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]

    def at(self, budget_bytes: int) -> Problem:
        """The same problem under another cap (a planner trying a smaller load, a sweep)."""
        return replace(self, budget_bytes=int(budget_bytes))

    def on(self, trace: Trace, cost: Cost) -> Problem:
        """The same cap and seed on another trace and cost (a view of the trace: what is made once is made again)."""
        return replace(self, trace=trace, cost=cost, made={})

    def with_seed(self, seed: int) -> Problem:
        """The same problem with another seed."""
        return replace(self, seed=int(seed))

    def __str__(self) -> str:
        return f"{self.trace.meta.get('model', 'trace')} under {bytes_label(self.budget_bytes)} on {self.profile.name}"


def cost_of(trace: Trace, profile: str | DeviceProfile = DEFAULT_PROFILE, cost: Cost | None = None) -> Cost:
    """What the ops of `trace` cost on `profile` (a name, a profile file or a DeviceProfile); `cost`
    itself when given. The one function that prices a trace: a need for the cost alone calls it.

    Raises:
        UnknownNameError: an unknown profile.
    """
    from .cost.model import Cost  # numpy: where a trace is priced, not where the CLI parses

    return cost if cost is not None else Cost.for_trace(trace, profile)
