"""Residency intervals of a trace under a swap/recompute plan: the buffers a pool must hold.

A storage with decisions d1..dk (sorted by out_after) is resident
[alloc_op, release(d1)), [d1.prefetch_at, release(d2)), ..., [dk.prefetch_at, free_op).

Safety choice for swaps: the device memory of a swapped-out storage is only released when
its device-to-host copy completes, so `release(d)` is the first op that starts at or after
that completion, not `d.out_after + 1`. Completion times come from a FIFO device-to-host
engine over the unconstrained timeline (op start times from the cost model, copies issued
at the end of op `out_after`, in order). Recomputes and synchronous swaps release at
`out_after + 1` (the compute stream waits for a synchronous copy). If a prefetch is issued
before the swap-out copy completes, the two residencies are separate buffers that overlap
in time (two copies really exist then), so they never share an address.
"""

from __future__ import annotations

import numpy as np

from ..model import Decision, Plan, Trace
from .problem import ROLE_OFFLOAD, ROLE_PLAIN, ROLE_PREFETCH, PoolProblem, make_problem


def swap_release_ops(trace: Trace, plan: Plan, cost=None) -> dict[tuple[int, int], int]:
    """Op index at which each asynchronous swap-out has released its device memory.

    Args:
        trace: the trace.
        plan: the plan whose swaps are timed.
        cost: a Cost for the trace (default: `Cost.for_trace(trace)` on the h100 profile).
    Returns:
        {(storage, out_after): first op starting at or after the copy completes}, at most
        the number of ops.
    """
    swaps = sorted((d for d in plan.decisions if d.action == "swap" and not d.sync),
                   key=lambda d: (d.out_after, d.storage))
    if not swaps:
        return {}
    if cost is None:
        from ..cost.model import Cost

        cost = Cost.for_trace(trace)
    op_starts = np.concatenate([[0.0], np.cumsum(cost.durations)])  # op_starts[i] = start of op i
    engine_free = 0.0
    out: dict[tuple[int, int], int] = {}
    for d in swaps:
        nbytes = trace.storages[d.storage].nbytes * (d.compress_ratio or 1.0)
        begin = max(op_starts[d.out_after + 1], engine_free)
        engine_free = begin + cost.d2h_s(nbytes)
        release = int(np.searchsorted(op_starts, engine_free, side="left"))
        out[(d.storage, d.out_after)] = min(max(release, d.out_after + 1), trace.num_steps)
    return out


def residency_problem(trace: Trace, plan: Plan | None = None, cost=None) -> PoolProblem:
    """The pool problem of `trace`, under `plan` when given.

    Args:
        trace: the traced iteration.
        plan: swap/recompute decisions; None means every storage lives [alloc_op, free_op).
        cost: the cost model used to time swap-out completion (see module docstring).
    Returns:
        A PoolProblem with one buffer per non-empty residency interval; roles mark the
        residencies that end in a swap-out (ROLE_OFFLOAD) or start with a prefetch or
        recompute (ROLE_PREFETCH).
    """
    by_storage = plan.by_storage() if plan is not None else {}
    release = swap_release_ops(trace, plan, cost) if plan is not None else {}
    starts, ends, sizes, sids, roles = [], [], [], [], []
    for s in trace.storages:
        if s.nbytes <= 0:
            continue
        segments = _segments(s, by_storage.get(s.id, []), release, trace.num_steps)
        for start, end, role in segments:
            if end > start:
                starts.append(start), ends.append(end), sizes.append(s.nbytes), sids.append(s.id), roles.append(role)
    names = [str(sid) for sid in sids]
    return make_problem(starts, ends, sizes, storages=sids, names=names, roles=roles,
                        source=str(trace.meta.get("model", "")))


def _release(d: Decision, release: dict, horizon: int) -> int:
    if d.action == "swap" and not d.sync:
        return release.get((d.storage, d.out_after), d.out_after + 1)
    return min(d.out_after + 1, horizon)


def _segments(s, decisions: list[Decision], release: dict, horizon: int) -> list[tuple[int, int, int]]:
    """(start, end, role) residency intervals of one storage."""
    if not decisions:
        return [(s.alloc_op, s.free_op, ROLE_PLAIN)]
    plain = [d for d in decisions if not d.wraps]
    wrap = [d for d in decisions if d.wraps]
    out: list[tuple[int, int, int]] = []
    cur, role = s.alloc_op, ROLE_PLAIN
    tail: list[tuple[int, int, int]] = []
    if wrap:
        w = wrap[-1]
        if w.prefetch_at <= w.back_before:
            # Brought back early in this iteration: away from the iteration start until then.
            cur, role = w.prefetch_at, ROLE_PREFETCH
        else:
            # Prefetched late in this iteration for the next one: resident again from the trigger.
            tail.append((w.prefetch_at, s.free_op, ROLE_PREFETCH))
        plain.append(w)
    for d in plain:
        end = _release(d, release, horizon)
        out.append((cur, min(end, s.free_op), ROLE_OFFLOAD if d.action == "swap" else role))
        cur, role = d.prefetch_at, ROLE_PREFETCH
    if not wrap:
        out.append((cur, s.free_op, role))
    return out + tail
