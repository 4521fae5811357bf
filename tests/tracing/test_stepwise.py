"""An optimizer's step run a stretch of parameters at a time (memplan.tracing.stepwise): the same
parameters and state as one step, bit for bit, a hook before each stretch, and the tracer's mark of
each parameter's update (found from the ops of the step run whole) where a split step calls it.

Oracles: the same optimizer stepped whole (plain torch), the ops each update touches, and the ops
a dispatch mode of the test's own counts before each hook of a split step."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from memplan.errors import MemplanError
from memplan.tracing.stepwise import Stepwise, group_params, split_step, steps_by_parameter
from memplan.workflows.optimize import trace_step

OPTIMIZERS = {
    "sgd-momentum": lambda groups: torch.optim.SGD(groups, lr=0.1, momentum=0.9),
    "adamw": lambda groups: torch.optim.AdamW(groups, lr=1e-2),
    "adam-two-groups": lambda groups: torch.optim.Adam(groups, lr=1e-2),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))


def _groups(model: nn.Module, name: str):
    params = list(model.parameters())
    if name == "adam-two-groups":
        return [{"params": params[:3]}, {"params": params[3:], "lr": 1e-3}]
    return params


def _train(model, opt, steps: int = 3, frozen: int | None = None) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 6, generator=g)).square().sum().backward()
        if frozen is not None:  # a parameter without a gradient this step: the step skips it
            list(model.parameters())[frozen].grad = None
        opt.step()


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("every", [True, False], ids=["every-parameter", "some"])
def test_stepping_by_stretches_is_bit_identical_and_hooks_each_stretch(name, every):
    ref, got = _model(), _model()
    ref_opt, opt = OPTIMIZERS[name](_groups(ref, name)), OPTIMIZERS[name](_groups(got, name))
    assert steps_by_parameter(opt)
    params = list(got.parameters())
    starts = None if every else (lambda p: p is params[2] or p is params[5])
    seen, whole = [], []

    def on_update(p):
        seen.append(next(i for i, q in enumerate(params) if q is p))
        whole.append([len(group_params(g)) for g in opt.param_groups])  # the owners' view: every parameter

    handle = Stepwise(opt, on_update, split_at=starts).install()
    _train(ref, ref_opt, frozen=3)
    _train(got, opt, frozen=3)
    handle.remove()
    for a, b in zip(ref.parameters(), got.parameters()):
        assert torch.equal(a, b)
    for p, q in zip(ref.parameters(), got.parameters()):
        for key, value in ref_opt.state[p].items():
            assert torch.equal(value, opt.state[q][key])
    per_step = [i for i in range(len(params)) if i != 3] if every else [2, 5]
    assert seen == per_step * 3
    assert {tuple(w) for w in whole} == {tuple(len(g["params"]) for g in opt.param_groups)}
    assert all(type(g["params"]) is list for g in opt.param_groups)  # put back after each step


def test_a_step_with_a_closure_runs_whole():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    handle = Stepwise(opt, seen.append).install()

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(2, 6)).sum()
        loss.backward()
        return loss

    opt.step(closure)
    handle.remove()
    assert seen == []


def test_a_step_that_raises_leaves_the_groups_whole_after_restore():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    count = len(opt.param_groups[0]["params"])

    def fail(p):
        if p is list(model.parameters())[2]:
            raise RuntimeError("stop")

    handle = Stepwise(opt, fail).install()
    model(torch.ones(2, 6)).sum().backward()
    with pytest.raises(RuntimeError, match="stop"):
        opt.step()
    handle.restore()
    assert type(opt.param_groups[0]["params"]) is list and len(opt.param_groups[0]["params"]) == count
    handle.remove()


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.1, foreach=True),
                                  lambda ps: torch.optim.Adam(ps, fused=True),
                                  lambda ps: torch.optim.LBFGS(ps)], ids=["foreach", "fused", "lbfgs"])
def test_multi_tensor_fused_and_coupled_steps_are_not_split(make):
    assert not steps_by_parameter(make(_model().parameters()))


class _OpCount(TorchDispatchMode):
    """Ops dispatched since the optimizer's step began (a mode of the test's own, through a step)."""

    def __init__(self):
        super().__init__()
        self.ops, self.at_updates = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_trace_marks_each_update_where_a_split_step_calls_its_hook(name):
    model = _model()
    opt = OPTIMIZERS[name](_groups(model, name))

    def step(x):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()

    trace = trace_step(step, (torch.randn(5, 6),), model, opt)
    marks = [m for m in trace.marks if m.kind in ("step", "update", "stepped")]
    names = [n for n, _ in model.named_parameters()]
    assert [m.kind for m in marks] == ["step", *["update"] * len(names), "stepped"]
    assert [m.key for m in marks[1:-1]] == names
    points = [m.point for m in marks]
    assert points[0] == points[1] > 0 and points[1:] == sorted(set(points[1:]))
    owned = {}  # parameter name -> its storages (the parameter, its gradient, its state)
    for o in trace.owners:
        owned.setdefault(o.name or names[o.index + 3 * o.group], set()).add(o.storage)
    for mark, end in zip(marks[1:-1], points[2:]):  # each update's ops touch its own parameter's storages only
        touched = {s for op in trace.ops[mark.point:end] for s in (*op.reads, *op.writes)}
        others = set().union(*(s for k, s in owned.items() if k != mark.key))
        assert owned[mark.key] <= touched and not touched & others
    # the oracle: a step split at every parameter calls its hook where the trace marks the update
    count = _OpCount()
    for counted in (False, True):  # a first step makes the state the traced (second) step finds
        handle = Stepwise(opt, lambda p: count.at_updates.append(count.ops)).install() if counted else None
        opt.zero_grad()
        model(torch.randn(5, 6)).square().sum().backward()
        with count if counted else contextlib.nullcontext():
            opt.step()
    handle.remove()
    first = count.at_updates[0]  # (torch's record_function op comes before the step's hooks)
    assert [n - first for n in count.at_updates] == [p - points[1] for p in points[1:-1]]


def test_a_plan_cannot_split_a_step_that_does_not_go_by_parameter():
    model = _model()
    with pytest.raises(MemplanError, match="does not update its parameters one at a time"):
        split_step(torch.optim.SGD(model.parameters(), lr=0.1, foreach=True), model, ["0.weight"], print)
    assert split_step(torch.optim.SGD(model.parameters(), lr=0.1), model, ["0.weight"], print) is not None
