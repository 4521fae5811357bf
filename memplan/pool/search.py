"""The exact search over canonical pool layouts (minimalloc, Moffitt ASPLOS'23) and its driver.

The search (native.c) places buffers one at a time, each at the lowest offset its placed
time-neighbours leave free, offsets never decreasing along a path (every layout can be
rearranged into such a canonical one), candidates by (lowest offset, preorder rank). Rules:
  1. dominance: no buffer at or above the lowest top another unplaced buffer could reach;
  2. section inference: in every time section, the floor (max of the current offset, the tops
     placed there and the lowest offset any unplaced buffer there can take) plus the sizes
     still unplaced there must fit the capacity;
  3. hatless pruning: when the buffer just placed constrains no unplaced buffer and its subtree
     failed, no sibling can succeed;
  4. decomposition: a section boundary no unplaced buffer crosses splits the problem in time;
     the parts are solved one after the other without backtracking between them, each ranked
     afresh by its preorder with T from the sizes still unplaced (as minimalloc does; with a
     static T, minimalloc's own preorders miss challenging file I);
  5. (ours) a per-node offset limit from rule 2 rejects every failing candidate at once;
  6. (ours) identical buffers (twins) are placed in index order;
  7. fixed buffers must land exactly at their given offset (minimalloc's fixed offsets).
It is an explicit stack of frames rather than a recursion, so it stops after any node and
resumes where it stopped.

Which static preorder finds a layout fast is luck (heavy-tailed run times), so a capacity is
attempted in rounds: every preorder's search advances to a node quota that doubles each round.
Searches are resumable, so a round continues where the last one stopped (minimalloc restarts
them instead). A round's answer is that of the first search (in preorder order) that concluded
within its quota, and later searches stop as soon as one has, so the answer does not depend on
thread timing. Searches run on a thread pool (the kernel releases the GIL) in short slices, so
the deadline is looked at between slices, in Python.

`improve` drives it: capacity = peak load first (optimal if found), then a descent between the
largest capacity proven infeasible and the best footprint found, until the deadline.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from . import native
from .greedy import conflict_graph
from .problem import PoolProblem

log = logging.getLogger(__name__)

FOUND, NOT_FOUND, RUNNING = 1, 0, -1  # mp_search_advance's answers
ABORTED = RUNNING  # a search that neither found nor refuted before its quota or the deadline
FIRST_NODE_LIMIT = 2048  # nodes per preorder in the first round; doubles every round
LOWER_BOUND_SHARE = 0.5  # share of the time limit spent trying capacity = peak load first
STEP_SHARE = 0.1  # share of the time limit one descent step may take
SLICE_S = 0.01  # a search looks at the clock about this often
FIRST_SLICE_NODES = 256
# Static preorders tried round-robin (minimalloc's letters, larger first): A area, C sections
# spanned, L start, O overlaps, T largest section total, U end, W lifetime width, Z size.
# minimalloc's three first, then those that solved other challenging files in a screen of
# all 336 three-letter orders (benchmarks/results/pool_preorder_screen.md).
PREORDERS = ("TWA", "WAT", "TAW", "TOW", "CAT", "UTW", "AZO", "TCA")


def default_threads() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _Searcher:
    """Static data of one problem for repeated capacity searches.

    Args:
        problem: the buffers.
        graph: its conflict graph (CSR).
        fixed: per buffer, the offset it must take, or -1 (default: none fixed).
        preorders: the heuristics (letters of PREORDERS' comment) searched in a round.
    """

    def __init__(self, problem: PoolProblem, graph, fixed: np.ndarray | None = None,
                 preorders: tuple[str, ...] = PREORDERS):
        self.problem = problem
        self.indptr, self.indices = graph
        times = np.unique(np.concatenate([problem.starts, problem.ends]))
        self.sec_lo = np.searchsorted(times, problem.starts).astype(np.int64)
        self.sec_hi = np.searchsorted(times, problem.ends).astype(np.int64)
        sections = max(len(times) - 1, 0)
        delta = np.zeros(len(times), np.int64)
        np.add.at(delta, self.sec_lo, problem.sizes)
        np.add.at(delta, self.sec_hi, -problem.sizes)
        self.section_total = np.cumsum(delta)[:sections].copy()
        # cuts[b]: buffers alive in both section b and b+1 (a zero cut splits the problem in time)
        cut_delta = np.zeros(len(times), np.int64)
        np.add.at(cut_delta, self.sec_lo, 1)
        np.add.at(cut_delta, self.sec_hi - 1, -1)
        self.cuts = np.cumsum(cut_delta)[: max(sections - 1, 0)].copy()
        self.fixed = np.full(problem.n, -1, np.int64) if fixed is None else native.i64(fixed)
        self.preorders = self._preorders(preorders)
        self.arrays = {"sizes": native.i64(problem.sizes), "indptr": native.i64(self.indptr),
                       "indices": np.ascontiguousarray(self.indices, np.int32), "sec_lo": self.sec_lo, "sec_hi": self.sec_hi,
                       **_section_members(self.sec_lo, self.sec_hi, sections), **_by_start_section(self.sec_lo, sections),
                       "twin": _twins(problem, self.fixed), "fixed": self.fixed, "section_total": self.section_total,
                       "cuts": self.cuts}
        self.sections = sections

    def _preorders(self, heuristics: tuple[str, ...]) -> list[tuple[np.ndarray, int]]:
        """Per heuristic, its letters' keys (one row each, smaller first) and the row
        of T (filled in by the kernel from the sizes still unplaced; -1 when absent)."""
        p = self.problem
        length = p.ends - p.starts
        keys = {"A": p.sizes * length, "C": self.sec_hi - self.sec_lo, "L": p.starts, "O": np.diff(self.indptr),
                "T": np.zeros(p.n, np.int64), "U": p.ends, "W": length, "Z": p.sizes}
        return [(native.i64(-np.stack([keys[letter] for letter in heuristic])), heuristic.find("T"))
                for heuristic in heuristics]

    def start(self, cap: int, preorder: int) -> "_Run":
        """A fresh search at capacity `cap` with the preorder-th heuristic."""
        keys, t_row = self.preorders[preorder]
        struct = native.Problem(n=self.problem.n, sections=self.sections, nkeys=len(keys), t_row=t_row,
                                keys=native.ptr(keys), **{k: native.ptr(v) for k, v in self.arrays.items()})
        return _Run(struct, (self.arrays, keys), cap)

    def run(self, cap: int, preorder: int, node_limit: int, deadline: float = float("inf")) -> tuple[int, np.ndarray]:
        """One bounded search at capacity `cap` with the preorder-th heuristic; returns (status, offsets).

        It stops (ABORTED) after `node_limit` nodes or at `deadline` (a time.monotonic() value).
        """
        search = self.start(cap, preorder)
        status = search.advance_to(node_limit, deadline)
        return status, search.offsets()

    def attempt(self, cap: int, deadline: float, threads: int | None = None) -> "Attempt":
        """Rounds over all preorders with doubling node quotas until found, refuted or `deadline`."""
        threads = max(1, min(threads or default_threads(), len(self.preorders)))
        searches = [self.start(cap, k) for k in range(len(self.preorders))]
        quota = FIRST_NODE_LIMIT
        with ThreadPoolExecutor(threads) as pool:
            while time.monotonic() < deadline:
                winner = _round(searches, quota, deadline, pool if threads > 1 else None)
                if winner is not None:
                    status = winner.status
                    return Attempt(status, winner.offsets() if status == FOUND else None, _nodes(searches))
                quota *= 2
        return Attempt(ABORTED, None, _nodes(searches))


@dataclass(frozen=True)
class Attempt:
    """The outcome of `_Searcher.attempt`."""

    status: int  # FOUND, NOT_FOUND or ABORTED
    offsets: np.ndarray | None  # the layout when FOUND
    nodes: int  # search nodes spent over all preorders


class _Run:
    """One resumable search (one capacity, one preorder) in native.c."""

    def __init__(self, struct: native.Problem, arrays, cap: int):
        self.lib = native.library()
        self.struct, self.arrays = struct, arrays  # the C side reads them for the run's lifetime
        self.handle = self.lib.mp_search_new(ctypes.byref(struct), cap)
        self.status = RUNNING
        self.slice = FIRST_SLICE_NODES

    def __del__(self):
        if getattr(self, "handle", None):
            self.lib.mp_search_free(self.handle)

    @property
    def nodes(self) -> int:
        """Nodes searched so far."""
        return int(self.lib.mp_search_nodes(self.handle))

    def offsets(self) -> np.ndarray:
        """The layout (-1 for buffers not placed)."""
        out = np.empty(self.struct.n, np.int64)
        self.lib.mp_search_offsets(self.handle, native.ptr(out))
        return out

    def advance_to(self, quota: int, deadline: float, stop: np.ndarray | None = None, index: int = 0) -> int:
        """Search until `quota` nodes in all, a conclusion, `deadline`, or stop[0] < index."""
        stop = np.array([index], np.int64) if stop is None else stop
        while self.status == RUNNING and self.nodes < quota and stop[0] >= index:
            if time.monotonic() >= deadline:
                break
            started = time.monotonic()
            budget = min(quota - self.nodes, self.slice)
            self.status = self.lib.mp_search_advance(self.handle, budget, native.ptr(stop), index)
            self._adapt_slice(budget, time.monotonic() - started)
        return self.status

    def _adapt_slice(self, budget: int, seconds: float) -> None:
        # About SLICE_S per call: the clock is read in Python between calls.
        if seconds < SLICE_S / 2 and budget == self.slice:
            self.slice *= 2
        elif seconds > 2 * SLICE_S and self.slice > 1:
            self.slice //= 2


def _round(searches: list[_Run], quota: int, deadline: float, pool) -> _Run | None:
    """Every search up to `quota` nodes; the first one (in order) that concluded, or None."""
    stop = np.array([len(searches)], np.int64)
    lock = threading.Lock()

    def task(k: int) -> None:
        if searches[k].advance_to(quota, deadline, stop, k) != RUNNING:
            with lock:
                stop[0] = min(stop[0], k)

    if pool is None:
        for k in range(len(searches)):
            task(k)
    else:
        list(pool.map(task, range(len(searches))))
    return next((s for s in searches if s.status != RUNNING), None)


def _nodes(searches: list[_Run]) -> int:
    return sum(s.nodes for s in searches)


def _section_members(sec_lo: np.ndarray, sec_hi: np.ndarray, sections: int) -> dict:
    """Buffers alive in each section, as CSR (sec_ptr, sec_members)."""
    spans = sec_hi - sec_lo
    members = np.repeat(np.arange(len(sec_lo)), spans)
    section = np.repeat(sec_lo - np.concatenate([[0], np.cumsum(spans)[:-1]]), spans) + np.arange(spans.sum())
    order = np.argsort(section, kind="stable")
    counts = np.bincount(section, minlength=sections)
    return {"sec_ptr": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            "sec_members": members[order].astype(np.int64)}


def _by_start_section(sec_lo: np.ndarray, sections: int) -> dict:
    """Buffers ordered by first section, and where each section's starters begin in that order."""
    by_lo = np.argsort(sec_lo, kind="stable").astype(np.int64)
    lo_ptr = np.searchsorted(sec_lo[by_lo], np.arange(sections + 1)).astype(np.int64)
    return {"by_lo": by_lo, "lo_ptr": lo_ptr}


def _twins(problem: PoolProblem, fixed: np.ndarray) -> np.ndarray:
    """For each free buffer, the previous free buffer (by index) with the same lifetime and size, or -1.

    Twins tie on every preorder key, so the index orders them in every preorder.
    """
    twin = np.full(problem.n, -1, np.int64)
    free = np.flatnonzero(fixed < 0)
    order = free[np.lexsort((free, problem.sizes[free], problem.ends[free], problem.starts[free]))]
    same = ((problem.starts[order][1:] == problem.starts[order][:-1]) & (problem.ends[order][1:] == problem.ends[order][:-1])
            & (problem.sizes[order][1:] == problem.sizes[order][:-1]))
    twin[order[1:][same]] = order[:-1][same]
    return twin


def compile_kernel() -> None:
    """Build (once per machine and source version, about a second) and load native.c."""
    native.library()


def improve(problem: PoolProblem, graph, offsets: np.ndarray, footprint: int, deadline: float,
            seed: int = 0, threads: int | None = None) -> tuple[np.ndarray, int, dict]:
    """Search for a layout smaller than `footprint` until `deadline` (a time.monotonic() value).

    Args:
        problem: the buffers.
        graph: its conflict graph (CSR).
        offsets, footprint: the best layout so far (kept when nothing better is found).
        deadline: time.monotonic() value at which to stop.
        seed: unused by the deterministic search (kept for the allocator interface).
        threads: threads for the search (default: the cores this process may use).
    Returns:
        (offsets, footprint, facts) with facts "search" (what happened), "optimal" (the
        footprint is proven smallest), "lower_bound" (no layout fits below it: the peak
        load, or one more than the largest capacity the search refuted) and "search_nodes".
    """
    lower = problem.peak_load_bytes
    if footprint <= lower:
        return offsets, footprint, {"search": "not needed (portfolio at peak load)", "optimal": True,
                                    "lower_bound": lower}
    searcher = _Searcher(problem, graph)
    now = time.monotonic()
    result = searcher.attempt(lower, now + LOWER_BOUND_SHARE * (deadline - now), threads)
    nodes = result.nodes
    if result.status == FOUND:
        return result.offsets, _top(problem, result.offsets), {"search": "found peak load", "optimal": True,
                                                               "lower_bound": lower, "search_nodes": nodes}
    if result.status == NOT_FOUND:
        lower += 1
    best, best_fp = offsets, footprint
    step = (best_fp - lower) // 2
    slice_s = STEP_SHARE * (deadline - now)
    while step > 0 and lower < best_fp and time.monotonic() < deadline:
        # A looser capacity is found fast; a refuted one raises the bound; an undecided one halves the step.
        cap = best_fp - step
        result = searcher.attempt(cap, min(deadline, time.monotonic() + slice_s), threads)
        nodes += result.nodes
        if result.status == FOUND:
            best, best_fp = result.offsets, _top(problem, result.offsets)
        elif result.status == NOT_FOUND:
            lower = cap + 1
        if result.status != FOUND:
            step //= 2
        step = min(step, (best_fp - lower + 1) // 2) if best_fp > lower else 0
    log.info("search: footprint %d, proven lower bound %d", best_fp, lower)
    return best, best_fp, {"search": "descent", "optimal": best_fp == lower, "lower_bound": lower,
                           "search_nodes": nodes}


def _top(problem: PoolProblem, offsets: np.ndarray) -> int:
    return int((offsets + problem.sizes).max())
