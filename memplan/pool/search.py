"""Exact search over canonical pool layouts (minimalloc, Moffitt ASPLOS'23).

Given a capacity, a depth-first search places buffers one at a time, each at the lowest
offset its already placed time-neighbours leave free, in non-decreasing offset order
(every layout can be rearranged into such a "canonical" one). Pruning:
  - dominance: a buffer is never placed at or above the lowest top some other unplaced
    buffer could reach (that would leave a gap the other could fill);
  - section inference: in every time section, the floor (max of the current offset, the
    tops placed there and the lowest offset any unplaced buffer there can still take) plus
    the sizes still unplaced there must fit the capacity;
  - hatless pruning: when the buffer just placed constrains no unplaced buffer and its
    subtree failed, no sibling can succeed;
  - decomposition: a boundary no unplaced buffer crosses splits the problem in time.
Candidates are tried by lowest possible offset, ties by a static preorder. Which preorder
finds a layout fast is luck (heavy-tailed run times), so every capacity is attempted in
rounds: each preorder of PREORDERS with a node limit that doubles every round, spread over
threads. A round's answer is that of the first preorder (in PREORDERS order) that concluded,
so the result does not depend on thread timing.

`improve` drives it: capacity = peak load first (optimal if found), then a descent between
the largest capacity proven infeasible and the best footprint found, until the deadline.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from .greedy import _range_max, conflict_graph
from .problem import PoolProblem

log = logging.getLogger(__name__)

FOUND, NOT_FOUND, ABORTED = 1, 0, -1
FIRST_NODE_LIMIT = 2048  # nodes per preorder in the first round; doubles every round
LOWER_BOUND_SHARE = 0.5  # share of the time limit spent trying capacity = peak load first
STEP_SHARE = 0.1  # share of the time limit one descent step may take
MAX_SEARCH_BUFFERS = 4000  # above this, each node costs too much; the portfolio result stands
CHECK_CLOCK_EVERY = 256  # nodes between two looks at the clock and the stop flag
_clock_gettime = ctypes.CDLL(None).clock_gettime  # wall clock callable from numba (no GIL needed)
_clock_gettime.restype, _clock_gettime.argtypes = ctypes.c_int, (ctypes.c_int, ctypes.c_void_p)
CLOCK_MONOTONIC = 1  # Linux's id; the same clock as time.monotonic_ns()
NS_PER_S = 1_000_000_000
# nodes[] fields shared between the driver and the kernel
_N_COUNT, _N_LIMIT, _N_DEADLINE, _N_INDEX = range(4)
_KIND_MIN_OFF, _KIND_FLOOR, _KIND_TOTAL, _KIND_CUT = 0, 1, 2, 3
# Static preorders tried round-robin (minimalloc's letters, larger first): A area, C sections
# spanned, L start, O overlaps, T largest section total, U end, W lifetime width, Z size.
# minimalloc's three first, then those that solved other challenging files in a screen of
# all 336 three-letter orders (benchmarks/results/pool_preorder_screen.md).
PREORDERS = ("TWA", "WAT", "TAW", "TOW", "CAT", "UTW", "AZO", "TCA")


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
def _candidates(sizes, rank, off, min_off, last_off, last_rank, sec_lo, sec_hi, slo, shi, limit, twin):
    """Unplaced buffers of section range [slo, shi) worth trying next, best first (-1 first if none
    left); none placed above offset `limit` (see `_offset_limit`), none before its twin."""
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
        if off[i] >= 0 or sec_lo[i] < slo or sec_hi[i] > shi or min_off[i] >= min_height or min_off[i] > limit:
            continue
        if min_off[i] < last_off or (min_off[i] == last_off and rank[i] < last_rank):
            continue  # not canonical: offsets must not decrease along the search path
        if twin[i] >= 0 and off[twin[i]] < 0:
            continue  # identical buffers are interchangeable: place them in index order
        keys[m] = min_off[i] * n + rank[i]
        ids[m] = i
        m += 1
    return ids[:m][np.argsort(keys[:m])]


@numba.njit(cache=True)
def _offset_limit(floor, total, cap, slo, shi):
    """The highest offset at which the next buffer passes the section check, -1 if none does.

    Placing buffer c at o (its lowest offset, so no floor in its lifetime exceeds o) makes
    every section s in range need max(o, floor[s]) + total[s] <= cap, c's own sections
    included (its top o + size replaces the floor and its size leaves the total). The
    condition depends on o alone, so it is computed once per node, not per candidate.
    """
    limit = cap
    for s in range(slo, shi):
        if floor[s] + total[s] > cap:
            return -1
        limit = min(limit, cap - total[s])
    return limit


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
    hatless = True
    for p in range(indptr[c], indptr[c + 1]):
        nb = indices[p]
        hatless = hatless and off[nb] >= 0
        if off[nb] < 0 and min_off[nb] < h:
            _push(logp, log_kind, log_idx, log_val, _KIND_MIN_OFF, nb, min_off[nb])
            min_off[nb] = h
    # Floors only after every neighbour's lowest offset moved up, so each is computed once, from final values.
    for p in range(indptr[c], indptr[c + 1]):
        nb = indices[p]
        if off[nb] < 0 and min_off[nb] == h:
            for s in range(sec_lo[nb], sec_hi[nb]):
                if stamp[1 + s] != tag:
                    stamp[1 + s] = tag
                    _raise_floor(s, off, min_off, floor, sec_ptr, sec_members, logp, log_kind, log_idx, log_val)
    split = False
    for b in range(sec_lo[c], sec_hi[c] - 1):
        _push(logp, log_kind, log_idx, log_val, _KIND_CUT, b, cuts[b])
        cuts[b] -= 1
        split = split or cuts[b] == 0
    return split, hatless


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


@numba.njit  # not cached, like everything that calls a ctypes function
def _now_ns():
    buf = np.zeros(2, np.int64)  # struct timespec {seconds, nanoseconds}
    _clock_gettime(CLOCK_MONOTONIC, buf.ctypes.data)
    return buf[0] * NS_PER_S + buf[1]


@numba.njit
def _should_stop(nodes, first_done):
    """Node limit reached, deadline passed, or an earlier preorder of this round concluded."""
    if nodes[_N_COUNT] > nodes[_N_LIMIT]:
        return True
    if nodes[_N_COUNT] % CHECK_CLOCK_EVERY != 0:
        return False
    return first_done[0] < nodes[_N_INDEX] or _now_ns() > nodes[_N_DEADLINE]


@numba.njit(nogil=True)  # no cache=True: numba's on-disk cache of recursive functions crashes on reload
def _dfs(sizes, indptr, indices, sec_lo, sec_hi, rank, cap, off, min_off, floor, total, cuts,
         logp, log_kind, log_idx, log_val, placed, nplaced, nodes, first_done, sec_ptr, sec_members, stamp, twin, slo, shi, last_off, last_rank, split):
    """Search section range [slo, shi); with `split`, first solve its independent parts one by one."""
    if split:
        lo = slo
        for b in range(slo, shi):
            if b == shi - 1 or cuts[b] == 0:
                status = _dfs(sizes, indptr, indices, sec_lo, sec_hi, rank, cap, off, min_off, floor, total, cuts,
                              logp, log_kind, log_idx, log_val, placed, nplaced, nodes, first_done, sec_ptr, sec_members, stamp, twin, lo, b + 1, -1, -1, False)
                if status != FOUND:
                    return status
                lo = b + 1
        return FOUND
    nodes[_N_COUNT] += 1
    if _should_stop(nodes, first_done):
        return ABORTED
    limit = _offset_limit(floor, total, cap, slo, shi)
    cands = _candidates(sizes, rank, off, min_off, last_off, last_rank, sec_lo, sec_hi, slo, shi, limit, twin)
    if len(cands) == 1 and cands[0] < 0:
        return FOUND
    for c in cands:
        o = min_off[c]
        h = o + sizes[c]
        mark, pmark = logp[0], nplaced[0]
        placed[nplaced[0]] = c
        nplaced[0] += 1
        now_split, hatless = _place(c, h, sizes, indptr, indices, sec_lo, sec_hi, off, min_off, floor, total, cuts,
                           logp, log_kind, log_idx, log_val, sec_ptr, sec_members, stamp)
        status = NOT_FOUND
        if _sections_fit(o, floor, total, cap, slo, shi):
            status = _dfs(sizes, indptr, indices, sec_lo, sec_hi, rank, cap, off, min_off, floor, total, cuts,
                          logp, log_kind, log_idx, log_val, placed, nplaced, nodes, first_done, sec_ptr, sec_members, stamp, twin, slo, shi, o, rank[c], now_split)
        if status == FOUND:
            return FOUND
        _undo(mark, logp, log_kind, log_idx, log_val, min_off, floor, total, cuts)
        while nplaced[0] > pmark:
            nplaced[0] -= 1
            off[placed[nplaced[0]]] = -1
        if status == ABORTED:
            return ABORTED
        if hatless:
            break  # c constrains no unplaced buffer: with it here failing, no sibling can succeed
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
        self.twin = _twins(problem)
        spans = int((self.sec_hi - self.sec_lo).sum())
        self.log_size = 4 * spans + len(self.indices) + len(self.section_total) * problem.n + 1
        # Buffers alive in each section (CSR), for the unplaced-floor inference.
        members = [np.nonzero((self.sec_lo <= k) & (self.sec_hi > k))[0] for k in range(len(self.section_total))]
        self.sec_ptr = np.concatenate([[0], np.cumsum([len(m) for m in members])]).astype(np.int64)
        self.sec_members = np.concatenate(members).astype(np.int64) if members else np.zeros(0, np.int64)
        # Threads for a round: the host's cores, at most one per preorder.
        self.threads = max(1, min(len(PREORDERS), len(os.sched_getaffinity(0))))

    def _preorders(self) -> list[np.ndarray]:
        """One rank array per heuristic of PREORDERS (rank[i] = position of buffer i)."""
        p = self.problem
        length = p.ends - p.starts
        keys = {"A": p.sizes * length, "C": self.sec_hi - self.sec_lo, "L": p.starts,
                "O": np.diff(self.indptr), "T": _range_max(self.section_total, self.sec_lo, self.sec_hi),
                "U": p.ends, "W": length, "Z": p.sizes}
        ids = np.arange(p.n)
        ranks = []
        for heuristic in PREORDERS:
            # Larger first for every letter, the first letter deciding; ties by buffer index.
            rank = np.empty(p.n, np.int64)
            rank[np.lexsort((ids, *(-keys[letter] for letter in reversed(heuristic))))] = ids
            ranks.append(rank)
        return ranks

    def run(self, cap: int, rank: np.ndarray, node_limit: int, deadline_ns: int, index: int = 0,
            first_done: np.ndarray | None = None) -> tuple[int, np.ndarray]:
        """One bounded search at capacity `cap` with one preorder; returns (status, offsets).

        It aborts at `node_limit` nodes, at `deadline_ns` (time.monotonic_ns()), or once
        first_done[0] (shared by a round's threads) drops below `index`.
        """
        n = self.problem.n
        off = np.full(n, -1, np.int64)
        state = (np.zeros(n, np.int64), np.zeros(len(self.section_total), np.int64), self.section_total.copy(),
                 self.cuts.copy())
        logs = (np.zeros(1, np.int64), np.empty(self.log_size, np.int8), np.empty(self.log_size, np.int64),
                np.empty(self.log_size, np.int64))
        nodes = np.array([0, node_limit, deadline_ns, index], np.int64)
        first_done = first_done if first_done is not None else np.array([index + 1], np.int64)
        placed, nplaced = np.empty(n, np.int64), np.zeros(1, np.int64)
        stamp = np.zeros(len(self.section_total) + 1, np.int64)
        status = _dfs(self.problem.sizes, self.indptr, self.indices, self.sec_lo, self.sec_hi, rank, cap, off,
                      *state, *logs, placed, nplaced, nodes, first_done, self.sec_ptr, self.sec_members, stamp,
                      self.twin, 0, len(self.section_total), -1, -1, True)
        return int(status), off

    def attempt(self, cap: int, deadline_ns: int) -> tuple[int, np.ndarray | None]:
        """Rounds over all preorders with doubling node limits until found, refuted or deadline."""
        limit = FIRST_NODE_LIMIT
        with ThreadPoolExecutor(self.threads) as pool:
            while time.monotonic_ns() < deadline_ns:
                status, off = self._round(cap, limit, deadline_ns, pool)
                if status != ABORTED:
                    return status, off
                limit *= 2
        return ABORTED, None

    def _round(self, cap: int, limit: int, deadline_ns: int, pool) -> tuple[int, np.ndarray | None]:
        """Every preorder once with `limit` nodes; the first one (in PREORDERS order) that
        concluded decides, and later ones stop as soon as it has."""
        first_done = np.array([len(self.ranks)], np.int64)
        lock = threading.Lock()

        def task(k):
            if first_done[0] < k:
                return ABORTED, None
            status, off = self.run(cap, self.ranks[k], limit, deadline_ns, k, first_done)
            if status != ABORTED:
                with lock:
                    first_done[0] = min(first_done[0], k)
            return status, off

        for status, off in pool.map(task, range(len(self.ranks))):
            if status != ABORTED:
                return status, (off if status == FOUND else None)
        return ABORTED, None


def compile_kernel() -> None:
    """Compile the search kernel now (numba cannot cache it on disk; the first search in a
    process otherwise pays about 3 s of its time limit for it)."""
    tiny = PoolProblem(starts=np.array([0, 1]), ends=np.array([2, 3]), sizes=np.array([1, 1]),
                       storages=np.arange(2), names=("0", "1"), roles=np.zeros(2, np.int8))
    searcher = _Searcher(tiny, conflict_graph(tiny))
    searcher.run(2, searcher.ranks[0], 1, time.monotonic_ns() + NS_PER_S)


def _twins(problem: PoolProblem) -> np.ndarray:
    """For each buffer, the previous buffer (by index) with the same lifetime and size, or -1.

    Twins tie on every preorder key, so the index orders them in every preorder.
    """
    twin = np.full(problem.n, -1, np.int64)
    order = np.lexsort((np.arange(problem.n), problem.sizes, problem.ends, problem.starts))
    same = ((problem.starts[order][1:] == problem.starts[order][:-1]) & (problem.ends[order][1:] == problem.ends[order][:-1])
            & (problem.sizes[order][1:] == problem.sizes[order][:-1]))
    twin[order[1:][same]] = order[:-1][same]
    return twin


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
        footprint is proven smallest) and "lower_bound" (no layout fits below it: the peak
        load, or one more than the largest capacity the search refuted).
    """
    lower = problem.peak_load_bytes
    if footprint <= lower:
        return offsets, footprint, {"search": "skipped", "optimal": True, "lower_bound": lower}
    if problem.n > MAX_SEARCH_BUFFERS:
        return offsets, footprint, {"search": "skipped"}
    searcher = _Searcher(problem, graph)
    now_ns = time.monotonic_ns()
    end_ns = now_ns + int(max(deadline - time.perf_counter(), 0.0) * NS_PER_S)
    status, found = searcher.attempt(lower, now_ns + int(LOWER_BOUND_SHARE * (end_ns - now_ns)))
    if status == FOUND:
        return found, _top(problem, found), {"search": "found peak load", "optimal": True, "lower_bound": lower}
    if status == NOT_FOUND:
        lower += 1
    best, best_fp = offsets, footprint
    step = (best_fp - lower) // 2
    slice_ns = int(STEP_SHARE * (end_ns - now_ns))
    while step > 0 and lower < best_fp and time.monotonic_ns() < end_ns:
        # A looser capacity is found fast; a refuted one raises the bound; an undecided one halves the step.
        cap = best_fp - step
        status, found = searcher.attempt(cap, min(end_ns, time.monotonic_ns() + slice_ns))
        if status == FOUND:
            best, best_fp = found, _top(problem, found)
        elif status == NOT_FOUND:
            lower = cap + 1
        if status != FOUND:
            step //= 2
        step = min(step, (best_fp - lower + 1) // 2) if best_fp > lower else 0
    log.info("search: footprint %d, proven lower bound %d", best_fp, lower)
    return best, best_fp, {"search": "descent", "optimal": best_fp == lower, "lower_bound": lower}


def _top(problem: PoolProblem, offsets: np.ndarray) -> int:
    return int((offsets + problem.sizes).max())
