"""The simulator on hand-built traces whose answers are worked out by hand.

Every trace here has ops of exactly 1 s and a link of exactly 1e9 bytes/s each way with no
latency, so a storage of 1e9 bytes takes exactly 1 s to copy.
"""

import dataclasses
import random

import numpy as np
import pytest

from memplan.budget import NO_LIMIT
from memplan.cost.model import Cost
from memplan.cost.profiles import BUILTIN
from memplan.model import Decision, Plan
from memplan.sim._codes import A_RELEASE
from memplan.sim.simulate import Simulator
from memplan.sim.stage import simulate
from memplan.testing.synthetic import chain_trace
from memplan.model import Op, Storage, Trace

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
    result = simulate(trace, profile="gtx1080ti")
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


def test_wrap_around_tail_prefetch_late_for_the_next_iteration():
    # A 2e9-byte weight read by ops 1 and 3 goes out after op 3 (D2H 4 -> 6) and is prefetched
    # at op 4 for the next iteration: the H2D waits for the host copy (6) and lands at 8. The
    # iteration's compute ends at 5, and its end waits for the swap-out still copying (released
    # there): 1 s, to 6. The next one needs the weight when its op 1 starts (6 + 1 = 7): 1 s late,
    # charged at the boundary. Peak at t=4: the weight still copying out (2e9) plus the tail
    # prefetch's buffer (2e9).
    trace = make_trace([(2 * GB, "param", 0, 5, True)], [((), ()), ((0,), ()), ((), ()), ((0,), ()), ((), ())])
    result = run(trace, [Decision(storage=0, action="swap", out_after=3, back_before=1, trigger=4)])
    assert result.time_s == pytest.approx(7.0)
    assert result.breakdown["sync_stall_s"] == pytest.approx(1.0)
    assert result.breakdown["prefetch_stall_s"] == pytest.approx(1.0)
    assert result.peak_load_bytes == 4 * GB
    assert result.host_peak_bytes == 2 * GB


def test_wrap_around_head_prefetch_waits_for_last_iterations_swap_out():
    # A 2e9-byte weight starts on the host; its prefetch at op 0 runs 0 -> 2, so op 1 waits 1 s
    # (ops: 0-1, 1 stalls to 2, 2-3, 3-4, 4-5, 5-6). It goes out after op 3 (t=5): D2H 5 -> 7,
    # still copying when the compute ends (6): the step's end, where it is released, waits for it
    # (1 s). The next iteration then starts at 7, its head prefetch no later than this one's: no
    # more at the boundary.
    trace = make_trace([(2 * GB, "param", 0, 5, True)], [((), ()), ((0,), ()), ((), ()), ((0,), ()), ((), ())])
    result = run(trace, [Decision(storage=0, action="swap", out_after=3, back_before=1, trigger=0)])
    assert result.time_s == pytest.approx(7.0)
    assert result.breakdown["prefetch_stall_s"] == pytest.approx(1.0)
    assert result.breakdown["sync_stall_s"] == pytest.approx(1.0)
    assert result.peak_load_bytes == 2 * GB


def _weight_swapped_at_the_steps_end():
    """A 2e9-byte weight read by ops 3 and 5 (the last) and a 1e9-byte activation of ops 0-1; the
    weight goes out after the last op and is prefetched at op 2 for op 3."""
    trace = make_trace([(2 * GB, "param", 0, 6, True), (GB, "activation", 0, 2, False)],
                       [((), (1,)), ((1,), ()), ((), ()), ((0,), ()), ((), ()), ((0,), ())])
    return trace, Plan(decisions=(Decision(storage=0, action="swap", out_after=5, back_before=3, trigger=2),))


def test_a_swap_out_at_the_steps_end_is_carried_over_to_the_next_step():
    # Steady state: the step starts with the weight still copying out (D2H 0 -> 2), its bytes on
    # the device (2e9 + the activation's 1e9: the peak). It is released at op 2's start, when its
    # copy is done, and prefetched: H2D 2 -> 4, so op 3 waits 1 s. Its swap-out after op 5 (t=6)
    # is the next step's: the step ends at 6 without waiting for it.
    trace, plan = _weight_swapped_at_the_steps_end()
    sim = Simulator(trace, Cost.for_trace(trace, PROFILE))
    result = sim.run(plan)
    assert result.time_s == pytest.approx(7.0)
    assert result.breakdown["prefetch_stall_s"] == pytest.approx(1.0)
    assert result.breakdown["sync_stall_s"] == result.breakdown["memory_stall_s"] == 0.0
    assert result.peak_load_bytes == 3 * GB
    rows = sim.program_rows(plan, NO_LIMIT)[1]
    releases = [(int(op), bool(after)) for op, after, kind, _ in rows if kind == A_RELEASE]
    assert releases == [(2, False)]  # in the step, not at its end
    # Under 2.5e9 the activation's allocation at op 0 waits for the carried copy (2 s): the
    # prefetch then starts at 4 and op 3 still waits 1 s.
    tight = sim.run(plan, int(2.5 * GB))
    assert tight.time_s == pytest.approx(9.0)
    assert tight.breakdown["memory_stall_s"] == pytest.approx(2.0)
    assert tight.peak_load_bytes == 2 * GB


def test_a_captured_step_waits_for_its_swap_outs_at_its_end():
    # A CUDA graph's replay joins every copy at its end: the weight starts on the host, lands at 4
    # (op 3 waits 1 s), and the step waits for its swap-out after op 5 (D2H 7 -> 9): 2 s.
    trace, plan = _weight_swapped_at_the_steps_end()
    cost = dataclasses.replace(Cost.for_trace(trace, PROFILE), captured=True)
    result = Simulator(trace, cost).run(plan)
    assert result.time_s == pytest.approx(9.0)
    assert result.breakdown["sync_stall_s"] == pytest.approx(2.0)
    assert result.peak_load_bytes == 2 * GB


def test_recompute_runs_while_a_prefetch_is_still_landing():
    # Op 0 (2 s) makes storage 1 from storage 0; op 1 makes storage 2 (3e9 bytes). Storage 2 goes
    # out after op 1 (t=3, D2H 3 -> 6), its prefetch is issued at op 2 (t=3) but waits for the
    # host copy and lands at 9. Op 4 needs both: the recompute of storage 1 (op 0 again, 2 s)
    # runs first, 5 -> 7, then op 4 waits for the prefetch until 9 and runs 9 -> 10.
    trace = make_trace([(10, "input", 0, 5, False), (100, "activation", 0, 5, False),
                        (3 * GB, "activation", 1, 5, False)],
                       [((0,), (1,), 2.0), ((), (2,)), ((), ()), ((), ()), ((1, 2), ())])
    result = run(trace, [Decision(storage=1, action="recompute", out_after=0, back_before=4),
                         Decision(storage=2, action="swap", out_after=1, back_before=4, trigger=2)])
    assert result.time_s == pytest.approx(10.0)
    assert result.breakdown["recompute_s"] == pytest.approx(2.0)
    assert result.breakdown["prefetch_stall_s"] == pytest.approx(2.0)


def test_lanes_show_recompute_and_copies():
    # The recompute test above with a timeline: op 0 (0-2), ops 1-3 (2-5), the chain (5-7), op 4
    # (7-8); no copies. Then the hidden swap: D2H 1-2 and H2D 2-3.
    trace = make_trace([(10, "input", 0, 5, False), (GB, "activation", 0, 5, False)],
                       [((0,), (1,), 2.0), ((), ()), ((), ()), ((), ()), ((0, 1), ())])
    result = simulate(trace, Plan(decisions=(Decision(storage=1, action="recompute", out_after=0, back_before=4),)),
                      cost=Cost.for_trace(trace, PROFILE), timeline=True)
    assert result.lanes["compute"] == [(0.0, 2.0), (2.0, 3.0), (3.0, 4.0), (4.0, 5.0), (5.0, 7.0), (7.0, 8.0)]
    assert result.lanes["d2h"] == [] and result.lanes["h2d"] == []
    assert list(result.op_start_s) == [0.0, 2.0, 3.0, 4.0, 7.0]
    swap = simulate(one_activation(), Plan(decisions=(Decision(storage=0, action="swap", out_after=0, back_before=4,
                                                                trigger=2),)),
                    cost=Cost.for_trace(one_activation(), PROFILE), timeline=True)
    assert swap.lanes["d2h"] == [(1.0, 2.0)] and swap.lanes["h2d"] == [(2.0, 3.0)]
    # load: 1e9 from t=0 until the swap-out completes at 2, 0 for an instant, 1e9 again from the
    # prefetch (t=2) to the end (the release after the last op is not drawn)
    points = list(zip(swap.timeline_t.tolist(), swap.timeline_load.tolist()))
    assert points[0] == (0.0, GB) and (2.0, 0) in points and points[-1][1] == GB
    assert all(load == GB for t, load in points if t != 2.0)


def test_timeline_matches_peak():
    trace = chain_trace(5)
    result = simulate(trace, profile="v100", timeline=True)
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
                parts = result.breakdown
                accounted = (parts["compute_s"] + parts["memory_stall_s"] + parts["prefetch_stall_s"]
                             + parts["recompute_s"] + parts["sync_stall_s"])
                assert result.time_s == pytest.approx(accounted, rel=1e-9)


def test_a_pool_only_trace_runs_its_time_axis_in_no_time():
    # A minimalloc problem has no ops: its steps cost nothing and the load is its buffers'.
    trace = Trace(storages=(Storage(id=0, nbytes=100, kind="temp", alloc_op=0, free_op=3),
                            Storage(id=1, nbytes=200, kind="temp", alloc_op=2, free_op=5)),
                  ops=(), num_steps_hint=5)
    result = simulate(trace, None, budget="none")
    assert result.feasible and result.time_s == 0.0 and result.peak_load_bytes == 300
    assert not simulate(trace, None, budget=299).feasible
