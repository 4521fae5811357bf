"""SmartPool: the paper's greedy allocators, and `smartpool` that goes beyond them.

`smartpool-bestfit` / `smartpool-firstfit` are paper 000 §III-C exactly: size descending,
best / first gap. `smartpool`:
  1. splits the problem into atoms without losing optimality (memplan.pool.split);
  2. gives every atom a first layout from a portfolio of heuristics (memplan.pool.construct), so
     it is never worse than the paper's best-fit where that is affordable;
  3. spends the rest of the time limit on the exact search (memplan.pool.search) of the atom that sets
     the footprint, until it is proven optimal, beaten by another atom, or time runs out.
Everything, validation included, fits in `time_limit_s` of wall time; `details` says what ran.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ..construct import affordable_graph, construct
from ..greedy import greedy_place
from ..problem import PoolProblem
from ..search import default_threads, improve
from ..split import Atom, split
from ..time_limit import reserve_s
from .base import AllocatorOutcome, register_allocator

log = logging.getLogger(__name__)

SEARCH_MAX_BUFFERS = 20_000  # the search's nodes cost O(buffers): larger atoms keep their first layout
CONSTRUCT_SHARE = 0.4  # share of the time limit after which no further first-layout heuristic starts


def _size_order(problem: PoolProblem) -> np.ndarray:
    return np.lexsort((np.arange(problem.n), -problem.sizes))


@register_allocator("smartpool-bestfit", "paper 000: size descending, best-fit gap among overlapping buffers")
def bestfit(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0) -> AllocatorOutcome:
    """Paper 000's default SmartPool (best-fit)."""
    offsets, footprint = greedy_place(problem, _size_order(problem), best_fit=True)
    return AllocatorOutcome(footprint_bytes=footprint, offsets=offsets)


@register_allocator("smartpool-firstfit", "paper 000: size descending, first-fit gap among overlapping buffers")
def firstfit(problem: PoolProblem, *, time_limit_s: float = 0.0, seed: int = 0) -> AllocatorOutcome:
    """Paper 000's first-fit variant."""
    offsets, footprint = greedy_place(problem, _size_order(problem), best_fit=False)
    return AllocatorOutcome(footprint_bytes=footprint, offsets=offsets)


class _AtomState:
    """One atom: its problem, graph, best layout, and what the search proved."""

    def __init__(self, problem: PoolProblem, atom: Atom, deadline: float, threads: int):
        self.atom, self.problem = atom, problem.subset(atom.index)
        self.graph = affordable_graph(self.problem)
        self.searchable = self.problem.n <= SEARCH_MAX_BUFFERS and self.graph is not None
        # Below the whole problem's peak load, an atom's top does not matter.
        good_enough = problem.peak_load_bytes - atom.base
        self.first = construct(self.problem, deadline, threads, self.graph, good_enough)
        self.offsets, self.footprint = self.first.offsets, self.first.footprint
        self.lower = self.problem.peak_load_bytes
        self.facts: dict = {}

    @property
    def top(self) -> int:
        return self.atom.base + self.footprint

    @property
    def done(self) -> bool:
        return self.footprint <= self.lower or not self.searchable or self.facts.get("finished", False)


@register_allocator("smartpool", "portfolio of heuristics, then exact canonical search under a wall-clock time limit")
def smartpool(problem: PoolProblem, *, time_limit_s: float = 10.0, seed: int = 0,
              threads: int | None = None) -> AllocatorOutcome:
    """SmartPool beyond the paper: split, first layouts, then search for a smaller pool.

    Args:
        problem: the buffers.
        time_limit_s: wall-clock seconds for everything up to a validated result.
        seed: unused (the search is deterministic).
        threads: threads for heuristics and search (default: the cores this process may use).
    """
    started = time.monotonic()
    if problem.n == 0:
        return AllocatorOutcome(footprint_bytes=0, offsets=np.zeros(0, np.int64))
    threads = threads or default_threads()
    deadline = started + max(time_limit_s - reserve_s(problem.n), 0.0)
    parts = split(problem)
    atoms = [_AtomState(problem, atom, started + CONSTRUCT_SHARE * (deadline - started), threads) for atom in parts.atoms]
    searched = _search_worst(atoms, deadline, threads)
    offsets = np.zeros(problem.n, np.int64)
    offsets[parts.stacked] = parts.stacked_offsets
    for a in atoms:
        offsets[a.atom.index] = a.atom.base + a.offsets
    footprint = int((offsets + problem.sizes).max())
    details = _details(problem, parts, atoms, searched, footprint, threads, time.monotonic() - started)
    return AllocatorOutcome(footprint_bytes=footprint, offsets=offsets, details=details)


def _search_worst(atoms: list[_AtomState], deadline: float, threads: int) -> list[_AtomState]:
    """Search the atom with the highest top until the footprint cannot drop further or time is out;
    returns the atoms searched, in order."""
    searched = []
    while atoms and time.monotonic() < deadline:
        worst = max(atoms, key=lambda a: a.top)
        # No atom needs to go below the highest lower bound of all: that is the footprint's.
        worst.lower = max(worst.lower, max(a.atom.base + a.lower for a in atoms) - worst.atom.base)
        if worst.done:
            break
        # Once below another atom's top, that atom sets the footprint (with a tie, neither alone does).
        others = max((a.top for a in atoms if a is not worst), default=0)
        worst.offsets, worst.footprint, facts = improve(
            worst.problem, worst.graph, worst.offsets, worst.footprint, deadline, threads=threads,
            good_enough=others - worst.atom.base - 1, lower=worst.lower)
        worst.lower = facts["lower_bound"]
        _merge_facts(worst.facts, facts)
        if worst not in searched:
            searched.append(worst)
    return searched


def _merge_facts(total: dict, facts: dict) -> None:
    for key in ("search_nodes", "search_s"):
        total[key] = total.get(key, 0) + facts.get(key, 0)
    total.update({k: v for k, v in facts.items() if k not in ("search_nodes", "search_s")})


def _details(problem: PoolProblem, parts, atoms: list[_AtomState], searched: list[_AtomState], footprint: int,
             threads: int, seconds: float) -> dict:
    """What ran: the split, the first layout and the search, in facts a reader can check."""
    worst = max(atoms, key=lambda a: a.top) if atoms else None
    lower = max([problem.peak_load_bytes] + [a.atom.base + a.lower for a in atoms])
    details = {"portfolio": worst.first.label if worst else "stacked",
               "portfolio_footprint": _first_footprint(problem, parts, atoms),
               "optimal": footprint <= lower, "lower_bound": lower, "threads": threads, "seconds": round(seconds, 3)}
    if len(parts.stacked) or len(atoms) > 1:
        details.update({"decomposed": True, "spanning_buffers": int(len(parts.stacked)), "time_ranges": len(atoms)})
    if worst is not None:
        details["heuristics"] = f"{worst.first.tried} run, {worst.first.skipped} not run or given up"
    details["search"] = _search_summary(worst, searched)
    nodes = sum(a.facts.get("search_nodes", 0) for a in searched)
    search_s = sum(a.facts.get("search_s", 0.0) for a in searched)
    if searched:
        details.update({"search_nodes": nodes, "search_s": round(search_s, 3),
                        "nodes_per_s": int(nodes / search_s) if search_s > 0 else 0})
    return details


def _first_footprint(problem: PoolProblem, parts, atoms: list[_AtomState]) -> int:
    stacked_top = int((parts.stacked_offsets + problem.sizes[parts.stacked]).max()) if len(parts.stacked) else 0
    return max([a.atom.base + a.first.footprint for a in atoms] + [stacked_top])


def _search_summary(worst: _AtomState | None, searched: list[_AtomState]) -> str:
    """One line on the search of the atom that sets the footprint (never silent when it did not run)."""
    if worst is None:
        return "not needed (only buffers alive the whole time)"
    if worst.first.footprint <= worst.lower:
        return "not needed (first layout at the lower bound)"
    if not worst.searchable:
        why = f"{worst.problem.n} buffers > {SEARCH_MAX_BUFFERS}" if worst.problem.n > SEARCH_MAX_BUFFERS \
            else "conflict graph too large"
        return f"not run: the atom setting the footprint is too large for it ({why})"
    if worst not in searched:
        return "not run: no time left after the first layouts"
    return worst.facts.get("search", "ran")
