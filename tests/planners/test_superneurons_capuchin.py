"""SuperNeurons and Capuchin as HOME describes them (paper 004 §4.1)."""

from memplan.model import Action
from memplan.planners.kit.featuremaps import feature_maps
from memplan.planners.base import plan as make_plan
from memplan.planners.capuchin import _State
from memplan.planners.superneurons import layer_policy
from memplan.problem import Problem
from memplan.sim.validate import validate
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import MIB, chain_trace
from memplan.workflows.optimize import trace_step

from tests.exec.helpers import tiny_workload


def test_superneurons_swaps_convolutions_and_recomputes_the_rest():
    w = tiny_workload()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    fm = feature_maps(trace, min_bytes=0)
    policy = layer_policy(fm)
    for k, sid in enumerate(fm.storage):
        writers = [trace.ops[j].name for j in trace.writers[int(sid)] if trace.ops[j].phase == "forward"]
        if "convolution" in writers[-1]:
            assert policy[k] == Action.SWAP, writers
        elif any(op in writers[-1] for op in ("batch_norm", "relu", "threshold", "pool")):
            assert policy[k] == Action.RECOMPUTE, writers
        else:
            assert policy[k] == Action.KEEP, writers
    assert {Action.SWAP, Action.RECOMPUTE} <= set(policy.tolist())
    result = make_plan(trace, "70%", planner="superneurons", min_bytes=0)
    assert validate(trace, result) == []


def test_capuchin_swaps_first_and_recomputes_only_when_swaps_do_not_suffice():
    sizes = [(32 + 32 * (i % 3)) * MIB for i in range(12)]
    slow = chain_trace(12, sizes=sizes, flops_per_layer=4e12)  # long layers hide every copy
    fast = chain_trace(12, sizes=sizes, flops_per_layer=1e9)  # copies cannot hide behind these
    loose = make_plan(slow, "50%", planner="capuchin")
    assert {d.action for d in loose.decisions} == {"swap"} and loose.predicted["overhead"] == 0
    tight = make_plan(fast, "60%", planner="capuchin")
    assert "recompute" in {d.action for d in tight.decisions}
    for trace, plan in ((slow, loose), (fast, tight)):
        assert plan.predicted["feasible"] and plan.predicted["peak_load_bytes"] <= plan.budget_bytes
        assert validate(trace, plan) == []


def test_capuchin_moves_a_late_prefetch_earlier_by_its_copy_time():
    trace = chain_trace(12, sizes=[64 * MIB] * 12, flops_per_layer=3e10)
    cost = Problem.of(trace).cost
    fm = feature_maps(trace)
    state = _State(fm, cost, int(0.6 * trace.peak_load_bytes), rounds=6)
    state.swap_with_free_time()
    swapped = [k for k in range(len(fm)) if state.policy[k] == Action.SWAP]
    state.triggers.update({k: int(fm.back_before[k]) for k in swapped})  # issued at the access: late
    moved = state._earlier_triggers()
    assert set(moved) == set(swapped)
    for k, op in moved.items():
        assert fm.out_after[k] < op < fm.back_before[k]
    state.tune()
    assert state._score() < 0.05  # tuning recovers from triggers at the access


class TestSuperNeurons(PlannerConformance):
    planner = "superneurons"


class TestCapuchin(PlannerConformance):
    planner = "capuchin"
