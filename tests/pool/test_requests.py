"""The runtime pool of a plan (memplan.pool.requests): the requests a planned step makes, at aligned
offsets that keep the plan's layout valid, replayed exactly by the host replay allocator."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memplan.pool as mp
from memplan.cost.model import Cost
from memplan.errors import InfeasibleBudgetError, MemplanError
from memplan.planners.base import plan as make_plan
from memplan.pool.replay_allocator import ReplayAllocator
from memplan.pool.requests import MIN_SLOT_BYTES, aligned_offsets, step_requests
from memplan.problem import Problem
from memplan.sim.program import compile_program, residencies
from memplan.testing.planner_property import fast_params
from memplan.testing.strategies import training_traces

ALIGN = 512


def overlapping_pairs(starts, ends, offsets, sizes):
    """Independent oracle: pairs of buffers alive together whose address ranges meet (O(n^2))."""
    n = len(starts)
    return [(i, j) for i in range(n) for j in range(i + 1, n)
            if starts[i] < ends[j] and starts[j] < ends[i]
            and offsets[i] < offsets[j] + sizes[j] and offsets[j] < offsets[i] + sizes[i]]


@given(n=st.integers(1, 30), seed=st.integers(0, 2**16))
def test_aligned_offsets_keep_a_valid_layout_valid(n, seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 20, n)
    ends = starts + rng.integers(1, 10, n)
    sizes = rng.integers(1, 3000, n)
    result = mp.solve(mp.make_problem(starts, ends, sizes), "smartpool-bestfit")
    p = result.problem
    offsets, footprint = aligned_offsets(result.offsets, p.sizes, ALIGN)
    blocks = -(-p.sizes // ALIGN) * ALIGN
    assert overlapping_pairs(p.starts, p.ends, offsets, blocks) == []
    assert all(o % ALIGN == 0 for o in offsets) and footprint % ALIGN == 0
    assert footprint == max(int(o + b) for o, b in zip(offsets, blocks))
    assert footprint <= result.footprint_bytes + ALIGN * 2 * n  # each boundary rounds up at most once


def test_ranges_only_dropped_buffers_used_close_up():
    # Three buffers alive together, stacked; the middle one (persistent, say) is dropped.
    offsets, footprint = aligned_offsets(np.array([0, 2048]), np.array([1024, 512]), ALIGN)
    assert offsets.tolist() == [0, 1024] and footprint == 1536


@pytest.fixture(scope="module")
def host_alloc(tmp_path_factory):
    os.environ["MEMPLAN_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "memplan-cache")
    return ReplayAllocator("host")


def planned(trace, planner, budget):
    cost = Cost.for_trace(trace, "h100")
    try:
        p = make_plan(trace, budget, planner=planner, cost=cost, **fast_params(planner))
    except InfeasibleBudgetError:
        return None, None
    return p, compile_program(Problem(trace, cost), p)


@given(trace=training_traces(), planner=st.sampled_from(("smartpool", "autoswap:doa+smartpool")),
       share=st.sampled_from(("100%", "70%", "50%")))
def test_a_plans_step_requests_replay_exactly(host_alloc, trace, planner, share):
    plan, program = planned(trace, planner, None if planner == "smartpool" else share)
    if plan is None:
        return
    requests = step_requests(trace, program, plan.pool)
    rows = {(r[0], r[1]): r for r in residencies(trace, program)}
    def requested(sid, start, end):  # by the step, and freed within it where the storage persists
        s = trace.storages[sid]
        if s.persistent:
            return 0 < start and end < trace.num_steps
        return not (start == s.alloc_op and trace.producer(sid) is None)

    expected = {k for k, r in rows.items() if trace.nbytes[r[0]] >= MIN_SLOT_BYTES and requested(*r[:3])
                and trace.storages[r[0]].kind != "workspace"}  # what libraries take themselves stays with the heap
    assert sorted(requests.storages.tolist()) == sorted(k[0] for k in expected)
    # Replay the step: every residency requested at its start, freed at its end.
    keys = sorted(expected, key=lambda k: (k[1], rows[k][3] != "fetched", k[0]))
    host_alloc.configure(requests)
    host_alloc.begin_iteration(0)
    addr, frees = {}, sorted((rows[k][2], k) for k in keys)
    for k in keys:
        while frees and frees[0][0] <= k[1]:
            _, done = frees.pop(0)
            host_alloc.free(addr[done], int(trace.nbytes[done[0]]))
        host_alloc.op_clock.value = k[1]
        addr[k] = host_alloc.malloc(int(trace.nbytes[k[0]]))
    for _, done in frees:
        host_alloc.free(addr[done], int(trace.nbytes[done[0]]))
    host_alloc.end_iteration()
    s = host_alloc.stats()
    assert s["served"] == len(keys) and s["fallbacks"] == 0 and s["missed_slots"] == 0
    assert [addr[k] - host_alloc.pool_base for k in keys] == requests.offsets.tolist()
    assert requests.ops.tolist() == [k[1] for k in keys]


@settings(max_examples=2)
@given(trace=training_traces())
def test_a_plan_without_a_layout_is_refused(trace):
    plan, program = planned(trace, "none", None)
    with pytest.raises(MemplanError, match="no pool layout"):
        step_requests(trace, program, plan.pool)
