"""Reusing work between plans (memplan.sim.memo) changes no simulated result."""

import itertools
import random

import numpy as np
import pytest

from memplan.budget import NO_LIMIT
from memplan.model import Decision, Plan
from memplan.planners.kit.featuremaps import Decoder, feature_maps
from memplan.planners.home.pso import random_policies
from memplan.problem import Problem
from memplan.sim.arrays import producer_ids
from memplan.sim.chains import chain_groups, chains_of
from memplan.sim.decisions import DecisionArrays
from memplan.sim.memo import MISS, ProbeMemo
from memplan.sim.program import compile_program
from memplan.sim.simulate import Simulator
from memplan.testing.synthetic import MIB, chain_trace
from memplan.workflows.optimize import trace_step

from tests.exec.helpers import tiny_workload


def test_probe_memo_asks_the_recorded_questions_and_reuses_only_matching_answers():
    facts = {"a": True, "b": False, "c": True}
    calls = []

    def fn(ask):  # asks "a"; only when it is true, asks "b" too
        calls.append(1)
        return ("x", ask("b")) if ask("a") else ("y",)

    memo = ProbeMemo()
    assert memo.compute("k", facts.get, fn) == ("x", False)
    assert memo.compute("k", facts.get, fn) == ("x", False) and len(calls) == 1
    facts["b"] = True
    assert memo.lookup("k", facts.get) is MISS
    assert memo.compute("k", facts.get, fn) == ("x", True) and len(calls) == 2
    facts["a"] = False
    assert memo.compute("k", facts.get, fn) == ("y",) and len(calls) == 3
    facts["a"], facts["b"] = True, False
    assert memo.compute("k", facts.get, fn) == ("x", False) and len(calls) == 3  # the first path again


def test_memo_limit_starts_over():
    memo = ProbeMemo(limit=3)
    for k in range(5):
        memo.compute(k, lambda item: True, lambda ask: ask("q"))
    assert memo.nodes <= 3 + 2


def _random_plans(trace, rng: random.Random, count: int):
    """Swaps and recomputes over gaps between accesses, recompute inputs often away themselves."""
    plans = []
    for _ in range(count):
        decisions = []
        for sid, acc in enumerate(trace.accesses):
            if trace.storages[sid].persistent or len(acc) < 2 or rng.random() < 0.4:
                continue
            k = max(range(len(acc) - 1), key=lambda j: acc[j + 1] - acc[j])
            if acc[k + 1] - acc[k] < 2:
                continue
            if trace.recomputable(sid) and rng.random() < 0.6:
                decisions.append(Decision(storage=sid, action="recompute", out_after=acc[k], back_before=acc[k + 1]))
            else:
                decisions.append(Decision(storage=sid, action="swap", out_after=acc[k], back_before=acc[k + 1],
                                          trigger=rng.randrange(acc[k] + 1, acc[k + 1] + 1)))
        plans.append(Plan(decisions=tuple(decisions)))
    return plans


def _policy_plans(trace, count: int):
    fm = feature_maps(trace, min_bytes=0)
    decode = Decoder(fm)
    return [Plan(decisions=decode(p)) for p in random_policies(fm.allowed(), count, np.random.default_rng(1))]


def _same(a, b):
    assert (a.feasible, a.time_s, a.peak_load_bytes, a.link_bytes, a.infeasible_op, a.shortfall_bytes) == \
        (b.feasible, b.time_s, b.peak_load_bytes, b.link_bytes, b.infeasible_op, b.shortfall_bytes)
    assert a.breakdown == b.breakdown


@pytest.fixture(scope="module")
def tiny():
    w = tiny_workload()
    return trace_step(w.step, w.inputs, w.model, w.optimizer)


@pytest.mark.parametrize("which", ["chain", "tiny"])
def test_a_reused_simulator_gives_what_a_fresh_one_gives(which, tiny):
    trace = chain_trace(14, sizes=[(8 + 16 * (i % 5)) * MIB for i in range(14)]) if which == "chain" else tiny
    cost = Problem.of(trace).cost
    plans = _random_plans(trace, random.Random(7), 25) + _policy_plans(trace, 25)
    plans += plans[::-1]  # the second pass meets every plan's chains in the memos
    warm = Simulator(trace, cost)
    budget = int(0.8 * trace.peak_load_bytes)
    for plan in plans:
        for cap in (NO_LIMIT, budget):
            _same(warm.run(plan, cap), Simulator(trace, cost).run(plan, cap))
    for plan in plans[:10]:
        fresh = compile_program(Problem(trace, cost), plan)  # no cap: every plan compiles
        again = compile_program(Problem(trace, cost), plan, simulator=warm)
        assert (fresh.actions, fresh.rebuilds) == (again.actions, again.rebuilds)


@pytest.mark.parametrize("which", ["chain", "tiny"])
def test_chains_by_op_from_a_warm_memo_are_the_chains_of_the_plan(which, tiny):
    """`chain_groups` (chains by op, with their kernel rows, reads and replayed ops) from a memo warmed by
    other plans gives what `chains_of` computes afresh, and the arrays the simulator used to build from it."""
    trace = chain_trace(14, sizes=[(8 + 16 * (i % 5)) * MIB for i in range(14)]) if which == "chain" else tiny
    durations = np.asarray(Problem.of(trace).cost.durations, dtype=np.float64)
    producers = producer_ids(trace)
    plans = _random_plans(trace, random.Random(11), 25) + _policy_plans(trace, 25)
    memo, n, checked = ProbeMemo(), len(trace.storages), 0
    for plan in plans + plans[::-1]:
        arrays = DecisionArrays.of(plan.decisions)
        fresh = chains_of(trace, arrays, durations, producers)
        index, groups = chain_groups(trace, arrays, durations, producers, memo)
        chains = list(itertools.chain.from_iterable(g.chains for g in groups))
        assert list(zip(index.tolist(), chains)) == list(fresh.items())
        if not fresh:
            continue
        checked += 1
        rows = np.concatenate([g.rows for g in groups])
        assert rows.tolist() == [list(map(float, c.kernel_row)) for c in fresh.values()]
        codes = sorted({int(arrays.back_before[k]) * n + r for k, c in fresh.items() for r in c.inputs})
        assert np.concatenate([g.read_codes for g in groups]).tolist() == codes
        replayed = sorted({j for c in fresh.values() for step in c.steps for j in step.ops})
        assert np.unique(np.concatenate([g.ops for g in groups])).tolist() == replayed
    assert checked >= len(plans)  # most plans recompute something
