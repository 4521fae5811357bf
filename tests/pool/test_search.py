"""The exact pool search (minimalloc-style) against an independent CP-SAT oracle."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest
from ortools.sat.python import cp_model

import memplan.pool as mp
from memplan.pool.greedy import conflict_graph
from memplan.pool.search import FOUND, NOT_FOUND, PREORDERS, _Searcher, improve

CHALLENGING = Path(__file__).resolve().parents[2] / "data" / "minimalloc-challenging"  # vendored, see its SOURCE.md
FAR_FUTURE = float("inf")


def optimum_by_cp_sat(problem) -> int:
    """Smallest footprint, from a CP-SAT model written here (no-overlap in time x address)."""
    model = cp_model.CpModel()
    horizon = int(problem.sizes.sum())
    top = model.NewIntVar(0, horizon, "top")
    times, spaces = [], []
    for s, e, z in zip(problem.starts.tolist(), problem.ends.tolist(), problem.sizes.tolist()):
        y = model.NewIntVar(0, horizon - z, "")
        times.append(model.NewFixedSizeIntervalVar(s, e - s, ""))
        spaces.append(model.NewFixedSizeIntervalVar(y, z, ""))
        model.Add(top >= y + z)
    model.AddNoOverlap2D(times, spaces)
    model.Minimize(top)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.Solve(model) == cp_model.OPTIMAL
    return int(solver.ObjectiveValue())


def small_problem(rng):
    n = rng.randrange(4, 12)
    starts = [rng.randrange(10) for _ in range(n)]
    ends = [s + rng.randrange(1, 8) for s in starts]
    return mp.make_problem(starts, ends, [rng.randrange(1, 9) for _ in range(n)])


def layout_is_valid(problem, offsets, cap) -> bool:
    for i in range(problem.n):
        if offsets[i] < 0 or offsets[i] + problem.sizes[i] > cap:
            return False
        for j in range(i):
            live = problem.starts[i] < problem.ends[j] and problem.starts[j] < problem.ends[i]
            apart = offsets[i] + problem.sizes[i] <= offsets[j] or offsets[j] + problem.sizes[j] <= offsets[i]
            if live and not apart:
                return False
    return True


@pytest.mark.parametrize("seed", range(6))
def test_every_preorder_finds_the_optimum_and_refutes_one_less(seed):
    # Soundness and completeness of the pruning rules: at the optimum a layout exists and
    # the search must find it; one byte less none exists and the search must prove it.
    rng = random.Random(seed)
    for _ in range(15):
        problem = small_problem(rng)
        best = optimum_by_cp_sat(problem)
        searcher = _Searcher(problem, conflict_graph(problem))
        for k in range(len(PREORDERS)):
            status, offsets = searcher.run(best, k, 10**7)
            assert status == FOUND and layout_is_valid(problem, offsets, best)
            assert searcher.run(best - 1, k, 10**7)[0] == NOT_FOUND


def test_improve_reaches_the_optimum_and_proves_it():
    rng = random.Random(7)
    for _ in range(10):
        problem = small_problem(rng)
        best = optimum_by_cp_sat(problem)
        worst = np.cumsum(problem.sizes) - problem.sizes  # every buffer stacked: valid, far from optimal
        offsets, footprint, facts = improve(problem, conflict_graph(problem), worst, int(problem.sizes.sum()),
                                            time.monotonic() + 60)
        assert footprint == best and layout_is_valid(problem, offsets, best)
        assert facts["optimal"] and facts["lower_bound"] == best


def test_attempt_is_deterministic_across_threads():
    problem = mp.read_minimalloc_csv(CHALLENGING / "K.1048576.csv")
    searcher = _Searcher(problem, conflict_graph(problem))
    runs = [searcher.attempt(problem.peak_load_bytes, FAR_FUTURE, threads) for threads in (1, 2, 3)]
    assert all(run.status == FOUND for run in runs)
    assert all(np.array_equal(runs[0].offsets, run.offsets) for run in runs[1:])


@pytest.mark.parametrize("name", ["F", "G", "H", "K"])
def test_challenging_files_reach_peak_load(name):
    # These are solved within a fraction of a second; the default limit leaves a wide margin.
    problem = mp.read_minimalloc_csv(CHALLENGING / f"{name}.1048576.csv")
    result = mp.solve(problem, "smartpool")
    assert result.footprint_bytes == problem.peak_load_bytes == 1048576
    assert result.details["optimal"]
    assert layout_is_valid(problem, result.offsets, 1048576)


def split_problem(rng):
    """Whole-range buffers, and two or three independent time ranges, each with its own."""
    starts, ends, sizes = [0, 0], [30, 30], [rng.randrange(1, 6), rng.randrange(1, 6)]
    for lo in range(0, 30, 10 * rng.choice([1, 2])):
        starts.append(lo), ends.append(lo + 10), sizes.append(rng.randrange(1, 6))  # spans its range
        for _ in range(rng.randrange(3, 7)):
            s = rng.randrange(lo, lo + 9)
            starts.append(s), ends.append(rng.randrange(s + 1, lo + 11)), sizes.append(rng.randrange(1, 9))
    return mp.make_problem(starts, ends, sizes)


@pytest.mark.parametrize("seed", range(8))
def test_smartpool_reaches_the_optimum_of_split_problems(seed):
    # Stacking whole-range buffers and separating time ranges must not lose the optimum.
    rng = random.Random(seed)
    problem = split_problem(rng) if seed % 2 else small_problem(rng)
    result = mp.solve(problem, "smartpool", time_limit_s=30)
    best = optimum_by_cp_sat(problem)
    assert result.footprint_bytes == best and layout_is_valid(problem, result.offsets, best)
    assert result.details["optimal"] and result.details["lower_bound"] == best


def test_smartpool_layout_does_not_depend_on_threads():
    problem = mp.read_minimalloc_csv(CHALLENGING / "K.1048576.csv")
    layouts = [mp.solve(problem, "smartpool", threads=threads).offsets for threads in (1, 3)]
    assert np.array_equal(*layouts)
