"""AutoSwap (paper 000 §IV): candidates, scores, load_min, selection and schedule.

Every check compares with a brute-force oracle written here, over plain Python loops on
the trace's storages and accesses.
"""

import numpy as np
import pytest

from memplan.cost.model import Cost
from memplan.errors import InfeasibleBudgetError, MemplanError
from memplan.planners.autoswap import load_min_bytes
from memplan.planners.autoswap.scores import all_scores
from memplan.planners.base import plan
from memplan.planners.kit.candidates import DEFAULT_MIN_BYTES, find_candidates
from memplan.sim.validate import validate
from memplan.testing.synthetic import MIB, chain_trace

PROFILE = "gtx1080ti"
SCORE_VARIANTS = ("doa", "aoa", "wdoa", "swdoa")


def _trace():
    # Uneven sizes so the scores disagree; small weights fall under the 1 MiB threshold.
    return chain_trace(8, sizes=[s * MIB for s in (48, 40, 32, 24, 64, 16, 8, 56)], param_bytes=2 * MIB,
                       flops_per_layer=4e10)


def _absent_ops(n, out_after, until):
    """Ops strictly between out_after and until, walking around the iteration end."""
    if until > out_after:
        return list(range(out_after + 1, until))
    return list(range(out_after + 1, n)) + list(range(until))


def _oracle_gaps(trace, min_bytes, multi):
    """Primary: gaps around the peak op and cross-iteration gaps of persistent storages; extras: the rest."""
    n, peak = len(trace.ops), int(np.argmax(trace.load))
    primary, extra = set(), set()
    for s in trace.storages:
        acc = sorted({op.index for op in trace.ops if s.id in op.reads or s.id in op.writes})
        if s.nbytes < min_bytes or not acc:
            continue
        pairs = [(a, b) for a, b in zip(acc, acc[1:]) if b - a > 1]
        if s.persistent and acc[0] + (n - 1 - acc[-1]) > 0:
            pairs.append((acc[-1], acc[0]))
        for a, b in pairs:
            cross_iteration = b <= a
            (primary if cross_iteration or peak in _absent_ops(n, a, b) else extra).add((s.id, a, b))
    return primary, (extra if multi else set())


def _oracle_load(trace, away):
    """Load per op with storages away over the given (sid, out_after, until) ranges."""
    n = len(trace.ops)
    load = [sum(s.nbytes for s in trace.storages if s.alloc_op <= t < s.free_op) for t in range(n)]
    for sid, out_after, until in away:
        for t in _absent_ops(n, out_after, until):
            load[t] -= trace.storages[sid].nbytes
    return load


@pytest.mark.parametrize("multi", [False, True])
def test_candidates_match_oracle(multi):
    trace = _trace()
    cand = find_candidates(trace, DEFAULT_MIN_BYTES, multi)
    got = list(zip(cand.storage.tolist(), cand.out_after.tolist(), cand.back_before.tolist()))
    primary, extra = _oracle_gaps(trace, DEFAULT_MIN_BYTES, multi)
    assert len(got) == len(set(got))
    assert {g for g, p in zip(got, cand.primary) if p} == primary
    assert {g for g, p in zip(got, cand.primary) if not p} == extra
    assert primary, "the trace must have candidates for this test to mean anything"


def test_scores_match_oracle():
    trace = _trace()
    cost = Cost.for_trace(trace, PROFILE)
    cand = find_candidates(trace)
    scores = all_scores(cand, cost, trace.load)
    n, dur = len(trace.ops), cost.durations
    for i, (sid, o, b) in enumerate(zip(cand.storage, cand.out_after, cand.back_before)):
        ops = _absent_ops(n, int(o), int(b))
        size = trace.storages[sid].nbytes
        doa = sum(dur[t] for t in ops) - cost.d2h_s(size) - cost.h2d_s(size)
        assert scores["doa"][i] == pytest.approx(doa, rel=1e-9, abs=1e-12)
        assert scores["aoa"][i] == pytest.approx(doa * size if doa >= 0 else doa / size, rel=1e-9, abs=1e-18)
        wdoa = sum(float(trace.load[t]) * dur[t] for t in ops)
        assert scores["wdoa"][i] == pytest.approx(wdoa, rel=1e-9)


def test_swdoa_order_matches_naive_greedy():
    trace = _trace()
    cost = Cost.for_trace(trace, PROFILE)
    cand = find_candidates(trace)
    gaps = list(zip(cand.storage.tolist(), cand.out_after.tolist(), cand.back_before.tolist()))
    n, dur = len(trace.ops), cost.durations
    taken, order = [], []
    while len(order) < len(gaps):
        load = _oracle_load(trace, taken)
        rest = [i for i in range(len(gaps)) if i not in order]
        best = max(rest, key=lambda i: (sum(load[t] * dur[t] for t in _absent_ops(n, gaps[i][1], gaps[i][2])), -i))
        order.append(best)
        taken.append(gaps[best])
    score = all_scores(cand, cost, trace.load)["swdoa"]
    assert list(np.lexsort((np.arange(len(score)), -score))) == order


@pytest.mark.parametrize("multi", [False, True])
def test_load_min_matches_oracle(multi):
    trace = _trace()
    primary, extra = _oracle_gaps(trace, DEFAULT_MIN_BYTES, multi)
    assert load_min_bytes(trace, multi_swap=multi) == max(_oracle_load(trace, primary | extra))


def _check_plan(trace, result, budget):
    """Independent checks of a swap plan: gaps free of accesses, triggers in range, FIFO, budget."""
    n = len(trace.ops)
    for d in result.decisions:
        touched = {op.index for op in trace.ops if d.storage in op.reads or d.storage in op.writes}
        assert d.action == "swap" and d.out_after in touched and d.back_before in touched
        assert not touched & set(_absent_ops(n, d.out_after, d.back_before)), d
        assert d.trigger == d.back_before or d.trigger in _absent_ops(n, d.out_after, d.back_before), d
    # FIFO: in order of next access (cross-iteration ones in the next iteration), issue times never go back.
    def unrolled(op, d):
        return op + n if d.wraps and op <= d.back_before else op

    by_need = sorted(result.decisions, key=lambda d: (unrolled(d.back_before, d), d.storage))
    issue = [unrolled(d.trigger, d) for d in by_need]
    assert issue == sorted(issue), "prefetches must issue in FIFO order"
    away = [(d.storage, d.out_after, d.trigger) for d in result.decisions]
    assert max(_oracle_load(trace, away)) <= budget


@pytest.mark.parametrize("variant", SCORE_VARIANTS)
@pytest.mark.parametrize("share", [0.9, 0.75, 0.6])
def test_score_variants_fit_budget(variant, share):
    trace = _trace()
    budget = int(trace.peak_load_bytes * share)
    result = plan(trace, budget, planner=f"autoswap:{variant}", profile=PROFILE, simulate_result=False)
    assert result.decisions
    _check_plan(trace, result, budget)


def test_no_swaps_when_budget_covers_peak():
    trace = _trace()
    result = plan(trace, trace.peak_load_bytes, planner="autoswap:doa", profile=PROFILE, simulate_result=False)
    assert result.decisions == ()


def test_below_load_min_fails_naming_it():
    trace = _trace()
    floor = load_min_bytes(trace)
    with pytest.raises(InfeasibleBudgetError, match="load_min") as err:
        plan(trace, floor - 1, planner="autoswap:wdoa", profile=PROFILE, simulate_result=False)
    assert err.value.min_feasible_bytes == floor
    result = plan(trace, floor, planner="autoswap:wdoa", profile=PROFILE, simulate_result=False)
    _check_plan(trace, result, floor)


def test_multi_swap_goes_below_load_min():
    trace = _trace()
    floor, deeper = load_min_bytes(trace), load_min_bytes(trace, multi_swap=True)
    assert deeper < floor
    result = plan(trace, deeper, planner="autoswap:doa", profile=PROFILE, simulate_result=False,
                  allow_multi_swap=True)
    _check_plan(trace, result, deeper)
    per_storage = {}
    for d in result.decisions:
        per_storage[d.storage] = per_storage.get(d.storage, 0) + 1
    assert max(per_storage.values()) > 1, "some storage must be swapped more than once"


def test_just_in_time_trigger_single_swap():
    # Loose budget: one swap suffices and nothing competes on the link, so the prefetch
    # is issued at the latest op whose start leaves time for the whole copy.
    trace = _trace()
    cost = Cost.for_trace(trace, PROFILE)
    budget = trace.peak_load_bytes - 1
    result = plan(trace, budget, planner="autoswap:doa", profile=PROFILE, cost=cost, simulate_result=False)
    assert len(result.decisions) == 1
    d = result.decisions[0]
    need = cost.h2d_s(trace.storages[d.storage].nbytes)
    starts = np.concatenate([[0.0], np.cumsum(cost.durations)])
    expected = max(t for t in range(d.out_after + 1, d.back_before + 1) if starts[d.back_before] - starts[t] >= need
                   or t == d.out_after + 1)
    assert d.trigger == expected


def test_bad_arguments():
    trace = _trace()
    with pytest.raises(MemplanError, match="weights"):
        plan(trace, "80%", planner="autoswap:bo", simulate_result=False, weights=[2, 0, 0, 0])
    with pytest.raises(MemplanError, match="objective"):
        plan(trace, "80%", planner="autoswap:bo", simulate_result=False, objective="guess")


def test_fixed_weights_one_hot_equals_pure_score():
    trace = _trace()
    for k, variant in enumerate(("aoa", "doa", "wdoa", "swdoa")):
        weights = [0.0] * 4
        weights[k] = 1.0
        fixed = plan(trace, "70%", planner="autoswap:bo", profile=PROFILE, simulate_result=False, weights=weights)
        pure = plan(trace, "70%", planner=f"autoswap:{variant}", profile=PROFILE, simulate_result=False)
        assert fixed.decisions == pure.decisions


def test_cross_iteration_prefetch_in_previous_tail():
    # Big weights, fast layers: a weight's swap-in cannot hide in the head of the
    # iteration before its forward use, so it is issued in the tail of the one before.
    trace = chain_trace(6, sizes=[8 * MIB] * 6, param_bytes=64 * MIB, flops_per_layer=1e9)
    budget = int(trace.peak_load_bytes * 0.9)
    result = plan(trace, budget, planner="autoswap:doa", profile=PROFILE, simulate_result=False)
    _check_plan(trace, result, budget)
    tail = [d for d in result.decisions if d.wraps and d.trigger > d.out_after]
    assert tail, "expected a prefetch issued in the previous iteration's tail"


def test_combined_mode_lays_out_a_valid_pool():
    trace = _trace()
    budget = int(trace.peak_load_bytes * 0.7)
    result = plan(trace, budget, planner="autoswap:wdoa+smartpool", profile=PROFILE, simulate_result=False,
                  pool_time_limit_s=0.5)
    pure = plan(trace, budget, planner="autoswap:wdoa", profile=PROFILE, simulate_result=False)
    assert result.decisions == pure.decisions and result.decisions
    away = [(d.storage, d.out_after, d.trigger) for d in result.decisions]
    assert result.pool and result.pool_bytes >= max(_oracle_load(trace, away))
    assert validate(trace, result, budget=budget) == []
