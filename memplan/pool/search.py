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
  6. (ours) identical buffers (twins) are placed in index order.
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
from .problem import PoolProblem
from .sections import sections

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
# minimalloc's three and those that solved other challenging files in a screen of all 336
# three-letter orders (benchmarks/results/pool_preorder_screen.md); the ones that solved most
# files first, since earlier preorders of a round run on after a later one concluded.
PREORDERS = ("TWA", "TAW", "TCA", "WAT", "TOW", "CAT", "UTW", "AZO")


def default_threads() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _Searcher:
    """Static data of one problem for repeated capacity searches.

    Args:
        problem: the buffers.
        graph: its conflict graph (CSR).
        preorders: the heuristics (letters of PREORDERS' comment) searched in a round.
    """

    def __init__(self, problem: PoolProblem, graph, preorders: tuple[str, ...] = PREORDERS):
        self.problem = problem
        self.sections = sections(problem)
        self.preorders = [self._preorder(letters, np.diff(graph[0])) for letters in preorders]
        sec = self.sections
        self.arrays = {"sizes": native.i64(problem.sizes), "indptr": native.i64(graph[0]),
                       "indices": np.ascontiguousarray(graph[1], np.int32), "sec_lo": sec.lo, "sec_hi": sec.hi,
                       **_section_members(sec.lo, sec.hi, sec.count), **_by_start_section(sec.lo, sec.count),
                       "twin": _twins(problem), "section_total": sec.total, "cuts": sec.cuts}

    def _preorder(self, letters: str, overlaps: np.ndarray) -> tuple[np.ndarray, int]:
        """The keys of a heuristic's letters (one row each, smaller first) and the row of T (filled
        in by the search from the sizes still unplaced; -1 when absent)."""
        p = self.problem
        length = p.ends - p.starts
        keys = {"A": p.sizes * length, "C": self.sections.hi - self.sections.lo, "L": p.starts, "O": overlaps,
                "T": np.zeros(p.n, np.int64), "U": p.ends, "W": length, "Z": p.sizes}
        return native.i64(-np.stack([keys[letter] for letter in letters])), letters.find("T")

    def start(self, cap: int, preorder: int) -> "_Run":
        """A fresh search at capacity `cap` with the preorder-th heuristic."""
        keys, t_row = self.preorders[preorder]
        struct = native.Problem(n=self.problem.n, sections=self.sections.count, nkeys=len(keys), t_row=t_row,
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


def compile_kernel() -> None:
    """Build (once per machine and source version, about a second) and load native.c."""
    native.library()


def improve(problem: PoolProblem, graph, offsets: np.ndarray, footprint: int, deadline: float,
            seed: int = 0, threads: int | None = None, good_enough: int = 0,
            lower: int | None = None) -> tuple[np.ndarray, int, dict]:
    """Search for a layout smaller than `footprint` until `deadline` (a time.monotonic() value).

    Capacity = the lower bound first (optimal if found; LOWER_BOUND_SHARE of the time), then a
    descent between the largest capacity refuted and the best footprint found.

    Args:
        problem: the buffers.
        graph: its conflict graph (CSR).
        offsets, footprint: the best layout so far (kept when nothing better is found).
        deadline: time.monotonic() value at which to stop.
        seed: unused by the deterministic search (kept for the allocator interface).
        threads: threads for the search (default: the cores this process may use).
        good_enough: stop as soon as the footprint is at most this (or do nothing if it already is).
        lower: a known lower bound (default: the peak load).
    Returns:
        (offsets, footprint, facts) with facts "search" (what happened), "optimal" (the
        footprint is proven smallest), "lower_bound" (no layout fits below it), "finished" (the
        descent has nothing left to try), "search_nodes" and "search_s".
    """
    started = time.monotonic()
    searcher = _Searcher(problem, graph)
    lower = problem.peak_load_bytes if lower is None else lower
    best, best_fp, nodes, tried, step = offsets, footprint, 0, 0, 0

    def attempt(cap: int, share: float) -> Attempt:
        nonlocal nodes, tried
        result = searcher.attempt(cap, min(deadline, time.monotonic() + share * (deadline - started)), threads)
        nodes, tried = nodes + result.nodes, tried + 1
        outcome = {FOUND: "found", NOT_FOUND: "refuted"}.get(result.status, "undecided")
        log.debug("capacity %d: %s after %d nodes", cap, outcome, result.nodes)
        return result

    if lower < best_fp and best_fp > good_enough:
        result = attempt(lower, LOWER_BOUND_SHARE)
        if result.status == FOUND:
            best, best_fp = result.offsets, _top(problem, result.offsets)
        elif result.status == NOT_FOUND:
            lower += 1
        step = (best_fp - lower) // 2
    while step > 0 and best_fp > good_enough and time.monotonic() < deadline:
        # A looser capacity is found fast; a refuted one raises the bound; an undecided one halves the step.
        cap = best_fp - step
        result = attempt(cap, STEP_SHARE)
        if result.status == FOUND:
            best, best_fp = result.offsets, _top(problem, result.offsets)
        elif result.status == NOT_FOUND:
            lower = cap + 1
        if result.status != FOUND:
            step //= 2
        step = min(step, (best_fp - lower + 1) // 2) if best_fp > lower else 0
    log.info("search: footprint %d, proven lower bound %d", best_fp, lower)
    what = "found the lower bound" if best_fp <= lower else f"descent over {tried} capacities"
    return best, best_fp, {"search": what, "optimal": best_fp <= lower, "lower_bound": lower,
                           "finished": best_fp <= lower or step <= 0,
                           "search_nodes": nodes, "search_s": time.monotonic() - started}


def _top(problem: PoolProblem, offsets: np.ndarray) -> int:
    return int((offsets + problem.sizes).max())
