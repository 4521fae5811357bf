"""The hooked executor moves what autograd does not save (issue 48): parameters between their last
use in forward and their first in backward, gradients between their accumulation and the optimizer,
optimizer state between steps, each found through its owner and acted on at the step's hooks
(module calls, `register_post_accumulate_grad_hook`, the optimizer's step pre- and post-hooks, and
the start of each parameter's update where the step runs a parameter at a time).

Oracles: plain training from the same seed (bit-identical parameters, buffers and optimizer state),
the storages' own sizes seen from probes of the test's own (a moved storage holds no bytes while it
is away), PyTorch's dispatch-mode stack (no mode is entered) and the independent memory meter."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from memplan.budget import NO_LIMIT
from memplan.problem import Problem
from memplan.cost.profiles import get_profile
from memplan.exec.meter import MemoryMeter
from memplan.model.hooksites import without_updates
from memplan.sim.levels import Prepared
from memplan.sim.simulate import Simulator
from memplan.model import Decision, Plan, Trace
from memplan.workflows.optimize import optimize, trace_step
from memplan.workflows.run import BUDGET_TOLERANCE

from tests.exec.helpers import STEPS, TinyNet, TinyWorkload, state_diffs

LEAD = 2  # ops between a prefetch's trigger and the op that needs the storage back
CPU = dataclasses.replace(get_profile("h100"), kind="cpu")  # copies inline: releases at their swap-outs' sites


def _step_of(model, opt, accumulate: int, clip: bool):
    """A training step over `accumulate` micro-batches (gradients accumulated), clipped if asked."""

    def step(x, y):
        opt.zero_grad()
        for xs, ys in zip(x.chunk(accumulate), y.chunk(accumulate)):
            nn.functional.cross_entropy(model(xs), ys).backward()
        if clip:
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()

    return step


def _maker(optimizer: str, accumulate: int = 1, clip: bool = False):
    def make() -> TinyWorkload:
        torch.manual_seed(0)
        model = TinyNet()
        opt = torch.optim.AdamW(model.parameters(), lr=0.01) if optimizer == "adamw" else \
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        w = TinyWorkload(model=model, optimizer=opt, step=_step_of(model, opt, accumulate, clip), inputs=(), batch=4)
        w.inputs = w.make_inputs(w.batch, seed=99)
        return w

    return make


def _longest_gap(trace: Trace, sid: int, kind: str) -> tuple[int, int, int]:
    """(out_after, back_before, length) of the storage's longest gap between accesses of those its kind
    is moved over (length 0: none): a parameter's from forward to backward, a gradient's from backward
    on, a state's across the step's boundary."""
    acc = sorted(set(trace.accesses[sid]))
    n = len(trace.ops)
    pairs = list(zip(acc, acc[1:] + ([acc[0] + n] if kind == "state" else [])))
    if kind == "param":
        pairs = [(a, b) for a, b in pairs if trace.ops[a].phase == "forward" and trace.ops[b].phase == "backward"]
    if kind == "grad":
        pairs = [(a, b) for a, b in pairs if trace.ops[a].phase == "backward"]
    a, b = max(pairs, key=lambda ab: ab[1] - ab[0], default=(0, 0))
    return a, b % n, b - a


def owned_plan(trace: Trace, kinds: tuple[str, ...]) -> Plan:
    """Swap every storage an owner of `kinds` holds over its longest gap."""
    decisions = []
    for o in trace.owners:
        if o.kind in kinds:
            a, b, length = _longest_gap(trace, o.storage, o.kind)
            if length > LEAD + 1:
                decisions.append(Decision(storage=o.storage, action="swap", out_after=a, back_before=b,
                                          trigger=(b - LEAD) % len(trace.ops)))
    return Plan(decisions=tuple(decisions), planner="test-owned", trace_digest=trace.digest)


class _Probes:
    """Bytes held, seen from hooks of the test's own, by the first parameter, its momentum or first Adam
    state (in the forward of the model's head, between that parameter's uses) and the head weight's
    gradient (when the first parameter's gradient is accumulated, after the head's)."""

    def __init__(self, w: TinyWorkload):
        self.param, self.state, self.grad, self.modes = [], [], [], []
        first = next(w.model.parameters())
        self.handles = [w.model.head.register_forward_hook(lambda *_: self._in_forward(w, first)),
                        first.register_post_accumulate_grad_hook(
                            lambda p: self.grad.append(w.model.head.weight.grad.untyped_storage().nbytes()))]

    def _in_forward(self, w, first) -> None:
        self.param.append(first.untyped_storage().nbytes())
        state = w.optimizer.state.get(first, {})
        held = [v.untyped_storage().nbytes() for v in state.values() if torch.is_tensor(v) and v.dim()]
        self.state.append(min(held) if held else None)
        self.modes.append(sum(not isinstance(m, MemoryMeter) for m in _get_current_dispatch_mode_stack()))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _run(make, plan: Plan | None, trace: Trace | None):
    """Train STEPS steps (planned when `plan` is given), each batch made right before its step."""
    w = make()
    step = w.step if plan is None else optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan,
                                                trace=trace, measure=True)
    probes = _Probes(w)
    torch.manual_seed(5)
    for i in range(STEPS):
        step(*w.make_inputs(w.batch, seed=100 + i))
    probes.remove()
    stats = None
    if plan is not None:
        stats = step.stats()
        step.close()
    return w, stats, probes


def _optimizer_state(w: TinyWorkload) -> list[torch.Tensor]:
    return [v for s in w.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


def _check_identical(got: TinyWorkload, ref: TinyWorkload) -> None:
    assert max(state_diffs(got.model, ref.model).values()) == 0.0  # parameters and buffers
    a, b = _optimizer_state(got), _optimizer_state(ref)
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _check_hooked(stats: dict, probes: _Probes) -> None:
    assert stats["level"] == "hooked" and stats["ops_in_mode"] == 0 and stats["replayed_ops"] == 0
    assert stats["diverged_steps"] == 0 and stats["unresolved"] == 0 and stats["late_unpacks"] == 0
    assert stats["swapped_out"] > 0 and stats["released"] > 0
    assert probes.modes and max(probes.modes) == 0
    for step in stats["steps_measured"]:
        assert abs(step["measured_peak_bytes"] - stats["simulated_peak_bytes"]) <= \
            BUDGET_TOLERANCE * stats["simulated_peak_bytes"]


CASES = [("sgd", 1, False), ("adamw", 1, False), ("sgd", 2, True), ("adamw", 2, True)]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-accumulate{c[1]}{'-clip' if c[2] else ''}")
def case(request):
    make = _maker(*request.param)
    w = make()
    return make, trace_step(w.step, w.inputs, w.model, w.optimizer), _run(make, None, None)[0]


@pytest.mark.parametrize("kinds", [("param",), ("grad",), ("state",), ("param", "grad", "state")],
                         ids=lambda k: "+".join(k))
def test_owned_storages_move_at_hooks_and_come_back_bit_identical(case, kinds):
    make, trace, ref = case
    plan = owned_plan(trace, kinds)
    assert plan.decisions
    got, stats, probes = _run(make, plan, trace)
    _check_hooked(stats, probes)
    _check_identical(got, ref)
    if "param" in kinds:  # the first parameter is away while the head runs (in one micro-batch a step)
        assert probes.param.count(0) >= STEPS
    if "state" in kinds:  # its state is away through the next step's forward (the first: if it exists yet)
        assert probes.state[0] in (None, 0) and probes.state[1:] == [0] * (len(probes.state) - 1)
    if "grad" in kinds:  # the head's gradient is away once accumulated, until the optimizer (or clipping) reads it
        assert 0 in probes.grad


def test_without_a_plan_the_probes_see_every_storage(case):
    # the oracle can fail: the same probes in plain training see the storages' bytes
    make, _, _ = case
    _, _, probes = _run(make, None, None)
    assert min(probes.param) > 0 and min(probes.grad) > 0 and all(s is None or s > 0 for s in probes.state)


class _StepProbe(TorchDispatchMode):
    """Bytes the first parameter's optimizer state holds when the optimizer's step first touches the
    last parameter's gradient: a dispatch mode of the test's own, entered only inside the step."""

    def __init__(self, w: TinyWorkload):
        super().__init__()
        params = list(w.model.parameters())
        self.first, self.last, self.optimizer, self.held = params[0], params[-1], w.optimizer, []
        self.handles = [register_optimizer_step_pre_hook(lambda *_: None if self.__enter__() else None),
                        register_optimizer_step_post_hook(lambda *_: self.__exit__(None, None, None))]
        self.armed = False

    def __enter__(self):
        self.armed = True
        return super().__enter__()

    def __exit__(self, *exc):
        self.armed = False
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        grad = self.last.grad
        if self.armed and grad is not None and any(a is grad for a in args):
            self.armed = False
            state = [v for v in self.optimizer.state[self.first].values() if torch.is_tensor(v) and v.dim()]
            self.held.append(min(v.untyped_storage().nbytes() for v in state))
        return func(*args, **(kwargs or {}))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _run_probed(make, plan: Plan, trace: Trace):
    w = make()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=trace, measure=True,
                    profile=CPU)
    probe = _StepProbe(w)
    torch.manual_seed(5)
    for i in range(STEPS):
        step(*w.make_inputs(w.batch, seed=100 + i))
    probe.remove()
    stats = step.stats()
    step.close()
    return w, stats, probe.held


def test_optimizer_state_leaves_inside_the_step_a_parameter_at_a_time(case, monkeypatch):
    # The step updates one parameter at a time (SGD and AdamW, single-tensor): the tracer marks each
    # update (memplan.tracing.stepwise), and a state swapped from its parameter's update to the next
    # step's leaves at the next update's mark, not at the step's end: by the last parameter's update
    # the first parameter's state holds no bytes. On the trace without those marks it still does (the
    # oracle can fail), and both train bit-identically. (The split form as a plan runs it where the
    # step run whole would not fit: this small step fits either way, and would run whole, below.)
    monkeypatch.setattr(Prepared, "whole", None)
    make, trace, ref = case
    updates = [m.key for m in trace.marks if m.kind == "update"]
    assert updates == [name for name, _ in ref.model.named_parameters()]
    plan = owned_plan(trace, ("state",))
    got, stats, held = _run_probed(make, plan, trace)
    assert stats["level"] == "hooked" and stats["ops_in_mode"] == 0 and stats["unresolved"] == 0
    _check_identical(got, ref)
    assert held[1:] == [0] * (STEPS - 1)  # the first step creates the state
    simulator = Simulator(trace, Problem.of(trace, profile=CPU).cost)  # an update mark's firing: one hook call
    assert stats["hook_calls"] / STEPS == simulator.lowering.sites.firings(simulator.lower(plan.decisions).sites).sum()
    unmarked = without_updates(trace)
    got, stats, held = _run_probed(make, dataclasses.replace(plan, trace_digest=unmarked.digest), unmarked)
    assert stats["level"] == "hooked" and min(held[1:]) > 0
    _check_identical(got, ref)


def test_a_plan_that_fits_with_the_step_whole_runs_it_whole(case, monkeypatch):
    # Each split of the step costs a stretch (one more call of the optimizer's step): where the plan's
    # hooked form with the step run whole fits no slower, that one is simulated and run, with no hook
    # inside the step (by the planners' question too: `Simulator.hooked`); the state is then away only
    # between steps.
    make, trace, ref = case
    plan = owned_plan(trace, ("state",))
    cost = Problem.of(trace, profile=CPU).cost
    simulator = Simulator(trace, cost)
    result, _, _, lowered = simulator.program_rows(plan, NO_LIMIT)
    assert lowered.whole_step and simulator.hooked(plan, NO_LIMIT).time_s == result.time_s
    with monkeypatch.context() as patched:
        patched.setattr(Prepared, "whole", None)
        assert result.time_s < Simulator(trace, cost).hooked(plan, NO_LIMIT).time_s  # the step split
    got, stats, held = _run_probed(make, plan, trace)
    assert stats["level"] == "hooked" and stats["hook_calls"] / STEPS == \
        simulator.lowering.sites.firings(lowered.sites).sum()
    assert not lowered.sites.updates and min(held[1:]) > 0
    _check_identical(got, ref)
