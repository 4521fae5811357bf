"""The C replay allocator on its host backend: it serves a recorded sequence exactly, falls back on
what the plan does not know, tolerates inserted and missing requests, and never hands out
overlapping live blocks (an independent oracle checks every address it returns)."""

from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import memplan.pool as mp
from memplan.errors import MemplanError
from memplan.pool.replay_allocator import ReplayAllocator, ReplayPlan

OTHER_STREAM = 0x1234  # any value other than the pool's stream (0, the default stream)


@pytest.fixture(scope="module")
def alloc(tmp_path_factory):
    import os

    os.environ["MEMPLAN_CACHE_DIR"] = str(tmp_path_factory.getbasetemp() / "memplan-cache")
    return ReplayAllocator("host")


class LiveRanges:
    """Independent oracle: addresses handed out and still live never overlap."""

    def __init__(self):
        self.live = {}

    def add(self, addr, size):
        assert addr, "the allocator returned no memory"
        for a, s in self.live.items():
            assert not (addr < a + s and a < addr + size), (addr, size, a, s)
        self.live[addr] = size

    def remove(self, addr):
        del self.live[addr]


def layout(n, seed=0):
    """A random valid layout of n buffers (the plan), in request order."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, 4 * n, n)
    ends = starts + rng.integers(1, n + 1, n)
    sizes = rng.integers(1, 64, n) * 16
    result = mp.solve(mp.make_problem(starts, ends, sizes), "smartpool-bestfit")
    return result.problem, ReplayPlan.from_result(result)


def events(problem, drift=None):
    """(time, is_alloc, buffer) in execution order: frees before allocations at equal times."""
    drift = np.zeros(problem.n, np.int64) if drift is None else drift
    out = [(int(problem.starts[i]), 1, i) for i in range(problem.n)]
    out += [(int(problem.ends[i] + drift[i]), 0, i) for i in range(problem.n)]
    return sorted(out)


def run_iteration(alloc, problem, *, size_of=None, skip=(), extra=None, stream_of=None, oracle=None, shift=None):
    """Replay one iteration of `problem`'s requests, each made while the op clock shows its start
    (plus `shift(i)`); returns the address of every request made."""
    oracle = oracle or LiveRanges()
    size_of = size_of or (lambda i: int(problem.sizes[i]))
    stream_of = stream_of or (lambda i: 0)
    shift = shift or (lambda i: 0)
    extra = extra or {}
    addr = {}
    alloc.begin_iteration(0)
    for t, is_alloc, i in events(problem):
        if i in skip:
            continue
        alloc.op_clock.value = t + (shift(i) if is_alloc else 0)
        if is_alloc:
            for size in extra.get(i, ()):  # requests the plan does not know, made just before buffer i
                a = alloc.malloc(size)
                oracle.add(a, size)
                oracle.remove(a)
                alloc.free(a, size)
            addr[i] = alloc.malloc(size_of(i), stream_of(i))
            oracle.add(addr[i], size_of(i))
        else:
            oracle.remove(addr[i])
            alloc.free(addr[i], size_of(i), stream_of(i))
    alloc.end_iteration()
    return addr


def test_recorded_sequence_is_served_exactly_at_the_planned_offsets(alloc):
    problem, plan = layout(120)
    alloc.configure(plan)
    for _ in range(3):
        addr = run_iteration(alloc, problem)
        assert [addr[i] - alloc.pool_base for i in range(problem.n)] == plan.offsets.tolist()
    s = alloc.stats()
    assert s["served"] == 3 * problem.n and s["fallbacks"] == 0 and s["missed_slots"] == 0
    assert s["iterations"] == 3 and s["live_bytes"] == 0 and s["served_bytes"] == 3 * int(plan.sizes.sum())
    assert alloc.misses() == []


def plan3():
    # Op 0 makes a (64 B), op 1 makes b (32 B) while a lives; op 3 makes c (64 B) where a was.
    return ReplayPlan(pool_bytes=96, sizes=np.array([64, 32, 64]), offsets=np.array([0, 64, 0]), ops=np.array([0, 1, 3]))


def request(alloc, op, size, stream=0):
    alloc.op_clock.value = op
    return alloc.malloc(size, stream)


def test_unknown_request_falls_back_and_is_counted(alloc):
    alloc.configure(plan3())
    base = alloc.pool_base
    alloc.begin_iteration(0)
    a = request(alloc, 0, 64)
    odd = request(alloc, 1, 100)  # no slot of this size
    b = request(alloc, 1, 32)
    alloc.free(a, 64)
    c = request(alloc, 3, 64)
    alloc.end_iteration()
    assert (a - base, b - base, c - base) == (0, 64, 0)
    assert not base <= odd < base + 96
    s = alloc.stats()
    assert (s["served"], s["unplanned"], s["unplanned_bytes"], s["fallbacks"]) == (3, 1, 100, 1)
    assert s["peak_heap_reserved_bytes"] >= 100
    assert alloc.misses() == [{"request": 1, "size": 100, "op": 1, "slot": -1, "slot_size": -1, "kind": "unplanned"}]
    for address, size in ((odd, 100), (b, 32), (c, 64)):
        alloc.free(address, size)
    assert alloc.stats()["live_bytes"] == 0


def test_inserted_missing_and_reordered_requests_cost_only_themselves(alloc):
    problem, plan = layout(200, seed=1)
    alloc.configure(plan)
    skip = {10, 50, 51, 120, 190}
    extra = {20: [1001], 60: [1003, 1005], 150: [1007]}  # sizes no slot has, above the smallest slot
    late = {i for i in range(problem.n) if i % 9 == 0 and i not in skip}  # requested one op late
    addr = run_iteration(alloc, problem, skip=skip, extra=extra, shift=lambda i: 1 if i in late else 0)
    s = alloc.stats()
    assert s["served"] == problem.n - len(skip) and s["unplanned"] == 4 and s["conflicts"] == 0
    assert s["missed_slots"] == len(skip)
    assert all(addr[i] - alloc.pool_base == plan.offsets[i] for i in addr)
    never = sorted(m["slot"] for m in alloc.misses() if m["kind"] == "never_requested")
    assert never == sorted(skip)


def test_a_request_far_from_its_op_gets_no_slot(alloc):
    alloc.configure(plan3())
    alloc.begin_iteration(0)
    a = request(alloc, 5, 64)  # the 64 B slots are planned at ops 0 and 3, two ops away and more
    alloc.end_iteration()
    assert not alloc.pool_base <= a < alloc.pool_base + 96
    assert alloc.stats()["unplanned"] == 1
    alloc.free(a, 64)


def test_a_live_block_in_the_planned_range_forces_a_fallback(alloc):
    alloc.configure(plan3())
    oracle = LiveRanges()
    alloc.begin_iteration(0)
    for op, size in ((0, 64), (1, 32), (3, 64)):  # c is planned at offset 0, but a is still live
        oracle.add(request(alloc, op, size), size)
    alloc.end_iteration()
    assert alloc.stats()["conflicts"] == 1 and alloc.stats()["served"] == 2
    for address, size in list(oracle.live.items()):
        alloc.free(address, size)


def test_requests_on_another_stream_or_between_steps_go_to_the_heap(alloc):
    alloc.configure(ReplayPlan(pool_bytes=64, sizes=np.array([64]), offsets=np.array([0]), ops=np.array([0])))
    base = alloc.pool_base
    outside = request(alloc, 0, 64)  # disarmed: not the plan's business
    alloc.begin_iteration(0)
    side = request(alloc, 0, 64, OTHER_STREAM)
    mine = request(alloc, 0, 64)
    alloc.end_iteration()
    s = alloc.stats()
    assert mine == base and side != base and outside != base
    assert (s["outside"], s["other_stream"], s["fallbacks"], s["served"]) == (1, 1, 1, 1)
    for address in (outside, side, mine):
        alloc.free(address, 64)


def test_only_the_first_iteration_is_logged(alloc):
    problem, plan = layout(30, seed=2)
    alloc.configure(plan)
    run_iteration(alloc, problem, skip={3})
    run_iteration(alloc, problem, skip={4})
    assert [m["slot"] for m in alloc.misses()] == [3]
    assert alloc.stats()["missed_slots"] == 2


def test_reconfiguring_while_a_pool_block_is_live_is_refused(alloc):
    plan = ReplayPlan(pool_bytes=64, sizes=np.array([64]), offsets=np.array([0]), ops=np.array([0]))
    alloc.configure(plan)
    alloc.begin_iteration(0)
    a = request(alloc, 0, 64)
    with pytest.raises(MemplanError, match="still in use"):
        alloc.configure(plan)
    alloc.free(a, 64)
    alloc.end_iteration()
    alloc.configure(plan)
    with pytest.raises(MemplanError, match="op order"):
        alloc.configure(ReplayPlan(pool_bytes=64, sizes=np.array([8, 8]), offsets=np.array([0, 8]), ops=np.array([1, 0])))


@st.composite
def drifted_replays(draw):
    """A plan and a step that drifts from it: sizes, lifetimes, streams, inserted and missing requests."""
    n = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**16))
    flags = st.lists(st.booleans(), min_size=n, max_size=n)
    return {"n": n, "seed": seed, "grow": draw(flags), "skip": draw(flags), "side": draw(flags),
            "drift": draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)),
            "shift": draw(st.lists(st.integers(-2, 2), min_size=n, max_size=n)),
            "extra": draw(st.dictionaries(st.integers(0, n - 1), st.lists(st.integers(1, 2000), max_size=3)))}


@given(case=drifted_replays())
def test_drifting_steps_never_get_overlapping_live_blocks(alloc, case):
    problem, plan = layout(case["n"], case["seed"])
    alloc.configure(plan)
    n = problem.n
    grow = lambda i: int(problem.sizes[i]) + (16 if case["grow"][i] else 0)  # noqa: E731
    skip = {i for i in range(n) if case["skip"][i]}
    side = lambda i: OTHER_STREAM if case["side"][i] else 0  # noqa: E731
    drifted = mp.make_problem(problem.starts, problem.ends + np.array(case["drift"]), problem.sizes,
                              storages=problem.storages)
    oracle = LiveRanges()  # one oracle across both iterations: blocks of either never overlap
    for _ in range(2):
        run_iteration(alloc, drifted, size_of=grow, skip=skip, extra=case["extra"], stream_of=side, oracle=oracle,
                      shift=lambda i: case["shift"][i])
    s = alloc.stats()
    assert s["served"] + s["small"] + s["fallbacks"] == s["requests"]
    assert s["live_bytes"] == 0 and not oracle.live
    if not (any(case["grow"]) or skip or any(case["side"]) or any(case["drift"]) or any(case["extra"].values())
            or any(case["shift"])):
        assert s["served"] == 2 * n and s["fallbacks"] == 0


def test_an_exhausted_device_ends_the_process_in_one_line_not_with_a_null_pointer():
    """Finding 8: PyTorch's pluggable allocator takes what the allocator returns without a check
    (CUDAPluggableAllocator.cpp): a NULL for a tensor's bytes is an illegal address later, far from its
    cause. The CUDA backend, built here without a CUDA runtime to allocate from, is exhausted at once."""
    code = ("from memplan.pool.replay_allocator import ReplayAllocator\n"
            "a = ReplayAllocator('cuda')\n"
            "print('served', a.lib.memplan_malloc(4096, 0, None), flush=True)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "served" not in done.stdout and done.returncode == -signal.SIGABRT
    assert done.stderr.strip().splitlines()[-1] == (
        "memplan pool: out of device memory: 4096 bytes requested, 0 held (the plan's pool: 0); PyTorch takes no "
        "null pointer from a pluggable allocator, so the process ends here")
