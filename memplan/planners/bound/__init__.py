"""A proven lower bound on the simulated overhead of every plan of swaps and recomputations at a
budget: the optimum of a linear program that every such plan satisfies (`memplan.planners.bound.lp`).

What it bounds: the overhead `memplan.sim.simulate` reports for any plan of keep / swap /
recompute decisions that the validator accepts and whose simulated peak fits the budget, on the
same trace and cost model (op durations, copy latency and bandwidth of the profile). Plans that
compress a swapped storage or split convolutions into micro-batches change the op times or the
bytes copied and are not covered.

What the LP knows of the simulator (each a consequence of its semantics, `memplan.sim.simulate`):
- while op i runs, every storage its lifetime holds there is resident, unless a decision has it
  away (released after its swap-out, not yet prefetched; or dropped, not yet recomputed), so the
  bytes away at i are at least the trace's load there minus the budget;
- a storage is away only inside one of its gaps (`memplan.planners.bound.absences`), its swap-out
  copied after the start of the gap's first op and before i starts, its prefetch copied after i
  ends and before the gap's last op starts, each device-host direction one copy at a time (a
  storage away at the step's start, across the boundary, was copied out after its last access in
  the previous iteration, one step earlier: a swap-out at the step's end is carried over);
- a recomputation replays at least its storage's producer op, once per op it is due at however
  many storages it rebuilds there, on the compute stream after the ops it is away at;
- a chain allocates its target and the inputs it rebuilds when it starts, so where those and what the
  op it runs at reads exceed the budget wherever it can run, it has not recomputed its storage away
  (`memplan.planners.bound.absences`);
- every op runs for its duration, in order; every wait and replay delays all later ops.
Where the cost model prices the host's work (a traced PyTorch step: `Cost.priced_host`), the host
issues every op and action one after another, ahead of the device (`host_floor`: the least work
every plan that fits at a level pays: that executor's per op). Every plan that fits runs hooked or
interpreted, so the plans of each level are bounded apart and the bound is the lesser
(memplan.planners.bound.levels): the interpreted ones with every storage movable and the dispatch
mode's work on every op, the hooked ones with the hooked executor's work and a storage away only
where a hook point can run its decision (`HookedAway`); only the interpreted ones where even with
everything a hooked plan could have away at some op over the budget it stays over it
(`hooks_cannot_fit`). The LP then also knows (`memplan.planners.bound.lp`, its host rows) that no
op starts before the host has issued it, every op before it and the actions, runs and hooks issued
among them, and that the step ends no earlier than the host's work for every op plus the actions of
every storage away at some check op (four a swap, two a recomputation), a recomputation's run for
each stretch between check ops that must hold one, and, for the plans run hooked, the pack hooks of
what they move. Each level's
bound is the larger of its LP's step and the host's work with the `least_actions` of what the
neediest check op needs away (integral, where the LP's shares are not: four actions a storage only
a swap can take away, two one a recomputation can; of the storages the op does not access), over
the plain step with the host's work.
What it leaves out (so the bound is lower than the optimum): integrality (a share of a storage
can be away), the memory a recomputation needs beyond its chain's (above), where between a gap's ends a
replay runs, the steady state across the iteration boundary, and memory rows and lane cuts at
ops other than the `check_ops` it picks (at most `max_checks` of the ops over the budget, the
most loaded one of each stretch). Any subset of the rows bounds from below; more rows, a tighter
bound and a larger LP.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import vstack

from ...cost.model import Cost
from ...model import Trace
from ...model.program import HOOKED, INTERPRETED
from ...sim.arrays import host_per_op
from ...sim.simulate import Simulator
from .absences import MS, absences
from .levels import HookedAway
from .lp import BoundLP, HostFloor
from ..kit.linear import MIB

log = logging.getLogger(__name__)

DEFAULT_CHECKS = 64  # ops with memory rows and lane cuts at most (the most loaded of as many stretches)
FIRST_CHECKS = 4  # the first LP's; each next one has twice as many
# An LP this small is solved again with its large single storages whole (resnet18-cifar@128's first
# LPs, about 4,100 columns: at 70% and 50% 9.8 -> 11.0% and 17.1 -> 18.1%, the larger LPs' bounds the same)
MIP_MAX_VARIABLES = 6000
# ... in at most this share of the time left: the LPs with more check ops after it bound tighter more often
# (vgg16@64 at 50%: 8 check ops held whole gave 7.2% in 38 s, 64 check ops' LP 56% in 11 s)
WHOLE_SHARE = 0.25
DEFAULT_TIME_LIMIT_S = 120.0
OPTIMAL = 0  # linprog's status for an optimum
INFEASIBLE = 2  # linprog's status for an infeasible LP: no plan fits the budget
SAFETY_MS = 1e-4  # taken off the optimum (ms): more than HiGHS' feasibility tolerances (1e-7 per row) can move it
SCOPE = ("a lower bound on the simulated overhead of every valid plan of swaps and recomputations that fits the "
         "budget (no compression, no micro-batched convolutions), under this trace's cost model (the host's work "
         "priced where it is, as the plain step's share of it)")


@dataclass(frozen=True, kw_only=True)
class Bound:
    """The lower bound and how it was found."""

    overhead: float | None  # proven lower bound on the overhead (inf: no plan fits; None: the LP did not finish)
    status: str  # "optimal", "no plan fits", "nothing to move", or why there is no bound
    seconds: float  # wall-clock seconds to build and solve the LP
    check_ops: int  # ops with memory rows and lane cuts
    units: int  # LP units (storages that may be away, merged by gap)
    variables: int  # LP columns
    constraints: int  # LP rows
    # (storage, out_after, back_before) of a single storage's gap -> its largest shares away swapped and
    # recomputed in the LP's solution: where the LP keeps what away (a guide for a search to start from)
    away: dict = field(default_factory=dict)

    def report(self) -> dict:
        """The bound as a plan report's entries (`bound`, `bound_status`, ...)."""
        return {"bound": self.overhead, "bound_status": self.status, "bound_s": round(self.seconds, 3),
                "bound_checks": self.check_ops, "bound_scope": SCOPE}


def lower_bound(trace: Trace, budget_bytes: int, cost: Cost, *, time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                max_checks: int = DEFAULT_CHECKS) -> Bound:
    """The best proven bound on the simulated overhead of every valid plan within `budget_bytes`
    that the LPs solved within `time_limit_s` give: with FIRST_CHECKS check ops, then twice as many
    while time is left (up to `max_checks`), each solved again with its large single storages whole
    (HiGHS' branch and bound, its dual bound) when it is small. Each is a bound; the best is kept.

    Args:
        trace, budget_bytes, cost: the problem, as a planner gets it.
        time_limit_s: wall-clock limit for making and solving the LPs (overhead None when not even the first
            one is solved in it).
        max_checks: at most this many ops get memory rows and lane cuts.
    """
    started = time.perf_counter()
    baseline_ms = MS * float(np.sum(cost.durations))
    if not (trace.load > budget_bytes).any() or baseline_ms <= 0:
        return Bound(overhead=0.0, status="nothing to move", seconds=time.perf_counter() - started, check_ops=0,
                     units=0, variables=0, constraints=0)
    host_levels = _levels(trace, budget_bytes, cost)
    if len(host_levels) == 1:  # one LP bounds every plan
        found = _level_bound(trace, budget_bytes, cost, host_levels[0], None, time_limit_s, max_checks, baseline_ms)
        return replace(found, seconds=time.perf_counter() - started)
    # Every plan, with every storage movable and the hooked executor's work (the lesser), in half the
    # time: the bound where the levels' LPs do not both finish in the rest.
    every = _level_bound(trace, budget_bytes, cost, HOOKED, None, time_limit_s / 2, max_checks, baseline_ms)
    apart = []
    for level, hooked in ((HOOKED, HookedAway(trace)), (INTERPRETED, None)):
        left = (started + time_limit_s - time.perf_counter()) / (2 - len(apart))
        apart.append(_level_bound(trace, budget_bytes, cost, level, hooked, left, max_checks, baseline_ms))
    if every.overhead is not None and all(b.overhead is not None for b in apart):
        least = min(apart, key=lambda b: b.overhead)
        every = least if least.overhead > every.overhead else every
    return replace(every, seconds=time.perf_counter() - started)


def _levels(trace: Trace, budget_bytes: int, cost: Cost) -> list[str | None]:
    """The executors whose host work bounds the plans that fit (memplan.planners.bound.levels): none
    where the host's work is not priced (the levels then differ only in what the hooked one can move,
    so one LP over every storage is the lesser), only the interpreted one where no hooked plan fits."""
    if not cost.priced_host:
        return [None]
    return [INTERPRETED] if not trace.saved or hooks_cannot_fit(trace, budget_bytes) else [HOOKED, INTERPRETED]


def _level_bound(trace: Trace, budget_bytes: int, cost: Cost, level: str | None, hooked: HookedAway | None,
                 time_limit_s: float, max_checks: int, baseline_ms: float) -> Bound:
    """The best bound that the LPs solved within `time_limit_s` give, with `level`'s host work (None:
    none priced) and storages away only where `hooked` lets them be (None: anywhere): with
    FIRST_CHECKS check ops, then twice as many while time is left (up to `max_checks`)."""
    deadline = time.perf_counter() + time_limit_s
    host = host_floor(trace, cost, level, hooked)
    best, checks = None, min(FIRST_CHECKS, max_checks)
    while True:
        found = _bound(trace, budget_bytes, cost, checks, deadline - time.perf_counter(), baseline_ms, host, hooked,
                       interpreted=level == INTERPRETED)
        log.info("bound (%s host, %s) with %d check ops: %s (%s) in %.1f s", level or "no", "hooked moves" if hooked
                 else "every move", found.check_ops, found.overhead, found.status, found.seconds)
        best = found if best is None or _better(found, best) else best
        if found.overhead in (None, float("inf")) or checks >= max_checks or found.check_ops < checks or \
                time.perf_counter() >= deadline:
            break
        checks = min(2 * checks, max_checks)
    return _with_host(best, trace, cost, budget_bytes, baseline_ms, host)


def host_floor(trace: Trace, cost: Cost, level: str | None, hooked: HookedAway | None = None) -> HostFloor | None:
    """The least host work of every plan that fits at `level` (None where the cost model prices no
    host work): the executor's per op there, its actions, and its recomputations' runs. With `hooked`
    the plans bounded run hooked, and pay the pack hooks of what they move; at HOOKED without it they
    run at either level (the hooked executor's work per op the lesser).

    A recomputation's run costs the host, beyond issuing each op it replays again (memplan.sim.prepare),
    a region's work where it runs hooked (once per module call run) and the dispatch mode's replay of
    each op where it runs interpreted (a chain replays one op at least): so `run_ms` per run and
    `replayed_op_ms` per op replayed are both sound, however the runs share their ops."""
    if not cost.priced_host:
        return None
    region, replay = cost.executor_s("region"), cost.executor_s("replay_op")
    either = level == HOOKED and hooked is None
    run_s = min(region, replay) if either else region if level == HOOKED else replay
    return HostFloor(per_op_ms=MS * host_per_op(trace, cost)[level], action_ms=MS * cost.executor_s("action"),
                     run_ms=MS * run_s, replayed_op_ms=MS * cost.host_op_s,
                     hook_call_ms=MS * cost.executor_s("hook_call"), sites=None if hooked is None else hooked.sites)


def _with_host(found: Bound, trace: Trace, cost: Cost, budget_bytes: int, baseline_ms: float,
               host: HostFloor | None) -> Bound:
    """`found` (a bound on the step over the plain step's device time) as a bound on the overhead
    over the plain step the simulator runs with the host's work priced (module docstring)."""
    if host is None or found.overhead is None or not math.isfinite(found.overhead):
        return found
    plain_ms = MS * Simulator(trace, cost).run(None).time_s
    ops = np.append(check_ops(trace.load, budget_bytes, DEFAULT_CHECKS), trace.peak_op)
    host_ms = float(host.per_op_ms.sum()) + host.action_ms * least_actions(trace, budget_bytes, ops) - SAFETY_MS
    step_ms = max((1.0 + found.overhead) * baseline_ms, host_ms)
    return replace(found, overhead=max(0.0, step_ms / plain_ms - 1.0))


def hooks_cannot_fit(trace: Trace, budget_bytes: int) -> bool:
    """Whether every plan that fits must move a storage no hook moves there (which only the
    interpreted executor does): at some op over the budget, the load is still over it with every
    storage a hooked plan could have away there away (memplan.planners.bound.levels.HookedAway)."""
    hooked = HookedAway(trace)
    for i in np.flatnonzero(trace.load > budget_bytes):
        movable = np.flatnonzero(_movable_at(trace, int(i)))
        away = movable[hooked.at(int(i), movable)]
        if int(trace.load[i]) - int(trace.nbytes[away].sum()) > budget_bytes:
            return True
    return False


def fewest_away(trace: Trace, budget_bytes: int, ops: np.ndarray) -> int:
    """The fewest storages any plan that fits has away at one of `ops`: as many of the largest ones
    alive there that the op does not access (those it reads or writes are resident while it runs: no
    decision's gap holds an access) as it takes to bring the op's load within the budget."""
    fewest = 0
    for i in ops:
        need = int(trace.load[i]) - budget_bytes
        if need > 0:
            largest_first = np.cumsum(np.sort(trace.nbytes[_movable_at(trace, int(i))])[::-1])
            fewest = max(fewest, int(np.searchsorted(largest_first, need)) + 1)
    return fewest


def least_actions(trace: Trace, budget_bytes: int, ops: np.ndarray) -> int:
    """The fewest executor actions any plan that fits takes for what it has away at one of `ops`: each
    storage away there is a decision's, two actions a recomputation and four a swap (memplan.sim._events),
    and one the trace cannot recompute is swapped. Exact per op: for each number of the storages that
    only swap, the largest of them and as few of the largest recomputable ones as bring the op within the
    budget (of the storages alive there that it does not access: those are resident while it runs)."""
    least = 0
    for i in ops:
        need = int(trace.load[i]) - budget_bytes
        if need <= 0:
            continue
        ids = np.flatnonzero(_movable_at(trace, int(i)))
        again = np.array([trace.recomputable(int(s)) for s in ids], dtype=np.bool_)
        swapped = np.concatenate([[0], np.cumsum(np.sort(trace.nbytes[ids[~again]])[::-1])])
        rebuilt = np.cumsum(np.sort(trace.nbytes[ids[again]])[::-1])
        best = None
        for k, covered in enumerate(swapped.tolist()):
            left = need - covered
            m = 0 if left <= 0 else int(np.searchsorted(rebuilt, left)) + 1
            if m <= len(rebuilt):
                best = min(best if best is not None else 4 * k + 2 * m, 4 * k + 2 * m)
            if left <= 0:
                break
        # no set of them covers the op: no plan fits (the LP says so); count them all
        least = max(least, best if best is not None else 4 * len(swapped) + 2 * len(rebuilt))
    return least


def _movable_at(trace: Trace, i: int) -> np.ndarray:
    """bool per storage: alive at op `i` and not accessed by it (what a plan may have away there: those
    it reads or writes are resident while it runs, no decision's gap holding an access)."""
    movable = (trace.alloc_ops <= i) & (trace.free_ops > i)
    op = trace.ops[i]
    movable[list(op.reads) + list(op.writes)] = False
    return movable


def _better(a: Bound, b: Bound) -> bool:
    return a.overhead is not None and (b.overhead is None or a.overhead > b.overhead)


def _bound(trace: Trace, budget_bytes: int, cost: Cost, checks: int, time_limit_s: float, baseline_ms: float,
           host: HostFloor | None, hooked: HookedAway | None = None, interpreted: bool = False) -> Bound:
    """The LP's bound with `checks` check ops (units where `hooked` lets them be away, when given; a
    recomputation replaying what its level's does, `interpreted` or hooked: memplan.planners.bound.absences),
    tightened by branch and bound when the LP is small."""
    started = time.perf_counter()
    check = check_ops(trace.load, budget_bytes, checks)
    units = absences(trace, cost, check, hooked=hooked, interpreted=interpreted, budget_bytes=budget_bytes)
    lp = BoundLP(MS * np.asarray(cost.durations, dtype=np.float64), trace.load - budget_bytes, check, check, units,
                 host)
    result = _solve(lp, time_limit_s - (time.perf_counter() - started))  # making the LP took part of the limit
    if result is None:
        overhead, status = None, "time limit reached while making the LP"
    elif result.status == OPTIMAL:
        overhead, status = max(0.0, float(result.fun) - SAFETY_MS) / baseline_ms, "optimal"
        left = time_limit_s - (time.perf_counter() - started)
        if len(lp.c.lb) <= MIP_MAX_VARIABLES and left > 0:
            whole = _solve_whole(lp, WHOLE_SHARE * left)
            if whole is not None and whole - SAFETY_MS > overhead * baseline_ms:
                overhead, status = (whole - SAFETY_MS) / baseline_ms, "optimal with large storages whole"
    elif result.status == INFEASIBLE:
        overhead, status = float("inf"), "no plan fits"
    else:
        overhead, status = None, result.message.strip()
    return Bound(overhead=overhead, status=status, seconds=time.perf_counter() - started, check_ops=len(check),
                 units=len(units), variables=len(lp.c.lb), constraints=len(lp.c.rows),
                 away=_away(lp, result.x) if result is not None and result.status == OPTIMAL else {})


def _away(lp: BoundLP, x: np.ndarray) -> dict:
    """Bound.away of the LP's solution `x`."""
    return {(u.storages[0], u.release, u.due): (float(x[xs].max()), float(x[ys].max()) if ys is not None else 0.0)
            for u, xs, ys in zip(lp.units, lp.x, lp.y) if u.members == 1 and u.release is not None and u.due is not None}


def check_ops(load: np.ndarray, budget_bytes: int, max_checks: int) -> np.ndarray:
    """The ops over the budget, or when more than `max_checks`, the most loaded op of each of
    `max_checks` stretches of them (consecutive in op order, as many ops each)."""
    over = np.flatnonzero(load > budget_bytes)
    if len(over) <= max_checks:
        return over
    return np.unique([int(part[np.argmax(load[part])]) for part in np.array_split(over, max_checks)])


def _solve(lp: BoundLP, time_limit_s: float):
    """linprog (HiGHS' interior point method, then crossover) on the LP: minimise the overhead (None
    with no time left)."""
    if time_limit_s <= 0:
        return None
    c = lp.c
    matrix = c.matrix().tocsr()
    lower, upper = np.array(c.row_lb), np.array(c.row_ub)
    has_upper, has_lower = np.isfinite(upper), np.isfinite(lower)
    objective = np.zeros(len(c.lb))
    objective[lp.end] = 1.0
    return linprog(objective, A_ub=vstack([matrix[has_upper], -matrix[has_lower]]).tocsr(),
                   b_ub=np.concatenate([upper[has_upper], -lower[has_lower]]),
                   bounds=np.column_stack([c.lb, c.ub]), method="highs-ipm",
                   options={"time_limit": max(time_limit_s, 1e-3)})


def _solve_whole(lp: BoundLP, time_limit_s: float) -> float | None:
    """HiGHS' dual bound (ms) on the LP with every single storage of at least a MiB away whole (0 or 1
    at each op): a bound too, since a storage is away or not (None when HiGHS has none in time)."""
    c = lp.c
    integral = np.zeros(len(c.lb))
    for u, x, y in zip(lp.units, lp.x, lp.y):
        if u.members == 1 and u.nbytes >= MIB:
            integral[x] = 1
            if y is not None:
                integral[y] = 1
    objective = np.zeros(len(c.lb))
    objective[lp.end] = 1.0
    result = milp(objective, integrality=integral, bounds=Bounds(c.lb, c.ub),
                  constraints=LinearConstraint(c.matrix(), c.row_lb, c.row_ub),
                  options={"time_limit": max(time_limit_s, 1e-3), "disp": False})
    bound = getattr(result, "mip_dual_bound", None)
    return None if bound is None or not np.isfinite(bound) else float(bound)
