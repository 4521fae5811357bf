"""Recompute executor: in-place updates, batch-norm buffers, and every registered planner.

The oracle is plain training of an identical model from the same seed; parameters and
buffers (batch-norm running statistics, counters) must match.
"""

from __future__ import annotations


import pytest
import torch

from memplan.errors import InfeasibleBudgetError
from memplan.exec import schedule as schedule_mod
from memplan.workflows.optimize import optimize, trace_step
from memplan.planners.base import known_planners
from memplan.planners.base import plan as make_plan
from memplan.model import Decision, Plan

from test_exec_helpers import gap, state_diffs, tiny_workload

SEED = 5
STEPS = 3
REL_TOL = 1e-6
BUDGETS = ("70%", "85%", "100%")  # the first feasible one is used per planner


@pytest.fixture(scope="module")
def tiny_trace():
    w = tiny_workload()
    return trace_step(w.step, w.inputs, w.model, w.optimizer)


def _train(tr=None, plan=None):
    """STEPS steps of a fresh TinyNet, under `plan` when given; returns (model, stats)."""
    w = tiny_workload()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=tr, plan=plan) if plan else None
    torch.manual_seed(SEED)
    for i in range(STEPS):
        (step or w.step)(*w.make_inputs(w.batch, seed=100 + i))
    stats = step.stats() if step else {}
    if step:
        step.close()
    return w.model, stats


@pytest.fixture(scope="module")
def reference():
    return _train()[0]


def _bn_statistics_plan(tr) -> Plan:
    """Recompute conv outputs and batch-norm saved statistics, keep batch-norm outputs.

    Each block is then one region in which batch norm runs again (for its statistics)
    while its output, rectified in place by relu_, is kept: the case where a storage's
    writers (batch norm, relu_) got different recompute answers before the fix, so the
    recomputed conv after them read the un-rectified output.
    """
    decisions = []
    for op in tr.ops:
        if op.phase == "forward" and op.module.startswith("blocks.") and ("batch_norm" in op.name
                                                                          or "convolution" in op.name):
            for sid in op.writes[1:] if "batch_norm" in op.name else op.writes:
                if tr.recomputable(sid) and any(tr.ops[i].phase == "backward" for i in tr.accesses[sid]):
                    out, back = gap(tr, sid)
                    decisions.append(Decision(storage=sid, action="recompute", out_after=out, back_before=back))
    return Plan(decisions=tuple(decisions), planner="test-bn-stats", trace_digest=tr.digest)


def _assert_same(model, reference, rel_tol=0.0):
    diffs = state_diffs(model, reference)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= rel_tol, f"{worst} differs by {diffs[worst]:.3g} (relative)"


def test_recomputed_producer_of_inplace_update_matches_plain_training(tiny_trace, reference):
    model, stats = _train(tiny_trace, _bn_statistics_plan(tiny_trace))
    assert stats["recomputed_ops"] > 0 and stats["recompute_regions"]
    _assert_same(model, reference, REL_TOL)


def test_writers_of_one_storage_get_one_answer(tiny_trace):
    tr = tiny_trace
    chosen = {d.storage for d in _bn_statistics_plan(tr).decisions}
    recomputed, answers = schedule_mod.classify_ops(tr, chosen, set(tr.meta["pack_order"]))
    assert chosen <= recomputed
    forward_writers = [[i for i in tr.writers[s] if tr.ops[i].phase == "forward"] for s in range(len(tr.storages))]
    mutated = [w for w in forward_writers if len(w) > 1]
    assert mutated, "the model should update some storage in place"
    for writers in mutated:
        assert len({answers[i] for i in writers}) == 1, [tr.ops[i].name for i in writers]
    for sid in chosen:  # every op writing a chosen storage runs again
        assert all(answers[i] for i in forward_writers[sid])


def test_runtime_policy_repairs_inconsistent_keys(tiny_trace, reference, monkeypatch):
    """Keys that drifted from the trace (here: answers forced to disagree) still train right."""
    real = schedule_mod.classify_ops

    def drifted(trace, chosen, packed):
        recomputed, answers = real(trace, chosen, packed)
        relu = {i for i in answers if "relu_" in trace.ops[i].name}
        return recomputed, {i: (a and i not in relu) for i, a in answers.items()}

    monkeypatch.setattr(schedule_mod, "classify_ops", drifted)
    model, stats = _train(tiny_trace, _bn_statistics_plan(tiny_trace))
    assert stats["policy_corrections"] > 0
    _assert_same(model, reference, REL_TOL)


def test_batch_norm_buffers_are_not_updated_twice(tiny_trace, reference):
    model, stats = _train(tiny_trace, _bn_statistics_plan(tiny_trace))
    assert stats["recomputed_ops"] > 0
    for name, buf in model.named_buffers():
        ref = dict(reference.named_buffers())[name]
        assert torch.equal(buf, ref), name
    assert all(int(b) == STEPS for n, b in model.named_buffers() if n.endswith("num_batches_tracked"))


def test_no_region_at_the_root(tiny_trace):
    """Storages spanning top-level modules are kept, never checkpointed as the whole model."""
    plan = make_plan(tiny_trace, None, planner="sqrt-n", simulate_result=False)
    w = tiny_workload()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=tiny_trace, plan=plan)
    regions = step.stats()["recompute_regions"]
    step.close()
    assert regions and "" not in regions


def _first_feasible_plan(tr, name):
    for budget in BUDGETS:
        try:
            return make_plan(tr, budget, planner=name, simulate_result=False)
        except InfeasibleBudgetError:
            continue
    pytest.fail(f"planner {name} found no plan even at 100%")


@pytest.mark.parametrize("name", sorted(known_planners()))
def test_every_planner_trains_like_plain_training(tiny_trace, reference, name):
    plan = _first_feasible_plan(tiny_trace, name)
    model, stats = _train(tiny_trace, plan)
    recomputes = any(d.action == "recompute" for d in plan.decisions)
    _assert_same(model, reference, REL_TOL if recomputes else 0.0)
    assert stats.get("diverged_steps", 0) == 0 and stats.get("late_prefetches", 0) == 0
