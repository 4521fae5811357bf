"""A step an exception cuts short (an out-of-memory error, a failing hook, a bad batch): the caller gets
its own exception, the step's activations are freed at once, storages copied away come back, and the
steps after it train as plain PyTorch does after the same failure. Oracles: plain training with the
same failing step (bit-identical state), weak references to the failed step's activations (dead
once it returns, while the planned step lives on) and the runtime's own step records."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from memplan.exec.engine import InlineCopyEngine
from memplan.workflows.optimize import optimize, trace_step

from tests.exec.helpers import batches, recompute_plan, state_diffs, swap_all_plan, tiny_workload

STEPS = 4
FAILING = 1  # the step that raises


class Boom(RuntimeError):
    """The caller's own error, raised inside its step."""


def _armed_workload(where: str):
    """The tiny workload whose second block raises in forward or in backward while `armed` is set;
    `outputs` keeps weak references to the blocks' outputs of the failing step."""
    w = tiny_workload()
    w.armed, w.outputs = False, []

    def fail_in_backward(grad):
        raise Boom("in backward")

    def hook(module, args, out):
        if not w.armed:
            return
        w.outputs.append(weakref.ref(out))
        if module is w.model.blocks[1]:
            if where == "forward":
                raise Boom("in forward")
            out.register_hook(fail_in_backward)

    for block in w.model.blocks:
        block.register_forward_hook(hook)
    return w


def _train(w, step, inputs) -> None:
    torch.manual_seed(5)
    for i, x in enumerate(inputs):
        w.armed = i == FAILING
        if w.armed:
            with pytest.raises(Boom):
                step(*x)
            gc.collect()
            assert w.outputs and all(ref() is None for ref in w.outputs)  # freed, the step living on
        else:
            step(*x)


@pytest.fixture(scope="module")
def tiny():
    w = tiny_workload()
    return trace_step(w.step, w.inputs, w.model, w.optimizer)


PLANS = {"swap": swap_all_plan, "recompute": recompute_plan, "sqrt-n": None}


@pytest.mark.parametrize("where", ["forward", "backward"])
@pytest.mark.parametrize("executor", ["auto", "interpreted"])
@pytest.mark.parametrize("kind", sorted(PLANS))
def test_a_step_cut_short_frees_its_memory_and_training_goes_on_as_plain(tiny, kind, executor, where):
    plain = _armed_workload(where)
    _train(plain, plain.step, batches(plain, STEPS))

    w = _armed_workload(where)
    make = PLANS[kind]
    how = {"plan": make(tiny)} if make else {"planner": kind, "budget": "70%"}
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=tiny, executor=executor,
                    measure=True, **how)
    _train(w, step, batches(w, STEPS))
    stats = step.stats()
    step.close()

    assert max(state_diffs(w.model, plain.model).values()) == 0.0
    assert [s["aborted"] for s in stats["steps_measured"]] == [i == FAILING for i in range(STEPS)]
    assert stats["diverged_steps"] == 0  # cut short is not off the plan
    assert not any(s["diverged"] for s in stats["steps_measured"])


class OneCopyAtATime(InlineCopyEngine):
    """Inline copy lanes that fail a copy submitted from inside a copy: an executor whose own copy
    re-enters its dispatch mode, which brings the same storage back again (on a GPU: an allocation on
    the copy stream, a lane waiting on itself, the bytes copied twice)."""

    def __init__(self):
        self.copying = False

    def submit(self, lane, fn, *, after=None):
        assert not self.copying, f"a {lane} copy submitted from inside a copy"
        self.copying = True
        try:
            return super().submit(lane, fn, after=after)
        finally:
            self.copying = False


@pytest.mark.parametrize("how", ["cut short", "ended early"])
def test_storages_come_back_once_when_a_step_leaves_its_plan_midway(tiny, how):
    """Finding 2 (the H200's `_cdata` crash): a swap-in that runs while the interpreted runner's mode is
    entered (an aborted step's restore, the divergence at a step's end) went through the mode's guard,
    which brought the same entry back from inside its own copy, before it was marked coming."""
    w = _armed_workload("backward")
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=swap_all_plan(tiny), trace=tiny,
                    executor="interpreted")
    step.runtime.engine = step.runtime.runner.engine = OneCopyAtATime()
    x = batches(w, 1)[0]
    if how == "cut short":
        w.armed = True
        with pytest.raises(Boom):
            step(*x)
    else:  # forward only: the step ends with its activations away and most of the trace not run
        step.step_fn = lambda x, y: w.model(x).sum()
        step(*x)
        assert step.stats()["diverged_steps"] == 1
    assert step.stats()["restored"] > 0 and not step.runtime.runner.away
    step.close()
