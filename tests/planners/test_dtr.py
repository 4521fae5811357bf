"""The `dtr` planner: DTR's greedy eviction by h_DTR on a hand-built chain, and a real run under its plan."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from memplan.cli import main
from memplan.cost.model import Cost
from memplan.errors import InfeasibleBudgetError
from memplan.model import Decision
from memplan.planners.dtr.eviction import DtrRun
from memplan.planners.base import plan
from memplan.planners.dtr import HOOKED_TRIES, _fitting, dtr_decisions
from memplan.problem import Problem
from memplan.sim.stage import simulate
from memplan.sim.validate import validate
from memplan.testing.synthetic import MIB, chain_trace

# chain_trace(8): a_k (storage 9 + k, 64 MiB) is made by op k and read by op k+1 and by backward
# op 16-k; the peak (676 MiB) is at op 9, the first weight-gradient op.
A0, A1, A2 = 9, 10, 11


def _chain():
    return chain_trace(8, act_bytes=64 * MIB, param_bytes=4 * MIB)


def _unit_cost(trace):
    return Cost(profile=Problem.of(trace).cost.profile, durations=np.ones(len(trace.ops)))


def test_evicts_the_stalest_first_then_weighs_the_evicted_neighbourhood():
    # Cap 128 MiB under the peak. Op 7 (a7) needs room: every activation costs one op and has the
    # same size, so the stalest, a0 (last used by op 1), goes. Op 8 needs room again: a1 is the
    # stalest (staleness 6) but rebuilding it now means rebuilding a0 too (cost 2: h = 2/6), while
    # a2 costs 1 at staleness 5 (h = 1/5): a2 goes, not a1 (DTR's e*, not the local cost).
    trace = _chain()
    gaps = DtrRun(trace, np.ones(len(trace.ops)), trace.peak_load_bytes - 128 * MIB).gaps()
    assert sorted(gaps) == [(A0, 1, 15), (A2, 3, 13)]


def test_plan_is_those_evictions_valid_and_within_budget():
    trace, budget = _chain(), _chain().peak_load_bytes - 128 * MIB
    cost = _unit_cost(trace)
    result = plan(trace, budget, planner="dtr", cost=cost)
    assert validate(trace, result) == []
    assert {(d.storage, d.out_after, d.back_before) for d in result.decisions} == {(A0, 1, 15), (A2, 3, 13)}
    assert all(d.action == "recompute" for d in result.decisions)
    sim = simulate(trace, result, cost=cost)
    assert sim.feasible and sim.peak_load_bytes <= budget
    assert sim.breakdown["recompute_s"] == pytest.approx(2.0)  # a0 and a2 each replay one op


def test_nothing_moves_at_the_unconstrained_peak():
    trace = _chain()
    assert plan(trace, "100%", planner="dtr").decisions == ()


def test_parameters_and_inputs_are_never_evicted():
    trace = _chain()
    decisions = dtr_decisions(trace, Problem.of(trace).cost, 1)  # a cap nothing fits under
    kinds = {trace.storages[d.storage].kind for d in decisions}
    assert decisions and kinds == {"activation"}
    assert all(isinstance(d, Decision) and d.out_after < d.back_before for d in decisions)


def test_an_unreachable_budget_names_a_load_where_dtr_plans():
    trace = _chain()
    with pytest.raises(InfeasibleBudgetError) as info:
        plan(trace, 100 * MIB, planner="dtr")
    named = info.value.min_feasible_bytes
    assert named > 100 * MIB
    assert validate(trace, plan(trace, named, planner="dtr")) == []


@pytest.mark.slow
@pytest.mark.parametrize("model, batch, budget", [("transformer-encoder", 4, "70%"), ("resnet18-cifar", 32, "80%")])
def test_runs_exactly_on_cpu_within_its_budget(capsys, model, batch, budget):
    assert main(["run", model, "--batch", str(batch), "--planner", "dtr", "--budget", budget,
                 "--steps", "2", "--check", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["planner"] == "dtr" and out["executor"]["recomputed"] > 0
    assert out["max_param_diff"] == 0.0 and out["max_buffer_diff"] == 0.0
    assert out["within_budget"]


class _Levels:
    """A simulator stand-in: every plan fits; the n-th run is at levels[n] and takes times[n]."""

    def __init__(self, levels, times):
        self.levels, self.times, self.plans = list(levels), list(times), []

    def run(self, plan, budget):
        n = len(self.plans)
        self.plans.append(plan)
        return SimpleNamespace(feasible=True, level=self.levels[n], time_s=self.times[n])


@pytest.mark.parametrize("hooked_time, chosen", [(1.0, 1), (3.0, 0)])
def test_an_interpreted_first_plan_gives_way_to_a_faster_hooked_one_at_a_lower_cap(hooked_time, chosen):
    trace = _chain()
    budget = trace.peak_load_bytes - 128 * MIB
    sim = _Levels(["interpreted", "hooked", "hooked"], [2.0, hooked_time, 0.5])
    found = _fitting(trace, Problem.of(trace).cost, sim, budget)
    assert found is sim.plans[chosen] and len(sim.plans) == 2  # the first hooked plan ends the search
    assert sim.plans[1].decisions != sim.plans[0].decisions  # a lower cap: other evictions


def test_a_hooked_first_plan_is_taken_and_the_interpreted_kept_when_none_hooks():
    trace = _chain()
    budget = trace.peak_load_bytes - 128 * MIB
    hooked = _Levels(["hooked"], [2.0])
    assert _fitting(trace, Problem.of(trace).cost, hooked, budget) is hooked.plans[0]
    interpreted = _Levels(["interpreted"] * 10, [2.0] * 10)
    assert _fitting(trace, Problem.of(trace).cost, interpreted, budget) is interpreted.plans[0]
    assert len(interpreted.plans) == 1 + HOOKED_TRIES
