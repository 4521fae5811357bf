"""Large pool problems: the graph-free heuristics, the synthetic generator, the time limit."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

import memplan.pool as mp
from memplan.pool import construct
from memplan.pool.allocators import smartpool as smart
from memplan.pool.synthetic import FAMILIES, synthetic_problem
from memplan.pool.time_limit import EXIT_S, command_limit_s, process_age_s


def overlapping_pairs(problem, offsets):
    """Independent oracle, vectorised: pairs alive together whose address ranges intersect."""
    s, e, lo = problem.starts, problem.ends, offsets
    hi = offsets + problem.sizes
    live = (s[:, None] < e[None, :]) & (s[None, :] < e[:, None])
    clash = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])
    np.fill_diagonal(clash, False)
    return int((live & clash).sum() // 2)


def random_problem(rng, n=300, horizon=60):
    starts = [rng.randrange(horizon) for _ in range(n)]
    ends = [s + rng.randrange(1, 15) for s in starts]
    return mp.make_problem(starts, ends, [rng.randrange(1, 64) * 512 for _ in range(n)])


@pytest.mark.parametrize("seed", range(4))
def test_graph_free_heuristics_are_valid(seed):
    problem = random_problem(random.Random(seed))
    layouts = [construct._sweep_fit(problem, fit) for fit in (True, False)]
    layouts += [job() for _, job in construct._dive_jobs(problem)]
    for offsets, footprint in layouts:
        assert overlapping_pairs(problem, offsets) == 0 and offsets.min() >= 0
        assert footprint == int((offsets + problem.sizes).max()) >= problem.peak_load_bytes


def test_a_dive_past_its_work_cap_gives_up(monkeypatch):
    monkeypatch.setattr(construct, "DIVE_POPS_PER_BUFFER", 0)
    problem = random_problem(random.Random(0))
    assert all(job()[1] == -1 for _, job in construct._dive_jobs(problem))
    assert mp.solve(problem, "smartpool", time_limit_s=1).details["heuristics"].endswith("not run or given up")


@pytest.mark.parametrize("family", FAMILIES)
def test_synthetic_problems_overlap_and_are_reproducible(family):
    problem = synthetic_problem(family, 4000, seed=3)
    assert abs(problem.n - 4000) <= 1 and np.all(problem.sizes % 512 == 0)
    assert np.array_equal(problem.sizes, synthetic_problem(family, 4000, seed=3).sizes)
    order = np.argsort(problem.starts, kind="stable")
    reach = np.maximum.accumulate(problem.ends[order])
    assert np.all(reach[:-1] > problem.starts[order][1:])  # no time boundary splits it


def test_details_say_why_the_search_did_not_run(monkeypatch):
    problem = random_problem(random.Random(1))
    first = mp.solve(problem, "smartpool", time_limit_s=0)
    assert first.ratio > 1 and first.details["search"] == "not run: no time left after the first layouts"
    monkeypatch.setattr(smart, "SEARCH_MAX_BUFFERS", 100)
    result = mp.solve(problem, "smartpool", time_limit_s=1)
    assert result.details["search"] == "not run: the atom setting the footprint is too large for it (300 buffers > 100)"


def test_time_limit_is_kept_on_a_large_problem():
    # 20,000 buffers, search until the deadline; a generous margin for a loaded host.
    problem = synthetic_problem("uniform", 20_000)
    started = time.monotonic()
    result = mp.solve(problem, "smartpool", time_limit_s=4)
    assert time.monotonic() - started < 2 * 4 + 2
    assert result.footprint_bytes >= result.peak_load_bytes and result.details["search"]


def test_command_limit_counts_what_the_process_spent():
    age = process_age_s()
    assert age > 0
    assert 9 - EXIT_S < command_limit_s(age + 10) <= 10 - EXIT_S  # the process keeps ageing meanwhile
    assert command_limit_s(0) == 0
