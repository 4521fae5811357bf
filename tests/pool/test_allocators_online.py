"""Online allocator simulators and the smallest-pool search, against hand-derived outcomes."""

from __future__ import annotations

import itertools


import memplan.pool as mp
from memplan.pool.caching import CachingAllocator
from memplan.pool.poolsize import STALLED_RESTARTS, serves, smallest_pool

MIB = 2**20
U = 512  # CNMeM granularity: use it as the unit so rounding does not blur the examples


def no_overlap(problem, offsets):
    for i, j in itertools.combinations(range(problem.n), 2):
        if problem.starts[i] < problem.ends[j] and problem.starts[j] < problem.ends[i]:
            assert offsets[i] + problem.sizes[i] <= offsets[j] or offsets[j] + problem.sizes[j] <= offsets[i]


def test_paper001_larger_pool_can_fail():
    # A1(5) A2(2) A3(1) D2 A4(1) D1 D3 A5(8): best-fit serves 9 units but not 11 (paper 001 §IV-B).
    problem = mp.make_problem([0, 1, 2, 3, 5], [5, 3, 5, 6, 6], [5 * U, 2 * U, U, U, 8 * U])
    assert serves(problem, 9 * U)
    assert not serves(problem, 11 * U)
    assert smallest_pool(problem).pool_bytes == 9 * U


def test_smallest_pool_grows_by_the_shortfall():
    # A(2) [0,2) @0, B(2) [1,4) @2; A freed leaves [0,2) below B, so C(3) [2,4) fails at pool 5
    # (shortfall 3-2 -> 6), fails again at 6 (top block is 2 -> 7) and fits at 7 on top of B.
    problem = mp.make_problem([0, 1, 2], [2, 4, 4], [2 * U, 2 * U, 3 * U])
    result = smallest_pool(problem)
    assert problem.peak_load_bytes == 5 * U
    assert result.pool_bytes == 7 * U and result.restarts == 2
    assert mp.solve(problem, "smartpool").footprint_bytes == 5 * U  # offline knows the future
    tricky = mp.make_problem([0, 0, 1, 2], [1, 3, 3, 3], [U, U, 2 * U, 2 * U])
    found = smallest_pool(tricky)
    assert serves(tricky, found.pool_bytes) and found.pool_bytes >= tricky.peak_load_bytes


def test_smallest_pool_grows_by_the_request_where_growing_by_the_shortfall_stalls():
    # A(24 MiB) [3,5) @0, B(U) [4,16) @24 MiB; A freed, C(64 B) takes the tighter hole [0, 24 MiB) and
    # D(24 MiB) [13,19) the block above B, so E(24 MiB) at 15 finds 24 MiB - U free below C: short by U.
    # Growing the pool grows only its top block, which would need ~49k granules to hold E; after
    # STALLED_RESTARTS failures alike, the search grows the pool by the whole request.
    problem = mp.make_problem([3, 4, 6, 13, 15], [5, 16, 19, 19, 21], [24 * MIB, U, 64, 24 * MIB, 24 * MIB])
    result = smallest_pool(problem)
    assert serves(problem, result.pool_bytes) and result.restarts == STALLED_RESTARTS
    assert result.pool_bytes == (48 * MIB + 2 * U) + (STALLED_RESTARTS - 1) * U + 24 * MIB
    assert not serves(problem, 48 * MIB + 2 * U + (STALLED_RESTARTS - 1) * U)


def test_cnmem_grows_by_rounded_size_and_never_merges():
    # Peak load 2U-100+U -> initial pool rounded to 3U. A(U)@0, B(U)@U, free [2U,3U). A freed: [0,U)
    # is not adjacent to [2U,3U) (B between), so C (2U-100, rounded 2U) needs a new 2U region.
    problem = mp.make_problem([0, 1, 2], [2, 3, 4], [U, U, 2 * U - 100])
    result = mp.solve(problem, "cnmem")
    assert result.footprint_bytes == 3 * U + 2 * U
    assert result.details["regions"] == 2
    no_overlap(result.problem, result.offsets)


def test_caching_allocator_constants():
    assert CachingAllocator.round_size(1) == 512 and CachingAllocator.round_size(513) == 1024
    assert CachingAllocator.allocation_size(MIB) == 2 * MIB
    assert CachingAllocator.allocation_size(MIB + 1) == 20 * MIB
    assert CachingAllocator.allocation_size(10 * MIB) == 10 * MIB
    assert CachingAllocator.allocation_size(11 * MIB + 1) == 12 * MIB


def test_caching_small_requests_share_one_2mib_segment():
    problem = mp.make_problem([0, 0, 0, 1], [5, 5, 5, 5], [1000, 4000, 100_000, 700_000])
    result = mp.solve(problem, "caching")
    assert result.footprint_bytes == 2 * MIB and result.alloc_calls == 1
    no_overlap(result.problem, result.offsets)


def test_caching_large_split_and_reuse():
    # 6 MiB -> a 20 MiB segment, split (14 MiB > 1 MiB remains). 12 MiB fits in the remainder.
    # After both are freed they merge; a 19 MiB request reuses the segment.
    problem = mp.make_problem([0, 1, 3], [2, 3, 4], [6 * MIB, 12 * MIB, 19 * MIB])
    result = mp.solve(problem, "caching")
    assert result.footprint_bytes == 20 * MIB
    no_overlap(result.problem, result.offsets)


def test_caching_does_not_split_when_remainder_small():
    # 19.5 MiB request in a 20 MiB segment: 0.5 MiB remainder is not split off (large pool needs > 1 MiB),
    # so a later 0.5 MiB request (small pool) needs its own 2 MiB segment.
    problem = mp.make_problem([0, 0], [2, 2], [19 * MIB + MIB // 2, MIB // 2])
    assert mp.solve(problem, "caching").footprint_bytes == 22 * MIB


def test_expandable_segments_map_pages_on_demand():
    # Large pool pages are 20 MiB: 30 MiB then 5 MiB live together -> 40 MiB mapped (two pages).
    problem = mp.make_problem([0, 0], [2, 2], [30 * MIB, 5 * MIB])
    assert mp.solve(problem, "caching-expandable").footprint_bytes == 40 * MIB
    assert mp.solve(problem, "caching").footprint_bytes == 50 * MIB


def test_exact_is_peak_load_with_one_call_per_buffer():
    problem = mp.make_problem([0, 1, 2], [3, 3, 4], [10, 20, 30])
    result = mp.solve(problem, "exact")
    assert result.footprint_bytes == 60 and result.alloc_calls == 3


def test_vdnnpp_highend_places_offloaded_high():
    from memplan.pool.problem import ROLE_OFFLOAD, ROLE_PLAIN

    problem = mp.make_problem([0, 0], [4, 2], [U, U], roles=[ROLE_OFFLOAD, ROLE_PLAIN])
    result = mp.solve(problem, "vdnnpp-highend")
    offload = list(problem.roles).index(ROLE_OFFLOAD)
    assert result.offsets[offload] == U and result.footprint_bytes == 2 * U
    for order in ("prefetch-first", "derivative-first"):
        assert mp.solve(problem, "vdnnpp-highend", order=order).details["order"] == order
