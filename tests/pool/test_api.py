"""Offline pool layouts (SmartPool) checked by an independent overlap checker."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest

import memplan.pool as mp
from memplan.errors import UnknownNameError
from memplan.planners.base import plan as make_plan
from memplan.model import Decision, Plan
from memplan.pool.intervals import residency_problem
from memplan.sim.validate import validate
from memplan.testing.synthetic import chain_trace

CHALLENGING = Path(__file__).resolve().parents[2] / "data" / "minimalloc-challenging"  # vendored, see its SOURCE.md
OFFLINE = ("smartpool", "smartpool-bestfit", "smartpool-firstfit")


def assert_no_overlap(starts, ends, sizes, offsets):
    """Independent oracle: brute force over all pairs (lifetimes and address ranges)."""
    items = list(zip(starts, ends, sizes, offsets))
    for (s1, e1, z1, o1), (s2, e2, z2, o2) in itertools.combinations(items, 2):
        live_together = s1 < e2 and s2 < e1
        share_address = o1 < o2 + z2 and o2 < o1 + z1
        assert not (live_together and share_address), ((s1, e1, z1, o1), (s2, e2, z2, o2))
    assert all(o >= 0 for o in offsets)


def peak_by_brute_force(starts, ends, sizes):
    horizon = max(ends)
    return max(sum(z for s, e, z in zip(starts, ends, sizes) if s <= t < e) for t in range(horizon))


def random_problem(rng, n=40, horizon=30):
    starts = [rng.randrange(horizon - 1) for _ in range(n)]
    ends = [s + rng.randrange(1, horizon - s + 1) for s in starts]
    sizes = [rng.choice([1, 3, 8, 100, 512, 4096]) * rng.randrange(1, 5) for _ in range(n)]
    return mp.make_problem(starts, ends, sizes)


@pytest.mark.parametrize("allocator", OFFLINE)
@pytest.mark.parametrize("seed", range(5))
def test_random_problems_are_valid_and_bounded(allocator, seed):
    rng = random.Random(seed)
    problem = random_problem(rng)
    result = mp.solve(problem, allocator, time_limit_s=0.3)
    p = result.problem
    assert_no_overlap(p.starts.tolist(), p.ends.tolist(), p.sizes.tolist(), result.offsets.tolist())
    peak = peak_by_brute_force(p.starts.tolist(), p.ends.tolist(), p.sizes.tolist())
    assert result.peak_load_bytes == peak
    assert result.footprint_bytes == max(o + z for o, z in zip(result.offsets.tolist(), p.sizes.tolist()))
    assert result.footprint_bytes >= peak


def test_bestfit_matches_hand_example():
    # Sizes descending: 10 [0,4) -> 0; 6 [0,2) -> 10; 6 [2,4) -> 10 (no overlap with the
    # other 6, half-open); 4 [0,4) overlaps 10@0 and 6@10 -> 16. Footprint 20.
    problem = mp.make_problem([0, 0, 2, 0], [4, 2, 4, 4], [10, 6, 6, 4])
    result = mp.solve(problem, "smartpool-bestfit")
    got = {(int(z), int(s)): int(o) for z, s, o in zip(problem.sizes, problem.starts, result.offsets)}
    assert got == {(10, 0): 0, (6, 0): 10, (6, 2): 10, (4, 0): 16}
    assert result.footprint_bytes == 20


def test_bestfit_takes_smallest_gap_firstfit_the_lowest():
    from memplan.pool.greedy import greedy_place

    # Placed in this order: X1=10 [0,10) @0, G1=30 [0,1) @10, X2=10 [0,10) @40, G2=20 [0,1) @50,
    # X3=10 [0,10) @70. Then Z=15 [5,6) sees gaps [10,40) (30) and [50,70) (20).
    starts, ends, sizes = [0, 0, 0, 0, 0, 5], [10, 1, 10, 1, 10, 6], [10, 30, 10, 20, 10, 15]
    problem = mp.make_problem(starts, ends, sizes, storages=range(6))
    order = np.argsort(problem.storages)  # storage order = the order listed above
    best, _ = greedy_place(problem, order, best_fit=True)
    first, _ = greedy_place(problem, order, best_fit=False)
    by_storage = lambda offs: {int(s): int(o) for s, o in zip(problem.storages, offs)}
    assert by_storage(best) == {0: 0, 1: 10, 2: 40, 3: 50, 4: 70, 5: 50}
    assert by_storage(first)[5] == 10


@pytest.mark.parametrize("name", ["A", "F", "K"])
def test_challenging_smartpool_valid_and_not_worse_than_bestfit(name):
    problem = mp.read_minimalloc_csv(CHALLENGING / f"{name}.1048576.csv")
    best = mp.solve(problem, "smartpool-bestfit")
    smart = mp.solve(problem, "smartpool", time_limit_s=1.5)
    assert_no_overlap(problem.starts.tolist(), problem.ends.tolist(), problem.sizes.tolist(), smart.offsets.tolist())
    assert smart.footprint_bytes <= best.footprint_bytes
    assert smart.peak_load_bytes == 1048576


def test_layout_api_on_trace_and_plan_fields():
    trace = chain_trace(6)
    result = mp.layout(trace)
    assert result.ratio == pytest.approx(result.footprint_bytes / trace.peak_load_bytes)
    assert {s.storage for s in result.slots} == {s.id for s in trace.storages}
    planned = make_plan(trace, None, "smartpool", simulate_result=False)
    assert planned.pool_bytes >= trace.peak_load_bytes and len(planned.pool) == len(trace.storages)


def test_with_pool_under_a_swap_plan_frees_while_on_host():
    trace = chain_trace(6)
    act = next(s for s in trace.storages if s.name == "a0")
    back = trace.accesses[act.id][-1]
    plan = Plan(decisions=(Decision(storage=act.id, action="swap", out_after=act.alloc_op, back_before=back,
                                    trigger=back - 1),))
    pooled = mp.with_pool(trace, plan)
    slots = [s for s in pooled.pool if s.storage == act.id]
    assert len(slots) == 2 and slots[1].start == back - 1
    problem = residency_problem(trace, plan)
    mine = [i for i in range(problem.n) if problem.storages[i] == act.id]
    # The first residency ends after the swap-out (copy completion), before the prefetch.
    assert problem.ends[mine[0]] > act.alloc_op + 0 and problem.ends[mine[0]] <= back - 1
    offsets = {(p.storage, p.start): p.offset for p in pooled.pool}
    assert_no_overlap(problem.starts.tolist(), problem.ends.tolist(), problem.sizes.tolist(),
                      [offsets[(int(s), int(t))] for s, t in zip(problem.storages, problem.starts)])


def test_swap_release_waits_for_slow_copy():
    # A 64 MiB copy takes far longer than the tiny ops, so the memory stays until later ops.
    trace = chain_trace(6, flops_per_layer=1e3)
    act = next(s for s in trace.storages if s.name == "a0")
    back = trace.accesses[act.id][-1]
    plan = Plan(decisions=(Decision(storage=act.id, action="swap", out_after=act.alloc_op, back_before=back),))
    problem = residency_problem(trace, plan)
    first = [i for i in range(problem.n) if problem.storages[i] == act.id][0]
    assert problem.ends[first] > act.alloc_op + 1


def test_a_swap_cancelled_by_its_prefetch_keeps_its_slot_for_the_gap():
    # The 64 MiB copy of a0 is still in flight when its prefetch is due one tiny op later: the step
    # program keeps a0 where it is (one residency across the gap), and the plan still names the
    # residency from the prefetch on, at the same offset (found by the planner property suite).
    trace = chain_trace(6, flops_per_layer=1e3)
    act = next(s for s in trace.storages if s.name == "a0")
    back = trace.accesses[act.id][-1]
    plan = Plan(decisions=(Decision(storage=act.id, action="swap", out_after=act.alloc_op + 1, back_before=back,
                                    trigger=act.alloc_op + 2),))
    problem = residency_problem(trace, plan)
    assert [int(t) for t, s in zip(problem.starts, problem.storages) if s == act.id] == [act.alloc_op]
    pooled = mp.with_pool(trace, plan, allocator="smartpool-bestfit")
    slots = {p.start: p.offset for p in pooled.pool if p.storage == act.id}
    assert slots == {act.alloc_op: slots[act.alloc_op], act.alloc_op + 2: slots[act.alloc_op]}
    assert validate(trace, pooled) == []


def test_unknown_allocator_lists_names():
    with pytest.raises(UnknownNameError, match="smartpool"):
        mp.solve(mp.make_problem([0], [1], [1]), "nope")


def test_minimalloc_csv_bad_line(tmp_path):
    from memplan.errors import TraceFormatError

    path = tmp_path / "bad.csv"
    path.write_text("id,lower,upper,size\n0,0,5,10\n1,4,2,8\n")
    with pytest.raises(TraceFormatError, match=":3:"):
        mp.read_minimalloc_csv(path)


def tiled_problem(rng, tiles=6, per_tile=30, spanning=4):
    """Whole-horizon buffers plus `tiles` independent time ranges of random buffers."""
    starts, ends, sizes = [], [], []
    horizon = 20 * tiles
    for _ in range(spanning):
        starts.append(0), ends.append(horizon), sizes.append(rng.randrange(1, 50))
    for k in range(tiles):
        for _ in range(per_tile):
            s = rng.randrange(20 * k, 20 * k + 19)
            starts.append(s), ends.append(rng.randrange(s + 1, 20 * k + 20)), sizes.append(rng.randrange(1, 100))
    return mp.make_problem(starts, ends, sizes)


@pytest.mark.parametrize("seed", range(3))
def test_problems_are_decomposed_validly(seed):
    problem = tiled_problem(random.Random(seed))
    result = mp.solve(problem, "smartpool", time_limit_s=1.0)
    assert result.details.get("decomposed") and result.details["time_ranges"] >= 6  # a tile may split further
    assert_no_overlap(problem.starts, problem.ends, problem.sizes, result.offsets)
    assert result.footprint_bytes >= peak_by_brute_force(problem.starts, problem.ends, problem.sizes)
    assert result.footprint_bytes <= mp.solve(problem, "smartpool-bestfit").footprint_bytes


def _overlaps_by_brute_force(problem, offsets):
    try:
        assert_no_overlap(problem.starts, problem.ends, problem.sizes, offsets)
    except AssertionError:
        return True
    return False


@pytest.mark.parametrize("seed", range(40))
def test_layout_checker_agrees_with_brute_force(seed):
    from memplan.pool.check import LayoutError, check_layout

    rng = random.Random(seed)
    problem = random_problem(rng, n=rng.randrange(2, 25), horizon=12)
    offsets = np.array([rng.randrange(0, 3 * 4096) for _ in range(problem.n)])
    if seed % 2:  # half the cases start from a valid layout, one buffer nudged or not
        offsets = mp.solve(problem, "smartpool-bestfit").offsets.copy()
        offsets[rng.randrange(problem.n)] += rng.randrange(2) * rng.randrange(1, 300)
    expected = _overlaps_by_brute_force(problem, offsets)
    try:
        check_layout(problem, offsets)
        found = False
    except LayoutError:
        found = True
    assert found == expected
