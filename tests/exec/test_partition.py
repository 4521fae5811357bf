"""A plan lowered onto torch.compile's partitioner: the trace's ops found in the joint graph, the
plan's recomputations taken by the compiled backward, training unchanged.

The compiled tests run AOTAutograd without code generation (the `aot_eager` backend, which
takes the same partitioner): seconds, not Inductor's minutes (tests/workflows/test_compiled.py
runs Inductor once).
"""

from __future__ import annotations

import pytest
import torch

from memplan.errors import MemplanError
from memplan.exec.graph_match import GraphOp, align, op_key, trace_ops
from memplan.exec.partition import (NO_OFFLOAD, NOT_IN_GRAPH, NOT_SAVED, CompiledPlan, PlanPartitioner,
                                    compile_options)
from memplan.model import Action, Decision, Op, Plan, Storage, Trace
from memplan.workflows.step_trace import trace_step
from tests.exec.helpers import recompute_plan, tiny_workload

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_an_in_place_op_and_its_functional_twin_are_one_op():
    assert op_key("aten.relu_.default") == op_key("aten.relu.default") == "aten.relu.default"
    assert op_key("aten.add_.Tensor") == "aten.add.Tensor"
    assert op_key("aten._softmax.default") == "aten._softmax.default"  # a leading underscore stays


def _trace(ops: list[tuple[str, tuple[int, ...]]]) -> Trace:
    """A forward of one-storage ops: (name, shape of what it writes); an in-place op (name ending
    in '_') writes the storage of the op before it."""
    storages, built = [], []
    for i, (name, shape) in enumerate(ops):
        in_place = name.split(".")[1].endswith("_") and storages
        sid = storages[-1].id if in_place else len(storages)
        if not in_place:
            storages.append(Storage(id=sid, nbytes=4, kind="activation", alloc_op=i, free_op=len(ops), shape=shape))
        built.append(Op(index=i, name=name, phase="forward", writes=(sid,)))
    return Trace(storages=tuple(storages), ops=tuple(built))


def test_the_graphs_ops_are_matched_to_the_traces_and_a_decomposition_by_its_shape():
    # the CPU's eager dropout (empty_like, bernoulli_, div_, mul) is one native_dropout compiled
    trace = _trace([("aten.embedding.default", (2, 4)), ("aten.empty_like.default", (2, 4)),
                    ("aten.bernoulli_.float", (2, 4)), ("aten.div_.Scalar", (2, 4)), ("aten.mul.Tensor", (2, 4)),
                    ("aten.addmm.default", (2, 8)), ("aten.relu_.default", (2, 8))])
    graph = [GraphOp(key=op_key(n), shape=s, nodes=()) for n, s in
             [("aten.embedding.default", (2, 4)), ("aten.native_dropout.default", (2, 4)),
              ("aten.addmm.default", (2, 8)), ("aten.relu.default", (2, 8))]]
    assert align(trace, trace_ops(trace), graph) == {0: (0,), 1: (1, 2, 3, 4), 2: (5,), 3: (6,)}


def test_an_op_missing_on_either_side_does_not_shift_the_rest():
    trace = _trace([("aten.addmm.default", (2, 8)), ("aten.gelu.default", (2, 8)), ("aten.addmm.default", (2, 4))])
    graph = [GraphOp(key=op_key(n), shape=None, nodes=()) for n in
             ["aten.addmm.default", "aten.clone.default", "aten.gelu.default", "aten.addmm.default"]]
    assert align(trace, trace_ops(trace), graph) == {0: (0,), 2: (1,), 3: (2,)}


def _traced():
    """TinyNet (in-place ReLUs, batch norm, dropout) and its trace."""
    w = tiny_workload()
    return w, trace_step(w.step, w.inputs, w.model, w.optimizer)


def _compiled_steps(w, trace, plan: Plan | None, steps: int = 3):
    """`steps` steps with the model's forward compiled (aot_eager) under `plan` (None: plainly)."""
    partitioner = PlanPartitioner(trace, CompiledPlan.of(trace, plan or Plan(), offload=False))
    forward = w.model.forward
    w.model.forward = torch.compile(forward, **compile_options(partitioner, {"backend": "aot_eager"}))
    try:
        for k in range(steps):
            w.step(*w.make_inputs(w.batch, seed=10 + k))
    finally:
        del w.model.forward
    return partitioner, [p.detach().clone() for p in w.model.parameters()]


def test_the_plans_recomputations_are_recomputed_by_the_compiled_backward_and_training_is_unchanged():
    # dropout among them: the compiled backward draws the forward's random numbers again
    torch.manual_seed(0)
    w, trace = _traced()
    plan = recompute_plan(trace)
    assert plan.decisions
    planned, params = _compiled_steps(w, trace, plan)
    torch.manual_seed(0)
    w_plain, _ = _traced()
    plain, plain_params = _compiled_steps(w_plain, trace, None)
    report = planned.report()
    root = next(c for c in trace.calls if c.module == "")  # the model's forward: what is compiled
    inside = sum(root.first_op <= d.out_after < root.end_op for d in plan.decisions)
    assert inside < len(plan.decisions)  # the loss, outside the model, stays eager
    assert report["decisions_lowered"] == inside
    assert report["decisions_not_lowered"] == {NOT_IN_GRAPH: len(plan.decisions) - inside}
    assert report["tagged_nodes"] > 0 and report["tagged_but_saved"] == 0
    assert report["saved_bytes"] < plain.report()["saved_bytes"]  # the backward rebuilds what it no longer saves
    assert all(torch.equal(a, b) for a, b in zip(params, plain_params))


def test_decisions_a_compiled_step_cannot_take_are_counted_with_why():
    _, trace = _traced()
    plan = recompute_plan(trace)
    first = plan.decisions[0]
    swap = Decision(storage=first.storage, action="swap", out_after=first.out_after, back_before=first.back_before)
    inside = Decision(storage=first.storage, action="recompute", out_after=first.out_after,
                      back_before=first.out_after + 1)  # back within the forward
    lowered = CompiledPlan.of(trace, Plan(decisions=(swap, inside, *plan.decisions[1:])), offload=False)
    assert lowered.outside == {NO_OFFLOAD: 1, NOT_SAVED: 1}
    assert {action for action, _ in lowered.decisions} == {Action.RECOMPUTE}
    offloaded = CompiledPlan.of(trace, Plan(decisions=(swap,)), offload=True)
    assert offloaded.decisions and offloaded.decisions[0][0] == Action.SWAP  # lowered as an offload
    assert offloaded.digest != lowered.digest  # another plan, another compiled graph in the caches


def test_only_inductor_and_aot_eager_take_a_plan():
    _, trace = _traced()
    partitioner = PlanPartitioner(trace, CompiledPlan.of(trace, Plan(), offload=False))
    inductor = compile_options(partitioner, {"mode": "max-autotune-no-cudagraphs", "options": {"trace.enabled": False}})
    assert inductor["options"] == {"max_autotune": True, "coordinate_descent_tuning": True, "trace.enabled": False,
                                   "custom_partitioner_fn": partitioner}  # the mode as its options: not both
    torch.compile(lambda x: x, **inductor)  # torch.compile takes them (it refuses a mode beside options)
    with pytest.raises(MemplanError, match="backend 'cudagraphs' cannot run it"):
        compile_options(partitioner, {"backend": "cudagraphs"})
