"""The simulator's inner event loop over flat arrays (numba-compiled when numba imports).

Everything here is plain numpy arrays and scalars so that numba can compile it; the
semantics are documented in `memplan.sim.simulate`. `memplan.sim.kernel_loader` also loads this
file a second time with numba hidden, as plain Python, for one-shot simulations. Its numbers (decision
kinds, result slots) are memplan.sim._codes's, compiled in: see there before changing one.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # numba is a dependency, but keep the simulator usable without it
    def njit(*args, **kwargs):
        return (lambda fn: fn) if not args or not callable(args[0]) else args[0]

from ._codes import (
    A_DROP, A_PREFETCH, A_RECOMPUTE, A_RELEASE, A_SWAP_OUT, A_WAIT, EXTRA_WORK,
    HEAD_WRAP, I_BAD_OP, I_FEASIBLE, I_LINK, I_N_HOST_EVENTS, I_N_LOAD_EVENTS, I_N_PROGRAM, I_PEAK, I_SHORTFALL,
    N_FLOAT_RESULTS, N_INT_RESULTS, NO_WRAP, OVERLAP, R_COMPUTE, R_COPY_BUSY, R_HOST, R_MEM_STALL, R_PREFETCH_STALL,
    R_RECOMPUTE, R_SYNC_STALL, R_TIME, RECOMPUTE, SWAP, SYNC, TAIL_WRAP)

# Helpers are inlined into their caller by numba itself: left to LLVM they stayed calls, which took a
# third of the kernel's time.
inlined = njit(cache=True, inline="always")


@inlined
def _make_room(need, budget, t, load, pend_t, pend_b, head, tail, load_t, load_v, n_load, record, through=-1):
    """Release the swap-outs completed by time `t`, then wait for more until `need` fits (and until
    the one at queue position `through` is released).

    Returns:
        (t, load, head, n_load): the time after any wait, the load, the new head of the
        pending-release queue and the timeline length.
    """
    while head < tail and (pend_t[head] <= t or load + need > budget or head <= through):
        t = max(t, pend_t[head])
        load -= pend_b[head]
        n_load = _point(load_t, load_v, n_load, pend_t[head], load, record)
        head += 1
    return t, load, head, n_load


@inlined
def _allocate(need, budget, t, load, peak, pend_t, pend_b, head, tail, load_t, load_v, n_load, record):
    """Wait for swap-outs until `need` more bytes fit under the budget, then take them.

    Returns:
        (t, load, peak, head, n_load, stall, shortfall): as `_make_room`, plus the new peak,
        the seconds waited and, when nothing pending can free enough, the bytes missing
        (then nothing was taken; 0 on success).
    """
    before = t
    t, load, head, n_load = _make_room(need, budget, t, load, pend_t, pend_b, head, tail, load_t, load_v, n_load, record)
    if load + need > budget:
        return t, load, peak, head, n_load, t - before, load + need - budget
    load += need
    n_load = _point(load_t, load_v, n_load, t, load, record)
    return t, load, max(peak, load), head, n_load, t - before, 0


@inlined
def _emit(prog, n_prog, op, after, kind, d, emit):
    """Append one step-program action (op, after?, kind, decision) when emitting."""
    if emit:
        prog[n_prog, 0] = op
        prog[n_prog, 1] = after
        prog[n_prog, 2] = kind
        prog[n_prog, 3] = d
        n_prog += 1
    return n_prog


@inlined
def _emit_releases(prog, n_prog, pend_d, first, last, op, after, emit):
    """The releases of pending swap-outs first..last-1, as actions at `op`."""
    if emit:
        for k in range(first, last):
            n_prog = _emit(prog, n_prog, op, after, A_RELEASE, pend_d[k], emit)
    return n_prog


@inlined
def _point(load_t, load_v, n_load, t, load, record):
    """Append (t, load) to the load timeline when recording; returns its new length."""
    if record:
        load_t[n_load] = t
        load_v[n_load] = load
        n_load += 1
    return n_load


@inlined
def _boundary_stall(d_kind, d_wrap, d_sid, d_back, land, h2d_start, on_host_at, op_start, h2d_free, t_end):
    """How long the next iteration must wait for this one's wrap-around copies (steady state).

    The next iteration is assumed to repeat this one shifted by `t_end`. A tail prefetch
    must land before its op starts there; a head prefetch there can start only once this
    iteration's swap-out reached the host and the host-to-device engine drained, which
    delays its landing beyond the slack it had before its op. The largest lateness is
    charged once at the boundary (a first-order correction: one wait there resolves all).
    """
    late = 0.0
    for d in range(d_kind.shape[0]):
        if d_kind[d] != SWAP or d_wrap[d] == NO_WRAP:
            continue
        need_at = t_end + op_start[d_back[d]]
        if d_wrap[d] == TAIL_WRAP:
            late = max(late, land[d] - need_at)
        else:
            ready = max(on_host_at[d_sid[d]], h2d_free)
            shift = ready - (t_end + h2d_start[d])
            late = max(late, shift - (op_start[d_back[d]] - land[d]))
    return late


@inlined
def _extra_work(copies, n_copies, t, seconds, record):
    """Note `seconds` of recompute or (de)compression on the compute lane; returns the count."""
    if record and seconds > 0.0:
        copies[n_copies, 0] = t
        copies[n_copies, 1] = t + seconds
        copies[n_copies, 2] = EXTRA_WORK
        n_copies += 1
    return n_copies


@inlined
def _land(d, i, t, land, d_wrap, d_comp_s, floats, copies, n_copies, record, prog, n_prog, emit):
    """Op i waits for prefetch d to land (a tail-wrap one landed in the previous iteration),
    then decompresses it. Returns (t, n_copies, n_prog)."""
    if d_wrap[d] != TAIL_WRAP and land[d] > t:
        floats[R_PREFETCH_STALL] += land[d] - t
        t = land[d]
    n_prog = _emit(prog, n_prog, i, 0, A_WAIT, d, emit)
    n_copies = _extra_work(copies, n_copies, t, d_comp_s[d], record)
    t += d_comp_s[d]
    floats[R_RECOMPUTE] += d_comp_s[d]
    return t, n_copies, n_prog


@inlined
def _issue(seconds, h, t, host_async, floats):
    """The host spends `seconds` issuing work the device then runs: returns (h, t). An asynchronous
    host (a GPU's) runs ahead on its own clock `h` and the device waits only when it catches up;
    a synchronous one (the CPU, which is the device) adds its time to the device's."""
    h = (h if host_async else t) + seconds
    if h > t:
        floats[R_HOST] += h - t
        t = h
    return h, t


@inlined
def _fail(ints, op, shortfall, peak):
    """Mark the result infeasible at `op`."""
    ints[I_FEASIBLE] = 0
    ints[I_BAD_OP] = op
    ints[I_SHORTFALL] = shortfall
    ints[I_PEAK] = peak


@njit(cache=True)
def run_kernel(durations, nbytes, birth_ptr, birth_ids, death_ptr, death_ids,
               d_kind, d_sid, d_sync, d_wrap, d_link_bytes, d_d2h_s, d_h2d_s, d_comp_s,
               d_chain_s, d_chain_alloc, d_chain_free, d_chain_host_s,
               issue_ptr, issue_ids, need_ptr, need_ids, out_ptr, out_ids,
               absent_at_start, d_back, d_wait_first, host_s, host_async, carry, budget, record, emit):
    """Simulate one iteration; see `memplan.sim.simulate` for the contract (`carry`: swap-outs after
    the last op are released in the next step, which starts with them copying).

    Returns:
        (floats, ints, load_t, load_v, host_t, host_v, op_start, copies, program) — the result
        vectors indexed by the R_* and I_* constants, the load timeline, host-memory events,
        op start times and copy intervals (timeline, op starts and copies only when `record`),
        and with `emit` the step program: rows (op, after, action, decision) in execution order.
    """
    n_ops = durations.shape[0]
    n_dec = d_kind.shape[0]
    floats = np.zeros(N_FLOAT_RESULTS)
    ints = np.zeros(N_INT_RESULTS, dtype=np.int64)
    resident = np.zeros(nbytes.shape[0], dtype=np.bool_)
    land = np.zeros(n_dec)
    h2d_start = np.zeros(n_dec)
    on_host_at = np.zeros(nbytes.shape[0])  # when each storage's latest swap-out reached the host
    # Pending swap-out releases, FIFO (the D2H engine completes in issue order): carried over, then this step's.
    pend_t = np.zeros(2 * n_dec + 1)
    pend_b = np.zeros(2 * n_dec + 1, dtype=np.int64)
    pend_d = np.zeros(2 * n_dec + 1, dtype=np.int64)
    pend_head, pend_tail = 0, 0
    carried_at = np.full(n_dec, -1)  # a carried-over swap-out's position in the queue
    prog = np.zeros((4 * n_dec + 1 if emit else 1, 4), dtype=np.int64)
    n_prog = 0
    waited = np.zeros(n_dec, dtype=np.bool_)
    cap = 4 * (birth_ids.shape[0] + death_ids.shape[0] + 4 * n_dec + n_ops) + 8 if record else 1
    load_t = np.zeros(cap)
    load_v = np.zeros(cap, dtype=np.int64)
    host_t = np.zeros(2 * n_dec + 1)
    host_v = np.zeros(2 * n_dec + 1, dtype=np.int64)
    op_start = np.zeros(n_ops)  # always: the boundary correction needs it
    copies = np.zeros((4 * n_dec + 1 if record else 1, 3))  # (start, end, D2H_COPY / H2D_COPY / EXTRA_WORK)
    n_copies = 0
    n_load, n_host = 0, 0
    t = 0.0
    h = 0.0  # the host's clock (asynchronous hosts)
    load = 0
    peak = 0
    d2h_free, h2d_free = 0.0, 0.0
    link = 0
    ints[I_FEASIBLE] = 1
    if carry and n_ops > 0:
        # Steady state: the previous step's swap-outs after its last op (wrap-around, asynchronous,
        # uncompressed) are still copying when this step starts, their bytes on the device until released.
        for k in range(out_ptr[n_ops - 1], out_ptr[n_ops]):
            d = out_ids[k]
            if d_kind[d] == SWAP and d_wrap[d] == HEAD_WRAP and not d_sync[d] & SYNC and d_comp_s[d] == 0.0:
                s = d_sid[d]
                d2h_free += d_d2h_s[d]
                on_host_at[s] = pend_t[pend_tail] = d2h_free
                pend_b[pend_tail], pend_d[pend_tail], carried_at[d] = nbytes[s], d, pend_tail
                pend_tail += 1
                load += nbytes[s]
        if load:
            peak = load
            n_load = _point(load_t, load_v, n_load, t, load, record)
    for i in range(n_ops):
        head = pend_head
        t, load, pend_head, n_load = _make_room(0, budget, t, load, pend_t, pend_b, pend_head, pend_tail,
                                                load_t, load_v, n_load, record)
        n_prog = _emit_releases(prog, n_prog, pend_d, head, pend_head, i, 0, emit)
        # (1) prefetches issued at this op
        for k in range(issue_ptr[i], issue_ptr[i + 1]):
            d = issue_ids[k]
            head = pend_head
            if carried_at[d] >= pend_head:  # its carried-over copy is released first, waited for
                before = t
                t, load, pend_head, n_load = _make_room(0, budget, t, load, pend_t, pend_b, pend_head, pend_tail,
                                                        load_t, load_v, n_load, record, carried_at[d])
                floats[R_MEM_STALL] += t - before
            t, load, peak, pend_head, n_load, stall, short = _allocate(
                nbytes[d_sid[d]], budget, t, load, peak, pend_t, pend_b, pend_head, pend_tail, load_t, load_v, n_load, record)
            n_prog = _emit_releases(prog, n_prog, pend_d, head, pend_head, i, 0, emit)
            floats[R_MEM_STALL] += stall
            if short:
                _fail(ints, i, short, peak)
                return floats, ints, load_t, load_v, host_t, host_v, op_start, copies[:n_copies], prog[:n_prog]
            start = max(t, h2d_free, on_host_at[d_sid[d]])
            h2d_free = start + d_h2d_s[d]
            h2d_start[d] = start
            land[d] = h2d_free
            floats[R_COPY_BUSY] += d_h2d_s[d]
            link += d_link_bytes[d]
            if d_wrap[d] != TAIL_WRAP:
                resident[d_sid[d]] = True
            n_prog = _emit(prog, n_prog, i, 0, A_PREFETCH, d, emit)
            host_t[n_host] = h2d_free
            host_v[n_host] = -d_link_bytes[d]
            n_host += 1
            if record:
                copies[n_copies, 0] = start
                copies[n_copies, 1] = h2d_free
                copies[n_copies, 2] = 1
                n_copies += 1
        # (2) recomputes needed by this op, in producer order: first the prefetches of this op
        # that a recomputation reads land, then each chain allocates, runs and drops the
        # temporarily rebuilt inputs
        for k in range(need_ptr[i], need_ptr[i + 1]):
            d = need_ids[k]
            if d_kind[d] == SWAP and d_wait_first[d]:
                t, n_copies, n_prog = _land(d, i, t, land, d_wrap, d_comp_s, floats, copies, n_copies, record,
                                            prog, n_prog, emit)
                waited[d] = True
        for k in range(need_ptr[i], need_ptr[i + 1]):
            d = need_ids[k]
            if d_kind[d] != RECOMPUTE:
                continue
            head = pend_head
            t, load, peak, pend_head, n_load, stall, short = _allocate(
                d_chain_alloc[d], budget, t, load, peak, pend_t, pend_b, pend_head, pend_tail,
                load_t, load_v, n_load, record)
            n_prog = _emit_releases(prog, n_prog, pend_d, head, pend_head, i, 0, emit)
            floats[R_MEM_STALL] += stall
            if short:
                _fail(ints, i, short, peak)
                return floats, ints, load_t, load_v, host_t, host_v, op_start, copies[:n_copies], prog[:n_prog]
            n_prog = _emit(prog, n_prog, i, 0, A_RECOMPUTE, d, emit)
            h, t = _issue(d_chain_host_s[d], h, t, host_async, floats)
            n_copies = _extra_work(copies, n_copies, t, d_chain_s[d], record)
            t += d_chain_s[d]
            floats[R_RECOMPUTE] += d_chain_s[d]
            resident[d_sid[d]] = True
            if d_chain_free[d] > 0:  # its discarded outputs, and temporary inputs no later chain reads
                load -= d_chain_free[d]
                n_load = _point(load_t, load_v, n_load, t, load, record)
        # (3) the op's new outputs
        need = 0
        for k in range(birth_ptr[i], birth_ptr[i + 1]):
            s = birth_ids[k]
            if not (i == 0 and absent_at_start[s]):
                need += nbytes[s]
        head = pend_head
        t, load, peak, pend_head, n_load, stall, short = _allocate(
            need, budget, t, load, peak, pend_t, pend_b, pend_head, pend_tail, load_t, load_v, n_load, record)
        n_prog = _emit_releases(prog, n_prog, pend_d, head, pend_head, i, 0, emit)
        floats[R_MEM_STALL] += stall
        if short:
            _fail(ints, i, short, peak)
            return floats, ints, load_t, load_v, host_t, host_v, op_start, copies[:n_copies], prog[:n_prog]
        for k in range(birth_ptr[i], birth_ptr[i + 1]):
            s = birth_ids[k]
            if not (i == 0 and absent_at_start[s]):
                resident[s] = True
        # (4) the op's prefetches must have landed (a tail-wrap one landed in the previous
        # iteration), then compressed ones are decompressed
        for k in range(need_ptr[i], need_ptr[i + 1]):
            d = need_ids[k]
            if d_kind[d] == SWAP and not waited[d]:
                t, n_copies, n_prog = _land(d, i, t, land, d_wrap, d_comp_s, floats, copies, n_copies, record,
                                            prog, n_prog, emit)
        # (5) the op itself, once the host has issued it
        h, t = _issue(host_s[i], h, t, host_async, floats)
        op_start[i] = t
        t += durations[i]
        floats[R_COMPUTE] += durations[i]
        # (6) swap-outs, then releases at the end of the op (only a gap across the boundary that
        # starts after the last op has both: its swap-out comes first, the end-of-iteration release after)
        released = 0
        for k in range(out_ptr[i], out_ptr[i + 1]):
            d = out_ids[k]
            s = d_sid[d]
            if not resident[s]:
                continue
            resident[s] = False
            if d_kind[d] == RECOMPUTE:
                released += nbytes[s]
                n_prog = _emit(prog, n_prog, i, 1, A_DROP, d, emit)
                continue
            n_prog = _emit(prog, n_prog, i, 1, A_SWAP_OUT, d, emit)
            n_copies = _extra_work(copies, n_copies, t, d_comp_s[d], record)
            t += d_comp_s[d]
            floats[R_RECOMPUTE] += d_comp_s[d]
            start = max(op_start[i] if d_sync[d] & OVERLAP and d_comp_s[d] == 0.0 else t, d2h_free)
            d2h_free = start + d_d2h_s[d]
            on_host_at[s] = d2h_free
            floats[R_COPY_BUSY] += d_d2h_s[d]
            link += d_link_bytes[d]
            host_t[n_host] = start
            host_v[n_host] = d_link_bytes[d]
            n_host += 1
            if record:
                copies[n_copies, 0] = start
                copies[n_copies, 1] = d2h_free
                n_copies += 1
            if d_sync[d] & SYNC:
                if d2h_free > t:
                    floats[R_SYNC_STALL] += d2h_free - t
                    t = d2h_free
                released += nbytes[s]
                n_prog = _emit(prog, n_prog, i, 1, A_RELEASE, d, emit)
            else:
                pend_t[pend_tail] = d2h_free
                pend_b[pend_tail] = nbytes[s]
                pend_d[pend_tail] = d
                pend_tail += 1
        for k in range(death_ptr[i], death_ptr[i + 1]):
            s = death_ids[k]
            if resident[s]:
                resident[s] = False
                released += nbytes[s]
        if released:
            load -= released
            if i < n_ops - 1:  # the end-of-iteration release is not part of the curve
                n_load = _point(load_t, load_v, n_load, t, load, record)
    # Swap-outs still in flight are released at the step's end, the compute stream waiting for them there
    # (memplan.exec.engine, rule 5), but those carried over to the next step.
    joined = 0.0
    for k in range(pend_head, pend_tail):
        d = pend_d[k]
        if carried_at[d] < 0:
            n_prog = _emit(prog, n_prog, n_ops - 1, 1, A_RELEASE, d, emit)
            joined = max(joined, pend_t[k])
    if joined > t:
        floats[R_SYNC_STALL] += joined - t
        t = joined
    ints[I_N_PROGRAM] = n_prog
    # Steady state: wrap-around copies that the next iteration would wait for cost time here.
    late = _boundary_stall(d_kind, d_wrap, d_sid, d_back, land, h2d_start, on_host_at, op_start, h2d_free, t)
    if late > 0.0:
        floats[R_PREFETCH_STALL] += late
        t += late
    floats[R_TIME] = t
    ints[I_PEAK] = peak
    ints[I_LINK] = link
    ints[I_N_LOAD_EVENTS] = n_load
    ints[I_N_HOST_EVENTS] = n_host
    return floats, ints, load_t, load_v, host_t, host_v, op_start, copies[:n_copies], prog[:n_prog]
