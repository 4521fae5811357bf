"""Where a valid plan can take a storage away, and the least that being away costs: the units of
the lower bound's LP (`memplan.planners.bound`).

A valid plan (`memplan.sim.validate`) takes a storage away only strictly between two ops that do
not access it, inside its lifetime: a decision's gap (out_after, back_before) holds no access, so
an op `i` where the storage is away lies in one *gap* of the storage: between its last access (or
its allocation) before `i` and its next access (or its last op alive) after `i`. A swap making it
away at `i` copied it out after that last access started (an `overlap` copy starts beside it) and
before `i` started, and copies it back after `i` ended and before that next access starts; a
recomputation making it away at `i` replays at least its producer op between `i` and that access.

A persistent storage's gap across the iteration boundary is two units: its *tail* (after its last
access: a swap-out in this iteration, its prefetch in the next one's head or in this tail) and its
*head* (before its first access: the prefetch of a storage that starts the iteration on the host;
its swap-out was in the previous iteration).

Units of the same storages-free description (same gap ends and role) are merged into one of their
total bytes: a share of those bytes away costs at least that share of their copy time (their
latencies counted per largest member) or of their cheapest recomputation per byte.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...cost.model import Cost
from ...model import Trace
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
    recompute_share: float  # share of `nbytes` that can be recomputed (0: none)
    recompute_ms: float  # recomputing all `nbytes` at their cheapest rate (scaled by the share taken)
    fewest: float  # storages away per whole share away, at least (its bytes over its largest storage's)
    storages: tuple[int, ...] = ()  # the storages merged into it


def absences(trace: Trace, cost: Cost, check_ops: np.ndarray, merge_below: int = MERGE_BELOW,
              hooked: HookedAway | None = None) -> list[Absence]:
    """The units over every storage that may move, restricted to `check_ops` (ascending) and, for the
    plans that run hooked, to where `hooked` lets each storage be away; storages smaller than
    `merge_below` are merged by gap (and by the ops they may be away at)."""
    groups: dict[tuple, list[tuple[int, bool]]] = {}
    for sid, lo, hi, release, due in _gaps(trace):
        ops = check_ops[(check_ops >= lo) & (check_ops < hi)]
        if hooked is not None:
            ops = hooked.ops(sid, ops)
        if not len(ops):
            continue
        recomputable = release is not None and due is not None and trace.recomputable(sid) and (
            hooked is None or hooked.rebuildable(sid, due))
        alone = sid if trace.nbytes[sid] >= merge_below else None
        groups.setdefault((lo, hi, tuple(ops.tolist()), release, due, alone), []).append((sid, recomputable))
    rate = _recompute_ms_per_byte(trace, cost)
    return [_unit(trace, cost, rate, members, np.array(ops, dtype=np.int64), release, due)
            for (_, _, ops, release, due, _), members in groups.items()]


def _unit(trace: Trace, cost: Cost, rate: np.ndarray, members, ops, release, due) -> Absence:
    sizes = np.array([int(trace.nbytes[s]) for s, _ in members], dtype=np.float64)
    total, largest = float(sizes.sum()), float(sizes.max())
    copies = total / largest  # at least this share of a copy per member swapped (whole: one per member)
    rec = [(int(trace.nbytes[s]), rate[s]) for s, ok in members if ok]
    rec_bytes = sum(b for b, _ in rec)
    return Absence(nbytes=int(total), members=len(members), ops=ops, release=release, due=due,
                   d2h_ms=MS * (cost.d2h_s(total) + (copies - 1) * cost.profile.copy_latency_s),
                   h2d_ms=MS * (cost.h2d_s(total) + (copies - 1) * cost.profile.copy_latency_s),
                   recompute_share=rec_bytes / total,
                   recompute_ms=MS * total * min((r for _, r in rec), default=0.0), fewest=copies,
                   storages=tuple(s for s, _ in members))


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


def _recompute_ms_per_byte(trace: Trace, cost: Cost) -> np.ndarray:
    """Per storage, its producer's duration over the bytes of every recomputable storage that op
    makes: recomputations before one op replay each producer once at least, so the storages
    rebuilt there from one producer pay at most its duration in all."""
    durations = np.asarray(cost.durations, dtype=np.float64)
    made: dict[int, int] = {}
    producer = {}
    for s in trace.storages:
        if s.nbytes > 0 and trace.recomputable(s.id):
            producer[s.id] = trace.producer(s.id)
            made[producer[s.id]] = made.get(producer[s.id], 0) + s.nbytes
    out = np.zeros(len(trace.storages))
    for sid, op in producer.items():
        out[sid] = durations[op] / made[op]
    return out
