"""Where a valid plan can take a storage away, and the least that being away costs: the units of
the lower bound's LP (`memplan.planners.bound`).

A valid plan (`memplan.sim.validate`) takes a storage away only strictly between two ops that do
not access it, inside its lifetime: a decision's gap (out_after, back_before) holds no access, so
an op `i` where the storage is away lies in one *gap* of the storage: between its last access (or
its allocation) before `i` and its next access (or its last op alive) after `i`. A swap making it
away at `i` copied it out after that last access started (an `overlap` copy starts beside it) and
before `i` started, and copies it back after `i` ended and before that next access starts; a
recomputation making it away at `i` replays at least its producer op between `i` and that access.

What a recomputation replays at least depends on the level of the plans bounded:
- interpreted (a chain of ops, memplan.sim.chains): its lineage's ops, and recursively those of
  every input the trace itself holds at no op of the gap (freed before it, or made after it: no plan
  makes such an input resident, so the chain rebuilds it), to the depth the simulator follows: its
  *closure*. A gradient's closure reaches back through the backward (and the forward where an input
  of it was freed): on vgg16@64 the LP priced recomputing the classifier's 392 MiB gradient at its
  one matrix product, 0.3 ms;
- hooked (a module call run again, memplan.sim.regions): only where a module call makes and saves
  it (`HookedAway.rebuildable`: a site finds a storage to recompute by its first pack,
  memplan.model.hooksites, and runs a call that saves it), and then at least the ops from the start
  of the innermost such call to that pack (`HookedAway.replays`: a residual block's second
  convolution output is rebuilt by running the block again, its first convolution too);
- both (one LP over every plan): the producer where a saved storage may be run again by a module
  call, its closure where it is never saved (only the interpreted executor recomputes it).
The storages rebuilt before one op replay each op once however many of them need it, so each op's
duration is shared out over every storage that counts it, by bytes: the storages rebuilt at one op
pay at most the ops they replay together. That share is small where many storages count an op that
few are rebuilt by, so each unit also names the ops every recomputation of it replays wherever it
runs (`replays`: at its first op, a subset of those at later ones), and the LP replays each of those
once at least in the step when any share of the unit is recomputed (memplan.planners.bound.lp).

A chain also needs memory: the simulator allocates a chain's target and every input it rebuilds when
it starts (memplan.sim.chains), before the op it runs at allocates its outputs. Every storage the
closure rebuilds (the trace holds it at no op from the recomputation's earliest op on) is rebuilt by
every chain of it, and none of them is in the op's load; what that op reads and no plan can recompute
is resident then (read, so in no gap: copied back already). So where, at every op the chain could
run at (after the op it is away at, up to its gap's end), those storages, the target and the rebuilt
inputs exceed the budget, no plan that fits recomputes it away at that op (`recompute_share` 0 there):
on vgg16@64 at 50%, the classifier's gradient away in the late backward would rebuild every feature
map of the forward that the backward has freed.

A persistent storage's gap across the iteration boundary is two units: its *tail* (after its last
access: a swap-out in this iteration, its prefetch in the next one's head or in this tail) and its
*head* (before its first access: the prefetch of a storage that starts the iteration on the host;
its swap-out was in the previous iteration, after its last access there: `copied_after`).

Units of the same storages-free description (same gap ends and role) are merged into one of their
total bytes: a share of those bytes away costs at least that share of their copy time (their
latencies counted per largest member) or of their cheapest recomputation per byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...cost.model import Cost
from ...model import Trace
from ...model.hookpoints import first_packs
from ...sim.chains import MAX_CHAIN_DEPTH
from ..kit.gaps import alive_at
from .levels import HookedAway

MS = 1e3  # the LP's time unit: milliseconds per second
MERGE_BELOW = 2**20  # smaller storages with the same gap are one unit


@dataclass(frozen=True, kw_only=True, eq=False)
class Absence:
    """One LP unit: storages that may be away at `ops`, with what that costs at least."""

    nbytes: int  # total bytes
    members: int  # storages merged into it (1: its shares away are 0 or 1)
    ops: np.ndarray  # the check ops (over the budget) where they may be away, ascending
    release: int | None  # their swap-out starts no earlier than this op's start (None: not in this iteration)
    due: int | None  # their prefetch lands before this op starts (None: not in this iteration)
    d2h_ms: float  # copying all of them out, at least
    h2d_ms: float  # copying all of them back, at least
    recompute_share: np.ndarray  # per op of `ops`: share of `nbytes` a recomputation can have away there (0: none)
    recompute_ms: np.ndarray  # per op of `ops`: recomputing all `nbytes` away there (or later) at their
    # cheapest rate, at least (scaled by the share taken)
    fewest: float  # storages away per whole share away, at least (its bytes over its largest storage's)
    storages: tuple[int, ...] = ()  # the storages merged into it
    replays: frozenset = frozenset()  # ops any recomputation of any share of it replays, wherever it runs
    # a head: its swap-out was copied after this op of the previous iteration started (its members' earliest
    # last access; None: not a head)
    copied_after: int | None = None


def absences(trace: Trace, cost: Cost, check_ops: np.ndarray, merge_below: int = MERGE_BELOW,
              hooked: HookedAway | None = None, interpreted: bool = False,
              budget_bytes: int | None = None) -> list[Absence]:
    """The units over every storage that may move, restricted to `check_ops` (ascending) and, for the
    plans that run hooked, to where `hooked` lets each storage be away or be recomputed; storages
    smaller than `merge_below` are merged by gap (and by the ops they may be away at). The plans
    bounded run hooked (`hooked` given), interpreted (`interpreted`) or either, which says what a
    recomputation replays at least (module docstring); where `budget_bytes` is given, a chain is
    recomputed away only at ops after which its memory can fit (module docstring)."""
    groups: dict[tuple, list[tuple[int, tuple | None]]] = {}
    packed = first_packs(trace.saved)
    closures: dict = {}
    held = _held_before(trace) if budget_bytes is not None else None
    for sid, lo, hi, release, due in _gaps(trace):
        ops = check_ops[(check_ops >= lo) & (check_ops < hi)]
        if hooked is not None:
            ops = hooked.ops(sid, ops)
        if not len(ops):
            continue
        recomputable = release is not None and due is not None and trace.recomputable(sid) and (
            hooked is None or hooked.rebuildable(sid, due))
        alone = sid if trace.nbytes[sid] >= merge_below else None
        replayed = None  # per op of `ops`: the ops a recomputation away there replays at least (None: cannot)
        if recomputable:
            if interpreted or sid not in packed:  # a chain's (what hooks rebuild is saved: rebuildable)
                chains = [_closure(trace, sid, int(i) + 1, hi, closures) for i in ops.tolist()]
                if held is not None:  # where its memory can never fit, no chain has it away
                    fits = [int(held[i + 1:hi + 1].min()) + int(trace.nbytes[sid]) + c.rebuilt_bytes <= budget_bytes
                            for i, c in zip(ops.tolist(), chains)]
                    chains = [c if fit else None for c, fit in zip(chains, fits)]
                replayed = tuple(None if c is None else c.ops for c in chains) \
                    if any(c is not None for c in chains) else None
            elif hooked is not None:  # a module call's run
                replayed = (hooked.replays(sid, due),) * len(ops)
            else:  # a run or a chain: its producer at least
                replayed = (frozenset({trace.producer(sid)}),) * len(ops)
        groups.setdefault((lo, hi, tuple(ops.tolist()), release, due, alone), []).append((sid, replayed))
    shared = _shared_ms(trace, cost, [m for members in groups.values() for m in members])
    return [_unit(trace, cost, shared, members, np.array(ops, dtype=np.int64), release, due)
            for (_, _, ops, release, due, _), members in groups.items()]


def _unit(trace: Trace, cost: Cost, shared: dict, members, ops, release, due) -> Absence:
    sizes = np.array([int(trace.nbytes[s]) for s, _ in members], dtype=np.float64)
    total, largest = float(sizes.sum()), float(sizes.max())
    copies = total / largest  # at least this share of a copy per member swapped (whole: one per member)
    rec = [(int(trace.nbytes[s]), replayed) for s, replayed in members if replayed is not None]
    # per op, the bytes recomputable there, all recomputed at the cheapest such member's rate (ms per byte)
    at = [[(b, replayed[t]) for b, replayed in rec if replayed[t] is not None] for t in range(len(ops))]
    shares = [sum(b for b, _ in there) / total for there in at]
    per_op = [min((sum(shared[j] for j in ops_t) for _, ops_t in there), default=0.0) for there in at]
    # a replay's ops at its first op are a subset of those at every later one (inputs only get freed)
    firsts = [next(r for r in replayed if r is not None) for _, replayed in rec]
    replays = frozenset.intersection(*firsts) if firsts else frozenset()
    return Absence(nbytes=int(total), members=len(members), ops=ops, release=release, due=due,
                   d2h_ms=MS * (cost.d2h_s(total) + (copies - 1) * cost.profile.copy_latency_s),
                   h2d_ms=MS * (cost.h2d_s(total) + (copies - 1) * cost.profile.copy_latency_s),
                   recompute_share=np.asarray(shares, dtype=np.float64),
                   recompute_ms=MS * total * np.asarray(per_op, dtype=np.float64), fewest=copies,
                   storages=tuple(s for s, _ in members), replays=replays,
                   copied_after=min(trace.accesses[s][-1] for s, _ in members) if release is None and due is not None
                   else None)


def _gaps(trace: Trace):
    """(storage, first op, end op, release op, due op) of every gap where a valid plan can take a
    storage away: ops [first, end) (see the module docstring)."""
    owned = trace.engine_owned
    for s in trace.storages:
        if s.nbytes <= 0 or s.free_op <= s.alloc_op or s.id in owned:
            continue
        acc = [a for a in trace.accesses[s.id] if alive_at(trace, s.id, a)]
        if s.persistent:
            if not acc:  # never accessed: away for free
                yield s.id, s.alloc_op, s.free_op, None, None
                continue
            yield s.id, acc[-1] + 1, s.free_op, acc[-1], None  # tail
            yield s.id, s.alloc_op, acc[0], None, acc[0]  # head
            ends = acc
        else:
            ends = sorted({s.alloc_op, *acc, s.free_op - 1})
        for p, q in zip(ends, ends[1:]):
            if q - p >= 2:
                yield s.id, p + 1, q, p, q


class Closure(NamedTuple):
    """What a chain rebuilding a storage replays and rebuilds wherever it runs in a stretch of ops."""

    ops: frozenset  # ops it replays
    rebuilt_bytes: int  # of the inputs it rebuilds (the trace holds them at no op of the stretch)


def _closure(trace: Trace, sid: int, lo: int, hi: int, memo: dict) -> Closure:
    """What a chain rebuilding `sid` replays wherever it runs from op lo to op hi (before op b,
    lo <= b <= hi): the ops writing it before lo (its lineage before every such b), and recursively
    those of each input the trace holds at no op of [lo, hi] (no plan makes it resident then: the chain
    rebuilds it), to the depth memplan.sim.chains follows; a subset of what the simulator's chain
    replays and rebuilds at every b."""
    key = (sid, lo, hi)
    if key in memo:
        return memo[key]
    storages, ops, seen = trace.storages, set(), {sid}

    def visit(s: int, depth: int) -> None:
        writes = [i for i in trace.writers[s] if i < lo]
        ops.update(writes)
        if depth >= MAX_CHAIN_DEPTH:
            return
        for r in sorted({r for i in writes for r in trace.ops[i].reads if r != s}):
            if (storages[r].free_op <= lo or storages[r].alloc_op > hi) and r not in seen:
                seen.add(r)
                visit(r, depth + 1)

    visit(sid, 0)
    memo[key] = Closure(ops=frozenset(ops), rebuilt_bytes=sum(int(trace.nbytes[r]) for r in seen if r != sid))
    return memo[key]


def _held_before(trace: Trace) -> np.ndarray:
    """Per op, the bytes resident in every plan when its recomputations run (before it allocates its
    outputs): the storages it accesses that exist before it and that the trace cannot recompute (one
    recomputed for it may not be rebuilt yet: its chain may come later)."""
    held = np.zeros(len(trace.ops), dtype=np.int64)
    for op in trace.ops:
        accessed = {s for s in (*op.reads, *op.writes) if alive_at(trace, s, op.index - 1) and alive_at(trace, s, op.index)
                    and not trace.recomputable(s)}
        held[op.index] = sum(int(trace.nbytes[s]) for s in accessed)
    return held


def _shared_ms(trace: Trace, cost: Cost, members) -> dict:
    """Op -> its duration (ms) per byte of every storage that counts it (each storage once, whatever
    its gaps and ops): recomputations before one op replay each op once at least, so the storages
    rebuilt there pay at most the ops they replay in all."""
    durations = np.asarray(cost.durations, dtype=np.float64)
    counted: dict[int, set] = {}
    for sid, replayed in members:
        for ops in replayed or ():
            for j in ops or ():
                counted.setdefault(j, set()).add(sid)
    return {j: float(durations[j]) / float(sum(int(trace.nbytes[s]) for s in sids)) for j, sids in counted.items()}
