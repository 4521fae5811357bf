"""The kernel's per-plan arrays from a lowered plan's columns, in one compiled pass (numba when it imports).

What memplan.sim.prepare would otherwise do with a few dozen numpy calls per plan and level:
wrap modes, the storages away when a step starts, the per-op lists of prefetches, needs and
swap-outs, the chains' columns per decision, which prefetches land before a recomputation
reads them, and the host's work per op with the plan's actions. The semantics are those of
memplan.sim.simulate; `memplan.sim.kernel_loader` also loads this file as plain Python, beside
the interpreted kernel. Its numbers are memplan.sim._codes's, compiled in: see there before changing one.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # numba is a dependency, but keep the simulator usable without it
    def njit(*args, **kwargs):
        return (lambda fn: fn) if not args or not callable(args[0]) else args[0]

from ._codes import HEAD_WRAP, NO_WRAP, OVERLAP, RECOMPUTE, SWAP, TAIL_WRAP

# Helpers are inlined into their caller by numba itself: left to LLVM they stayed calls, which took a
# third of the kernel's time.
inlined = njit(cache=True, inline="always")


@inlined
def _by_op(ops, take, n_ops):
    """The decisions d with take[d], grouped by ops[d] in [0, n_ops), in decision order: (ptr, ids)."""
    ptr = np.zeros(n_ops + 1, dtype=np.int64)
    for d in range(ops.shape[0]):
        if take[d]:
            ptr[ops[d] + 1] += 1
    for i in range(n_ops):
        ptr[i + 1] += ptr[i]
    ids = np.empty(ptr[n_ops], dtype=np.int64)
    fill = ptr[:-1].copy()
    for d in range(ops.shape[0]):
        if take[d]:
            ids[fill[ops[d]]] = d
            fill[ops[d]] += 1
    return ptr, ids


@inlined
def _rank_within(ptr, ids, rank):
    """Each op's list ordered by (rank, decision), in place (insertion sort: the lists are short)."""
    for i in range(ptr.shape[0] - 1):
        for j in range(ptr[i] + 1, ptr[i + 1]):
            d = ids[j]
            k = j
            while k > ptr[i] and (rank[ids[k - 1]] > rank[d] or (rank[ids[k - 1]] == rank[d] and ids[k - 1] > d)):
                ids[k] = ids[k - 1]
                k -= 1
            ids[k] = d


@inlined
def _host_work(host_base, d_kind, d_out, d_back, d_trigger, d_d2h, d_h2d, action_s, host_async):
    """The host's work per op: its base, plus `action_s` per action (two a decision: out and back,
    four a swap: out, release, prefetch, wait), plus, on a synchronous host (the CPU), the copies."""
    host = host_base.copy()
    n = d_kind.shape[0]
    if action_s != 0.0:
        for d in range(n):
            host[d_out[d]] += action_s
        for d in range(n):
            host[d_back[d]] += action_s
        for d in range(n):
            if d_kind[d] == SWAP:
                host[d_out[d]] += action_s
        for d in range(n):
            if d_kind[d] == SWAP:
                host[d_trigger[d]] += action_s
    if not host_async:
        for d in range(n):
            if d_kind[d] == SWAP:
                host[d_out[d]] += d_d2h[d]
        for d in range(n):
            if d_kind[d] == SWAP:
                host[d_trigger[d]] += d_h2d[d]
    return host


@njit(cache=True)
def plan_events(n_ops, n_storages, d_recompute, d_sid, d_out, d_back, d_trigger, d_d2h, d_h2d, producers,
                c_index, c_seconds, c_alloc, c_free, c_host, read_codes, read_any, host_base, action_s, host_async):
    """The kernel's per-plan arrays (see memplan.sim._kernel.run_kernel for their meaning).

    Args:
        c_*: the chains' columns and the decision each is for (`c_index`).
        read_codes: sorted back_before * n_storages + storage of the storages a chain due at that op reads.
        read_any: per storage, True when some chain reads it (None of the others is searched for).
        host_base: the host's work per op at the plan's level, before its actions.
    Returns:
        (kind, wrap, absent, chain_s, chain_alloc, chain_free, chain_host, issue_ptr, issue_ids,
        need_ptr, need_ids, out_ptr, out_ids, wait_first, host, d2h, h2d): `host` is `host_base` itself
        where the actions cost nothing; on a synchronous host the copies are its work and take no
        copy engine's time (`d2h`, `h2d` zero).
    """
    n = d_recompute.shape[0]
    kind = np.empty(n, dtype=np.int64)
    wrap = np.full(n, NO_WRAP, dtype=np.int64)
    absent = np.zeros(n_storages, dtype=np.bool_)
    rank = np.empty(n, dtype=np.int64)  # need order at one op: prefetches first, then chains by producer
    wait_first = np.zeros(n, dtype=np.bool_)
    is_swap = np.zeros(n, dtype=np.bool_)
    for d in range(n):
        if d_recompute[d]:
            kind[d] = RECOMPUTE
            rank[d] = producers[d_sid[d]]
            continue
        kind[d] = SWAP
        is_swap[d] = True
        rank[d] = -1
        if d_back[d] <= d_out[d]:
            wrap[d] = TAIL_WRAP if d_trigger[d] > d_out[d] else HEAD_WRAP
            if wrap[d] == HEAD_WRAP:
                absent[d_sid[d]] = True
        if read_codes.shape[0] and read_any[d_sid[d]]:
            code = d_back[d] * n_storages + d_sid[d]
            at = np.searchsorted(read_codes, code)
            wait_first[d] = at < read_codes.shape[0] and read_codes[at] == code
    chain_s, chain_host = np.zeros(n), np.zeros(n)
    chain_alloc, chain_free = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    for j in range(c_index.shape[0]):
        k = c_index[j]
        chain_s[k], chain_alloc[k], chain_free[k], chain_host[k] = c_seconds[j], c_alloc[j], c_free[j], c_host[j]
    issue_ptr, issue_ids = _by_op(d_trigger, is_swap, n_ops)
    need_ptr, need_ids = _by_op(d_back, np.ones(n, dtype=np.bool_), n_ops)
    _rank_within(need_ptr, need_ids, rank)
    out_ptr, out_ids = _by_op(d_out, np.ones(n, dtype=np.bool_), n_ops)
    host, d2h, h2d = host_base, d_d2h, d_h2d
    if n > 0 and (action_s != 0.0 or not host_async):
        host = _host_work(host_base, kind, d_out, d_back, d_trigger, d_d2h, d_h2d, action_s, host_async)
        if not host_async:  # the CPU copies on its one thread (memplan.exec.engine), nothing beside
            d2h, h2d = np.zeros_like(d_d2h), np.zeros_like(d_h2d)
    return (kind, wrap, absent, chain_s, chain_alloc, chain_free, chain_host, issue_ptr, issue_ids,
            need_ptr, need_ids, out_ptr, out_ids, wait_first, host, d2h, h2d)


@njit(cache=True)
def place_decisions(after, before, d_recompute, d_out, d_back, d_prefetch, d_sync):
    """Decisions moved onto sites (memplan.sim.lowering, memplan.model.hooksites): a swap-out or drop
    after op i at the first point at or after i + 1, a prefetch at the last point at or before its
    trigger (not before the swap-out, unless its gap wraps around the step), a recomputation at the
    last point at or before its op; a tail prefetch that would come at the step's end comes at the
    next step's start instead (the same moment).

    Args:
        after, before: per point p (0..ops), the first site's point at or after p and the last at or before it.
    Returns:
        (out_after, back_before, prefetch_at, sync, left): the moved columns (an overlapping swap-out
        no longer overlaps), and which decisions' gaps are empty there.
    """
    n = d_out.shape[0]
    n_ops = after.shape[0] - 1
    out, back, prefetch, sync = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    left = np.zeros(n, dtype=np.bool_)
    for d in range(n):
        out[d] = after[d_out[d] + 1] - 1
        if d_recompute[d]:
            back[d] = before[d_back[d]]
            prefetch[d] = back[d]
            left[d] = back[d] <= out[d] + 1
            sync[d] = d_sync[d]
            continue
        back[d] = d_back[d]
        sync[d] = d_sync[d] & ~OVERLAP
        if d_back[d] > d_out[d]:
            prefetch[d] = max(before[d_prefetch[d]], out[d] + 1)
            left[d] = out[d] + 1 >= d_back[d]
        elif d_prefetch[d] > d_out[d]:  # across the boundary, prefetched in the step's tail
            prefetch[d] = max(before[d_prefetch[d]], out[d] + 1)
            if prefetch[d] >= n_ops:
                prefetch[d] = before[0]
        else:  # across the boundary, prefetched in the next step's head
            prefetch[d] = before[d_prefetch[d]]
    return out, back, prefetch, sync, left


@njit(cache=True)
def floor_load(alive, born, alloc_ops, free_ops, nbytes, d_sid, d_out, d_back, d_prefetch, c_index, c_transient, rank):
    """A lower bound of the largest load the kernel reaches under these decisions, whatever their timing.

    At the allocation of op i's outputs, every storage alive then (alloc_op <= i < free_op) and
    outside the gaps of its decisions is resident (born, or brought back: a prefetch is issued at
    its trigger and a recomputation runs at its op, both before op i's outputs), and the load holds
    at least the resident storages' bytes (copies in flight, chains and holds come on top). A gap
    is (out_after, prefetch_at); a storage whose gap wraps around the iteration, or whose prefetch
    comes before its swap-out, is not counted at all. And where recompute chains run at op i, the
    last of them (in need order) allocates its target and its transient memory when all the others
    have run: the load then holds the storages resident at op i but its outputs, plus that
    transient. An allocation fails where either exceeds the budget (or before).

    Args:
        alive: per op, the bytes of the storages alive at it (its outputs included); `born`: of its outputs.
        c_index, c_transient: the decisions whose chain allocates (region runs' carriers, or none) and
            the bytes their chains free when done; `rank`: each decision's need order at its op.
    """
    n = alive.shape[0]
    away = np.zeros(n + 1, dtype=np.int64)
    for d in range(d_sid.shape[0]):
        s = d_sid[d]
        whole = d_back[d] <= d_out[d] or d_prefetch[d] <= d_out[d]
        lo = alloc_ops[s] if whole else max(d_out[d] + 1, alloc_ops[s])
        hi = free_ops[s] if whole else min(d_prefetch[d], free_ops[s])
        if lo < hi:
            away[lo] += nbytes[s]
            away[hi] -= nbytes[s]
    last = np.full(n, -1, dtype=np.int64)  # per op, the last chain (in need order) that allocates
    for j in range(c_index.shape[0]):
        k, i = c_index[j], d_back[c_index[j]]
        if last[i] < 0 or (rank[k], k) > (rank[c_index[last[i]]], c_index[last[i]]):
            last[i] = j
    peak, gone = 0, 0
    for i in range(n):
        gone += away[i]
        peak = max(peak, alive[i] - gone)
        if last[i] >= 0:
            peak = max(peak, alive[i] - gone - born[i] + c_transient[last[i]])
    return peak
