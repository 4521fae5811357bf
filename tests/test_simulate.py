"""The simulator on hand-built traces whose answers are worked out by hand.

Every trace here has ops of exactly 1 s and a link of exactly 1e9 bytes/s each way with no
latency, so a storage of 1e9 bytes takes exactly 1 s to copy.
"""

import dataclasses
import random

import numpy as np
import pytest

from memplan.cost.model import Cost
from memplan.cost.profiles import BUILTIN
from memplan.plan.model import Decision, Plan
from memplan.sim.simulate import Simulator, simulate
from memplan.testing.synthetic import chain_trace
from memplan.trace.model import Op, Storage, Trace

GB = 10**9
PROFILE = dataclasses.replace(BUILTIN["h100"], h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9, link_efficiency=1.0,
                              copy_latency_s=0.0, launch_s=0.0, hbm_bytes_per_s=1e9, memory_efficiency=1.0)


def make_trace(storages, ops):
    """storages: (nbytes, kind, alloc, free, persistent); ops: (reads, writes[, duration])."""
    return Trace(
        storages=tuple(Storage(id=i, nbytes=n, kind=k, alloc_op=a, free_op=f, persistent=p)
                       for i, (n, k, a, f, p) in enumerate(storages)),
        ops=tuple(Op(index=i, name=f"op{i}", phase="forward" if i < 2 else "backward", reads=tuple(o[0]),
                     writes=tuple(o[1]), duration_s=float(o[2]) if len(o) > 2 else 1.0)
                  for i, o in enumerate(ops)))


def run(trace, decisions=(), budget=None):
    return simulate(trace, Plan(decisions=tuple(decisions)), cost=Cost.for_trace(trace, PROFILE), budget=budget)


def one_activation(size=GB):
    """Storage 0 (`size` bytes) is written by op 0 and read again by op 4; 5 ops of 1 s."""
    return make_trace([(size, "activation", 0, 5, False)], [((), (0,)), ((), ()), ((), ()), ((), ()), ((0,), ())])


def test_no_plan_is_the_baseline():
    trace = chain_trace(6)
    result = simulate(trace, device="gtx1080ti")
    assert result.time_s == result.baseline_time_s
    assert result.peak_load_bytes == trace.peak_load_bytes
    assert result.overhead == 0.0


def test_hidden_swap_costs_nothing():
    # out after op 0: D2H 1 s -> 2 s; prefetch at op 2 (t=2) lands at 3; op 4 starts at 4.
    result = run(one_activation(), [Decision(storage=0, action="swap", out_after=0, back_before=4, trigger=2)])
    assert result.time_s == pytest.approx(5.0)
    assert result.breakdown["prefetch_stall_s"] == 0
    assert result.link_bytes == 2 * GB
    assert result.host_peak_bytes == GB


def test_swap_outlasting_its_gap_costs_the_difference():
    # 3e9 bytes: D2H 1 -> 4; the prefetch issued at t=2 waits for the data to reach the host (4)
    # and lands at 7; op 4 would start at 4, so it stalls 3 s: total 8 against 5.
    result = run(one_activation(3 * GB), [Decision(storage=0, action="swap", out_after=0, back_before=4, trigger=2)])
    assert result.time_s == pytest.approx(8.0)
    assert result.breakdown["prefetch_stall_s"] == pytest.approx(3.0)


def test_budget_wait_costs_the_wait():
    # Storage 1 (1e9) is born at op 1 (t=1) but storage 0 is still being copied out until t=2,
    # and the budget holds only one of them: op 1 waits 1 s. Prefetch at op 3 lands in time.
    trace = make_trace([(GB, "activation", 0, 5, False), (GB, "temp", 1, 2, False)],
                       [((), (0,)), ((), (1,)), ((), ()), ((), ()), ((0,), ())])
    result = run(trace, [Decision(storage=0, action="swap", out_after=0, back_before=4, trigger=3)], budget=GB)
    assert result.breakdown["memory_stall_s"] == pytest.approx(1.0)
    assert result.time_s == pytest.approx(6.0)
    assert result.peak_load_bytes == GB


def test_recompute_costs_its_producer_chain():
    # Storage 1 is produced by op 0 (2 s) from storage 0; rebuilding it before op 4 re-runs op 0.
    trace = make_trace([(10, "input", 0, 5, False), (GB, "activation", 0, 5, False)],
                       [((0,), (1,), 2.0), ((), ()), ((), ()), ((), ()), ((0, 1), ())])
    result = run(trace, [Decision(storage=1, action="recompute", out_after=0, back_before=4)])
    assert result.breakdown["recompute_s"] == pytest.approx(2.0)
    assert result.time_s == pytest.approx(result.baseline_time_s + 2.0)
    assert result.peak_load_bytes == GB + 10


def test_recursive_chain_rebuilds_recomputed_inputs():
    # 0 -> op0 -> 1 -> op1 -> 2. Storage 2 is rebuilt before op 4 while storage 1 is still away
    # (until op 5), so its chain re-runs op 1 and, first, op 0: 2 s more, with storage 1 held
    # temporarily.
    trace = make_trace([(10, "input", 0, 6, False), (100, "activation", 0, 6, False), (1000, "activation", 1, 5, False)],
                       [((0,), (1,)), ((1,), (2,)), ((), ()), ((), ()), ((2,), ()), ((1,), ())])
    result = run(trace, [Decision(storage=1, action="recompute", out_after=1, back_before=5),
                         Decision(storage=2, action="recompute", out_after=1, back_before=4)])
    assert result.breakdown["recompute_s"] == pytest.approx(3.0)  # ops 1 and 0 for storage 2, op 0 for storage 1


def test_sync_swap_stalls_the_boundary():
    # A synchronous swap-out after op 0 holds the compute stream until the copy ends (t=2).
    result = run(one_activation(), [Decision(storage=0, action="swap", out_after=0, back_before=4, trigger=2,
                                             sync=True)])
    assert result.breakdown["sync_stall_s"] == pytest.approx(1.0)
    assert result.time_s == pytest.approx(6.0)


def test_compression_shrinks_link_bytes_and_costs_kernels():
    result = run(one_activation(), [Decision(storage=0, action="swap", out_after=0, back_before=4, trigger=2,
                                             compress_ratio=0.25)])
    assert result.link_bytes == 2 * GB // 4
    assert result.host_peak_bytes == GB // 4
    # compress and decompress each read and write 1e9 bytes at 1e9 B/s: 2 s each.
    assert result.breakdown["recompute_s"] == pytest.approx(4.0)


def test_infeasible_budget_reports_op_and_shortfall():
    trace = make_trace([(GB, "activation", 0, 5, False), (GB, "temp", 1, 2, False)],
                       [((), (0,)), ((), (1,)), ((), ()), ((), ()), ((0,), ())])
    result = run(trace, budget=GB + 5)
    assert not result.feasible
    assert result.infeasible_op == 1
    assert result.shortfall_bytes == GB - 5


def test_wrap_around_weight_swap_prefetched_in_the_head():
    # A weight read by ops 1 and 3 starts on the host, is prefetched at op 0 (lands at 1) and goes
    # back after op 3; nothing stalls and it is never resident at op 0.
    trace = make_trace([(GB, "param", 0, 5, True), (10, "activation", 0, 5, False)],
                       [((), (1,)), ((0,), ()), ((), ()), ((0,), ()), ((1,), ())])
    result = run(trace, [Decision(storage=0, action="swap", out_after=3, back_before=1, trigger=0)], budget=GB + 10)
    assert result.feasible
    assert result.time_s == pytest.approx(5.0)
    assert result.host_peak_bytes == GB


def test_timeline_matches_peak():
    trace = chain_trace(5)
    result = simulate(trace, device="v100", timeline=True)
    assert result.timeline_load.max() == trace.peak_load_bytes
    assert np.all(np.diff(result.op_start_s) >= 0)


def _random_plan(trace, rng):
    decisions = []
    for sid, acc in enumerate(trace.accesses):
        if trace.storages[sid].persistent or len(acc) < 2 or rng.random() < 0.5:
            continue
        k = rng.randrange(len(acc) - 1)
        if acc[k + 1] - acc[k] < 2:
            continue
        if trace.recomputable(sid) and rng.random() < 0.4:
            decisions.append(Decision(storage=sid, action="recompute", out_after=acc[k], back_before=acc[k + 1]))
        else:
            decisions.append(Decision(storage=sid, action="swap", out_after=acc[k], back_before=acc[k + 1],
                                      trigger=rng.randrange(acc[k] + 1, acc[k + 1] + 1)))
    return Plan(decisions=tuple(decisions))


def test_random_plans_respect_the_budget():
    rng = random.Random(7)
    for n in (4, 8, 12):
        trace = chain_trace(n, sizes=[rng.randrange(1, 64) * 2**20 for _ in range(n)])
        sim = Simulator(trace, Cost.for_trace(trace, "v100"))
        for _ in range(30):
            plan = _random_plan(trace, rng)
            budget = int(trace.peak_load_bytes * rng.uniform(0.3, 1.0))
            result = sim.run(plan, budget)
            if result.feasible:
                assert result.peak_load_bytes <= budget
                assert result.time_s >= result.baseline_time_s - 1e-12
