"""Exact search over canonical pool layouts (in the spirit of minimalloc, Moffitt ASPLOS'23).

Given a capacity, a depth-first search places buffers one at a time, each at the lowest
offset its already placed time-neighbours leave free, in non-decreasing offset order
(every layout can be rearranged into such a "canonical" one). Pruning:
  - dominance: a buffer is never placed at or above the lowest top some other unplaced
    buffer could reach (that would leave a gap the other could fill);
  - section inference: in every time section, the floor (max of the current offset and
    the tops placed there) plus the sizes still unplaced there must fit the capacity.
Candidates are tried by lowest possible offset, ties by a static preorder (largest
section total, area, width), round-robin over three preorders with doubling node limits.

`improve` drives it: capacity = peak load first (optimal if found), then a descent from
the best footprint found (try best - step; on failure halve the step), until the deadline.
"""

from __future__ import annotations

import ctypes
import logging
import time

import numba
import numpy as np

from .problem import PoolProblem

log = logging.getLogger(__name__)

FOUND, NOT_FOUND, ABORTED = 1, 0, -1
FIRST_NODE_LIMIT = 2048  # nodes in the first round-robin round; doubles every round
LOWER_BOUND_SHARE = 0.3  # share of the time limit spent trying capacity = peak load first
STEP_SHARE = 0.1  # share of the time limit one descent step may take
MIN_NODES_FOR_RATE = 10_000  # node-rate estimates come from runs at least this long
MAX_SEARCH_BUFFERS = 4000  # above this, each node costs too much; the portfolio result stands
CHECK_CLOCK_EVERY = 256  # nodes between two looks at the clock inside the search
_libc_clock = ctypes.CDLL(None).clock  # process CPU time in CLOCKS_PER_SEC units, callable from numba
_libc_clock.restype, _libc_clock.argtypes = ctypes.c_long, ()
CLOCKS_PER_SEC = 1_000_000  # POSIX requires this value
_KIND_MIN_OFF, _KIND_FLOOR, _KIND_TOTAL, _KIND_CUT = 0, 1, 2, 3


@numba.njit(cache=True)
def _undo(mark, logp, log_kind, log_idx, log_val, min_off, floor, total, cuts):
    while logp[0] > mark:
        logp[0] -= 1
        p = logp[0]
        kind, idx = log_kind[p], log_idx[p]
        if kind == _KIND_MIN_OFF:
            min_off[idx] = log_val[p]
        elif kind == _KIND_FLOOR:
            floor[idx] = log_val[p]
        elif kind == _KIND_TOTAL:
            total[idx] = log_val[p]
        else:
            cuts[idx] = log_val[p]


@numba.njit(cache=True)
def _push(logp, log_kind, log_idx, log_val, kind, idx, val):
    p = logp[0]
    log_kind[p], log_idx[p], log_val[p] = kind, idx, val
    logp[0] = p + 1


@numba.njit(cache=True)
def _candidates(sizes, rank, off, min_off, last_off, last_rank, sec_lo, sec_hi, slo, shi):
    """Unplaced buffers of section range [slo, shi) worth trying next, best first (-1 first if none left)."""
    n = len(sizes)
    min_height = np.iinfo(np.int64).max
    left = 0
    for i in range(n):
        if off[i] < 0 and sec_lo[i] >= slo and sec_hi[i] <= shi:
            min_height = min(min_height, min_off[i] + sizes[i])
            left += 1
    if left == 0:
        return np.full(1, -1, np.int64)
    keys = np.empty(left, np.int64)
    ids = np.empty(left, np.int64)
    m = 0
    for i in range(n):
        if off[i] >= 0 or sec_lo[i] < slo or sec_hi[i] > shi or min_off[i] >= min_height:
            continue
        if min_off[i] < last_off or (min_off[i] == last_off and rank[i] < last_rank):
            continue  # not canonical: offsets must not decrease along the search path
        keys[m] = min_off[i] * n + rank[i]
        ids[m] = i
        m += 1
    return ids[:m][np.argsort(keys[:m])]


@numba.njit(cache=True)
def _sections_fit(offset, floor, total, cap, slo, shi):
    for s in range(slo, shi):
        if max(offset, floor[s]) + total[s] > cap:
            return False
    return True


@numba.njit(cache=True)
def _place(c, h, sizes, indptr, indices, sec_lo, sec_hi, off, min_off, floor, total, cuts,
           logp, log_kind, log_idx, log_val, sec_ptr, sec_members, stamp):
    """Place buffer c with top h; returns True when it leaves a boundary no unplaced buffer crosses."""
    off[c] = h - sizes[c]
    stamp[0] += 1
    tag = stamp[0]
    for s in range(sec_lo[c], sec_hi[c]):
        _push(logp, log_kind, log_idx, log_val, _KIND_FLOOR, s, floor[s])
        _push(logp, log_kind, log_idx, log_val, _KIND_TOTAL, s, total[s])
        floor[s] = h
        total[s] -= sizes[c]
    for p in range(indptr[c], indptr[c + 1]):
        nb = indices[p]
        if off[nb] < 0 and min_off[nb] < h:
            _push(logp, log_kind, log_idx, log_val, _KIND_MIN_OFF, nb, min_off[nb])
            min_off[nb] = h
            for s in range(sec_lo[nb], sec_hi[nb]):
                if stamp[1 + s] != tag:
                    stamp[1 + s] = tag
                    _raise_floor(s, off, min_off, floor, sec_ptr, sec_members, logp, log_kind, log_idx, log_val)
    split = False
    for b in range(sec_lo[c], sec_hi[c] - 1):
        _push(logp, log_kind, log_idx, log_val, _KIND_CUT, b, cuts[b])
        cuts[b] -= 1
        split = split or cuts[b] == 0
    return split


@numba.njit(cache=True)
def _raise_floor(s, off, min_off, floor, sec_ptr, sec_members, logp, log_kind, log_idx, log_val):
    """A section's floor is at least the lowest offset any of its unplaced buffers can take."""
    low = np.iinfo(np.int64).max
    for q in range(sec_ptr[s], sec_ptr[s + 1]):
        b = sec_members[q]
        if off[b] < 0 and min_off[b] < low:
            low = min_off[b]
    if low != np.iinfo(np.int64).max and floor[s] < low:
        _push(logp, log_kind, log_idx, log_val, _KIND_FLOOR, s, floor[s])
        floor[s] = low


@numba.njit  # no cache=True: numba's on-disk cache of recursive functions crashes on reload
def _dfs(sizes, indptr, indices, sec_lo, sec_hi, rank, cap, off, min_off, floor, total, cuts,
         logp, log_kind, log_idx, log_val, placed, nplaced, nodes, sec_ptr, sec_members, stamp, slo, shi, last_off, last_rank, split):
    """Search section range [slo, shi); with `split`, first solve its independent parts one by one."""
    if split:
        lo = slo
        for b in range(slo, shi):
            if b == shi - 1 or cuts[b] == 0:
                status = _dfs(sizes, indptr, indices, sec_lo, sec_hi, rank, cap, off, min_off, floor, total, cuts,
                              logp, log_kind, log_idx, log_val, placed, nplaced, nodes, sec_ptr, sec_members, stamp, lo, b + 1, -1, -1, False)
                if status != FOUND:
                    return status
                lo = b + 1
        return FOUND
    nodes[0] += 1
    if nodes[0] > nodes[1] or (nodes[0] % CHECK_CLOCK_EVERY == 0 and _libc_clock() > nodes[2]):
        return ABORTED
    cands = _candidates(sizes, rank, off, min_off, last_off, last_rank, sec_lo, sec_hi, slo, shi)
    if len(cands) == 1 and cands[0] < 0:
        return FOUND
    for c in cands:
        o = min_off[c]
        h = o + sizes[c]
        if h > cap:
            continue
        mark, pmark = logp[0], nplaced[0]
        placed[nplaced[0]] = c
        nplaced[0] += 1
        now_split = _place(c, h, sizes, indptr, indices, sec_lo, sec_hi, off, min_off, floor, total, cuts,
                           logp, log_kind, log_idx, log_val, sec_ptr, sec_members, stamp)
        status = NOT_FOUND
        if _sections_fit(o, floor, total, cap, slo, shi):
            status = _dfs(sizes, indptr, indices, sec_lo, sec_hi, rank, cap, off, min_off, floor, total, cuts,
                          logp, log_kind, log_idx, log_val, placed, nplaced, nodes, sec_ptr, sec_members, stamp, slo, shi, o, rank[c], now_split)
        if status == FOUND:
            return FOUND
        _undo(mark, logp, log_kind, log_idx, log_val, min_off, floor, total, cuts)
        while nplaced[0] > pmark:
            nplaced[0] -= 1
            off[placed[nplaced[0]]] = -1
        if status == ABORTED:
            return ABORTED
    return NOT_FOUND


class _Searcher:
    """Static data of one problem for repeated capacity searches."""

    def __init__(self, problem: PoolProblem, graph):
        self.problem = problem
        self.indptr, self.indices = graph
        times = np.unique(np.concatenate([problem.starts, problem.ends]))
        self.sec_lo = np.searchsorted(times, problem.starts).astype(np.int64)
        self.sec_hi = np.searchsorted(times, problem.ends).astype(np.int64)
        delta = np.zeros(len(times), np.int64)
        np.add.at(delta, self.sec_lo, problem.sizes)
        np.add.at(delta, self.sec_hi, -problem.sizes)
        self.section_total = np.cumsum(delta)[:-1].copy()
        # cuts[b]: buffers alive in both section b and b+1 (a zero cut splits the problem in time)
        cut_delta = np.zeros(len(times), np.int64)
        np.add.at(cut_delta, self.sec_lo, 1)
        np.add.at(cut_delta, self.sec_hi - 1, -1)
        self.cuts = np.cumsum(cut_delta)[: max(len(times) - 2, 0)].copy()
        self.ranks = self._preorders()
        spans = int((self.sec_hi - self.sec_lo).sum())
        self.log_size = 4 * spans + len(self.indices) + len(self.section_total) * problem.n + 1
        # Buffers alive in each section (CSR), for the unplaced-floor inference.
        members = [np.nonzero((self.sec_lo <= k) & (self.sec_hi > k))[0] for k in range(len(self.section_total))]
        self.sec_ptr = np.concatenate([[0], np.cumsum([len(m) for m in members])]).astype(np.int64)
        self.sec_members = np.concatenate(members).astype(np.int64) if members else np.zeros(0, np.int64)
        self.nodes_per_s = 2e5  # refined after every run

    def _preorders(self) -> list[np.ndarray]:
        p = self.problem
        tot = np.array([self.section_total[lo:hi].max() for lo, hi in zip(self.sec_lo, self.sec_hi)])
        area = p.sizes * (p.ends - p.starts)
        width = self.sec_hi - self.sec_lo
        ids = np.arange(p.n)
        keys = {"TAW": (ids, -width, -area, -tot), "WAT": (ids, -tot, -area, -width), "TWA": (ids, -area, -width, -tot)}
        ranks = []
        for key in keys.values():
            rank = np.empty(p.n, np.int64)
            rank[np.lexsort(key)] = ids
            ranks.append(rank)
        return ranks

    def run(self, cap: int, rank: np.ndarray, node_limit: int, seconds: float = 1e9) -> tuple[int, np.ndarray]:
        """One bounded search at capacity `cap`; returns (status, offsets)."""
        n = self.problem.n
        off = np.full(n, -1, np.int64)
        state = (np.zeros(n, np.int64), np.zeros(len(self.section_total), np.int64), self.section_total.copy(),
                 self.cuts.copy())
        logs = (np.zeros(1, np.int64), np.empty(self.log_size, np.int8), np.empty(self.log_size, np.int64),
                np.empty(self.log_size, np.int64))
        clock_deadline = _libc_clock() + int(min(seconds, 1e6) * CLOCKS_PER_SEC)
        nodes = np.array([0, node_limit, clock_deadline], np.int64)
        placed, nplaced = np.empty(n, np.int64), np.zeros(1, np.int64)
        started = time.perf_counter()
        stamp = np.zeros(len(self.section_total) + 1, np.int64)
        status = _dfs(self.problem.sizes, self.indptr, self.indices, self.sec_lo, self.sec_hi, rank, cap, off,
                      *state, *logs, placed, nplaced, nodes, self.sec_ptr, self.sec_members, stamp, 0, len(self.section_total), -1, -1, True)
        elapsed = time.perf_counter() - started
        if nodes[0] >= MIN_NODES_FOR_RATE:  # small runs are dominated by JIT compilation
            self.nodes_per_s = max(min(nodes[0], node_limit) / elapsed, 1.0)
        return int(status), off

    def attempt(self, cap: int, deadline: float) -> tuple[int, np.ndarray | None]:
        """Round-robin over preorders with doubling node limits until found, refuted or deadline."""
        limit = FIRST_NODE_LIMIT
        while True:
            for rank in self.ranks:
                left = deadline - time.perf_counter()
                if left <= 0:
                    return ABORTED, None
                status, off = self.run(cap, rank, limit, left)
                if status != ABORTED:
                    return status, (off if status == FOUND else None)
            limit *= 2


def improve(problem: PoolProblem, graph, offsets: np.ndarray, footprint: int, deadline: float,
            seed: int = 0) -> tuple[np.ndarray, int, dict]:
    """Search for a layout smaller than `footprint` until `deadline` (a perf_counter time).

    Args:
        problem: the buffers.
        graph: its conflict graph (CSR).
        offsets, footprint: the best layout so far (kept when nothing better is found).
        deadline: time.perf_counter() value at which to stop.
        seed: unused by the deterministic search (kept for the allocator interface).
    Returns:
        (offsets, footprint, facts) with facts "search" (what happened), "optimal" (the
        footprint equals the peak load) and "lower_bound" (largest capacity proven infeasible + 1).
    """
    lower = problem.peak_load_bytes
    if problem.n > MAX_SEARCH_BUFFERS or footprint <= lower:
        return offsets, footprint, {"search": "skipped"}
    searcher = _Searcher(problem, graph)
    started = time.perf_counter()
    status, found = searcher.attempt(lower, started + LOWER_BOUND_SHARE * (deadline - started))
    if status == FOUND:
        return found, int((found + problem.sizes).max()), {"search": "found peak load", "optimal": True}
    best, best_fp = offsets, footprint
    step = (best_fp - lower) // 2
    slice_s = STEP_SHARE * (deadline - started)
    while step > 0 and time.perf_counter() < deadline:
        # Descend from the best layout: a looser capacity is found fast, a failed one halves the step.
        cap = best_fp - step
        status, found = searcher.attempt(cap, min(deadline, time.perf_counter() + slice_s))
        if status == FOUND:
            best, best_fp = found, int((found + problem.sizes).max())
        else:
            step //= 2
    log.info("search: footprint %d (peak load %d)", best_fp, lower)
    return best, best_fp, {"search": "descent", "optimal": best_fp == lower}
