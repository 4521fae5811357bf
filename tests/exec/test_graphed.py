"""The planned step captured and replayed (memplan.exec.graphed) under CUDA's rules, on the CPU: the
copy lanes, events and capture run on memplan.testing.cuda_rules' stand-in, which fails where a GPU
fails (issue 51). The step's ops run on the CPU when warmed up and captured; a replay checks and counts."""

from __future__ import annotations

import logging

import pytest
import torch

from memplan.errors import MemplanError
from memplan.exec.graphed import WARMUP_STEPS
from memplan.model import Decision, Plan
from memplan.testing.cuda_rules import CudaRules
from memplan.workflows.cuda_graph import on_cuda_runtime
from memplan.workflows.optimize import optimize, trace_step

from tests.exec.helpers import batches, carried_state_plan, swap_all_plan, tiny_workload


@pytest.fixture(scope="module")
def tiny():
    w = tiny_workload()
    return trace_step(w.step, w.inputs, w.model, w.optimizer)


def _param(trace, name: str) -> int:
    return next(o.storage for o in trace.owners if o.kind == "param" and o.name == name)


def wrap_plan(trace, name: str = "stem.0.weight") -> Plan:
    """Parameter `name` on the host between steps: sent away after its last use, fetched before its first."""
    sid = _param(trace, name)
    acc = trace.accesses[sid]
    return Plan(decisions=(Decision(storage=sid, action="swap", out_after=acc[-1], back_before=acc[0]),),
                planner="test", trace_digest=trace.digest)


def _graphed(trace, plan, mode="on", **options):
    """The tiny workload's step under `plan`, on the CUDA stand-in with `cuda_graph` `mode`."""
    w, rules = tiny_workload(), CudaRules()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=trace, **options)
    with rules:
        on_cuda_runtime(step, rules, mode)
    return w, step, rules


def _run(w, step, rules, k: int = WARMUP_STEPS + 3) -> dict:
    with rules:
        for x in batches(w, k):
            step(*x)
    return step.stats()["cuda_graph"]


@pytest.mark.parametrize("planned", ["none", "wrap-around swap", "activation swaps", "state carried over"])
def test_a_planned_step_is_captured_under_cudas_rules(tiny, planned):
    """Finding 1: the capture waited on events recorded outside it (lanes that never joined it, a prefetch
    after the previous step's swap-out), which a capturing stream may not: every capture failed. A state
    swapped out at the step's end is released in the next step eagerly, and joined at the replay's end."""
    plan = {"none": None, "wrap-around swap": wrap_plan(tiny), "activation swaps": swap_all_plan(tiny),
            "state carried over": carried_state_plan(tiny)}[planned]
    w, step, rules = _graphed(tiny, plan, planner="none")
    graph = _run(w, step, rules)
    assert graph["captured"] and graph["replays"] == 3 and graph["warmup_steps"] == WARMUP_STEPS
    assert rules.captures_underway == [] and not rules.capturing
    step.close()


def test_a_parameter_swapped_inside_the_step_is_refused(tiny):
    """Found by the stand-in: a replay reads a parameter the plan swaps between its forward and its
    backward at its address from before the capture, where the swap freed it (the refill is elsewhere,
    in the graph's pool): a GPU's replays would train on a stale, freed copy. Such a plan is refused."""
    sid = _param(tiny, "head.weight")
    acc = tiny.accesses[sid]
    out = max(i for i in acc if tiny.ops[i].phase == "forward")
    back = min(i for i in acc if tiny.ops[i].phase == "backward")
    plan = Plan(decisions=(Decision(storage=sid, action="swap", out_after=out, back_before=back),), planner="test",
                trace_digest=tiny.digest)
    with pytest.raises(MemplanError, match=f"decision 0 \\(storage {sid}\\): swaps a parameter within the step"):
        _graphed(tiny, plan)
    w, step, rules = _graphed(tiny, plan, mode="auto")
    graph = _run(w, step, rules)
    assert not graph["captured"] and "swaps a parameter within the step" in graph["reason"]
    assert step.stats()["swapped_out"] > 0
    step.close()


def _masked_step(w, calls: list, on_call: int):
    """The tiny workload's step, which at call `on_call` (counted in `calls`) also indexes with a boolean
    mask: a host read a trace does not show, which makes that call's capture fail."""

    def step(x, y):
        calls[0] += 1
        w.optimizer.zero_grad()
        out = w.model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        if calls[0] == on_call:
            loss = loss + out[out > 1e9].sum()
        loss.backward()
        w.optimizer.step()

    return step


def test_a_failed_capture_leaves_no_allocator_routing_to_its_pool():
    """Finding 5: CUDAGraph::capture_end raises before the allocator leaves the capture's pool when the
    capture broke: the pool stayed reserved and the eager steps after it ran with a capture underway."""
    w, rules, calls = tiny_workload(), CudaRules(), [0]
    step = optimize(_masked_step(w, calls, on_call=WARMUP_STEPS + 1), *w.inputs, model=w.model,
                    optimizer=w.optimizer, planner="none")
    calls[0] = 0  # the calls optimize made to trace it
    with rules:
        on_cuda_runtime(step, rules, "auto")
    graph = _run(w, step, rules)
    assert not graph["captured"] and "reads a device value on the host" in graph["reason"]
    assert rules.captures_underway == [] and len(rules.released_pools) == 1
    step.close()


def test_a_step_that_leaves_its_plan_is_not_captured(tiny, caplog):
    """Finding 7: a captured step that diverged (or left actions undone) would be replayed forever."""
    w, rules = tiny_workload(), CudaRules()
    calls = [0]

    def step_fn(x, y):
        calls[0] += 1
        if calls[0] == WARMUP_STEPS + 1:  # the captured call runs ops the trace does not have
            for _ in range(100):
                x = x + 0
        w.step(x, y)

    step = optimize(step_fn, *w.inputs, model=w.model, optimizer=w.optimizer, plan=swap_all_plan(tiny), trace=tiny,
                    executor="interpreted")
    calls[0] = 0
    with rules:
        on_cuda_runtime(step, rules, "auto")
    with caplog.at_level(logging.WARNING):
        graph = _run(w, step, rules)
    assert not graph["captured"] and graph["reason"] == "the captured step left its plan (it diverged)"
    assert step.stats()["diverged_steps"] == 1
    step.close()


def test_a_call_after_close_is_an_error_not_a_replay(tiny):
    """Finding 12: a replay after close() would run the graph into the released host slab and the
    storages close() brought back elsewhere."""
    w, step, rules = _graphed(tiny, wrap_plan(tiny), planner="none")
    assert _run(w, step, rules)["captured"]
    step.close()
    with rules, pytest.raises(RuntimeError, match="this PlanRuntime was closed"):
        step(*w.inputs)


def test_the_captured_step_holds_only_its_own_streams_cublas_workspaces(tiny):
    """Finding 4: cuBLAS keeps a workspace per (handle, stream); the step's side stream made new ones while
    those of the streams before it (the op timing's, eager steps') stayed, beyond what the trace counts
    (memplan.cost.device_memory: one per thread that runs matrix products)."""
    w, step, rules = _graphed(tiny, None, planner="none")
    with rules:
        w.step(*w.inputs)  # an eager step on the default stream: its workspace exists
    assert {stream for _, stream in rules.workspaces} == {rules.default}
    assert _run(w, step, rules)["captured"]
    assert {stream for _, stream in rules.workspaces} == {step.graphs.graphed.stream}
    step.close()


def test_a_failing_call_names_its_step_and_its_part_of_the_graphs_life():
    """Issue 51: a failed row of the GPU run says the step its error came from (and, captured, whether a
    warm-up, the capture or a replay), from attributes the measure loop and the graph set on it."""
    from memplan.workflows.measure import measure_steps

    w, rules, calls = tiny_workload(), CudaRules(), [0]
    step = optimize(_masked_step(w, calls, on_call=WARMUP_STEPS + 1), *w.inputs, model=w.model,
                    optimizer=w.optimizer, planner="none")
    calls[0] = 0
    inputs = batches(w, WARMUP_STEPS + 1)
    with rules:
        on_cuda_runtime(step, rules, "on")
        with pytest.raises(MemplanError, match="reads a device value on the host") as failed:
            measure_steps(step, lambda i: inputs[i], len(inputs), w.model, w.optimizer, 0)
    assert failed.value.memplan_step == WARMUP_STEPS and failed.value.memplan_phase == "the capture"
    step.close()
