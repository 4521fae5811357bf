"""Executor tests: training under every planner's step program equals plain training (the
oracle) and keeps its budget, measured in the run by the independent meter."""

from __future__ import annotations

import gc
import inspect
import threading
import time

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from memplan.errors import InfeasibleBudgetError
from memplan.exec.compress import compress, decompress
from memplan.exec.engine import ThreadCopyEngine
from memplan.exec.resync import INSERTED_LIMIT
from memplan.exec.slab import host_layout
from memplan.model import Decision, Plan
from memplan.planners.base import known_planners, plan as make_plan
from memplan.problem import Problem
from memplan.sim.program import compile_program
from memplan.workflows.optimize import optimize, trace_step
from memplan.workflows.run import BUDGET_TOLERANCE, run_workload

from tests.exec.helpers import plain_step_meter_peak, recompute_plan, swap_all_plan, tiny_workload, traced, workload

SEED = 5
STEPS = 3
REL_TOL = 1e-6


def _inputs(w, k=STEPS):
    """Each step's inputs, made right before it (older ones would count as live memory)."""
    for i in range(k):
        yield w.make_inputs(w.batch, seed=100 + i)


def _plain(make):
    w = make()
    torch.manual_seed(SEED)
    for x in _inputs(w):
        w.step(*x)
    return w


def _planned(make, *, plan=None, planner="none", budget=None, engine=None, trace=None, executor="auto", **params):
    """Train STEPS steps under a plan, every one measured; returns the workload and the step's stats."""
    w = make()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, planner=planner,
                    budget=budget, trace=trace, measure=True, executor=executor, **params)
    if engine is not None:
        step.runtime.engine.close()
        step.runtime.engine = step.runtime.runner.engine = engine
    torch.manual_seed(SEED)
    for x in _inputs(w):
        step(*x)
    stats = step.stats()
    step.close()
    return w, stats


def _same_state(a, b, tol=0.0):
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        err = float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
        assert err <= tol * max(float(y.double().abs().max()), 1e-30), f"{name} differs by {err}"


def _kept_budget(stats):
    assert stats["diverged_steps"] == 0 and stats["unresolved"] == 0
    for step in stats["steps_measured"]:
        if stats["budget_bytes"] is not None:
            assert step["measured_peak_bytes"] <= stats["budget_bytes"] * (1 + BUDGET_TOLERANCE)
        assert abs(step["measured_peak_bytes"] - stats["simulated_peak_bytes"]) <= \
            BUDGET_TOLERANCE * stats["simulated_peak_bytes"]


def _tiny_params(name) -> dict:
    """Parameters that let a planner act on the tiny net's small storages, quickly."""
    takes = inspect.signature(known_planners()[name].fn).parameters
    # algo: vDNN's (p) convolution workspaces are cuDNN's on a GPU; the CPU executor holds none
    wanted = {"algo": "m", "min_bytes": 0, "n_trials": 4, "pool_time_limit_s": 1.0, "episodes": 5, "particles": 4, "iters": 4,
              "time_limit_s": 2.0}
    return {k: v for k, v in wanted.items() if k in takes}


def _plans(trace, name, **params) -> list:
    """The planner's plans at 100%, 70% and its smallest feasible budget (those it can make);
    without a budget when it fits none of them."""
    plans = {}
    budgets = [trace.peak_load_bytes, int(0.7 * trace.peak_load_bytes), 1]
    while budgets:
        budget = budgets.pop(0)
        try:
            plans[budget] = make_plan(trace, budget, planner=name, **params)
        except InfeasibleBudgetError as exc:
            if budget == 1 and exc.min_feasible_bytes < trace.peak_load_bytes:
                budgets.append(exc.min_feasible_bytes)
    if not plans:  # a pool that fragments above the peak (vdnn++:...+highend's CNMeM-like best-fit)
        plans[None] = make_plan(trace, None, planner=name, **params)
    return list(plans.values())


@pytest.fixture(scope="module")
def tiny_trace():
    return traced(tiny_workload())


@pytest.fixture(scope="module")
def tiny_reference():
    return _plain(tiny_workload)


@pytest.mark.parametrize("name", sorted(known_planners()))
def test_every_planner_trains_exactly_within_its_budget(tiny_trace, tiny_reference, name):
    plans = _plans(tiny_trace, name, **_tiny_params(name))
    assert plans, f"{name} plans no budget at all"
    for plan in plans:
        got, stats = _planned(tiny_workload, plan=plan, trace=tiny_trace)
        _same_state(got, tiny_reference, REL_TOL)
        _kept_budget(stats)


@pytest.mark.parametrize("kind", ["async", "sync+zvc", "recompute"])
def test_hand_made_plans_are_bit_identical_under_a_lagging_copy_lane(tiny_trace, tiny_reference, kind):
    plan = {"async": swap_all_plan(tiny_trace, lead=1), "sync+zvc": swap_all_plan(tiny_trace, compress=0.5, sync=True),
            "recompute": recompute_plan(tiny_trace)}[kind]
    slow = ThreadCopyEngine(before_job=lambda lane: time.sleep(0.005))  # the copy "stream" lags far behind
    # the interpreted runner: it replays every recomputation op by op (the hooked one: memplan.exec.hooked)
    got, stats = _planned(tiny_workload, plan=plan, engine=slow, trace=tiny_trace, executor="interpreted")
    _same_state(got, tiny_reference)
    _kept_budget(stats)
    moved = stats["recomputed"] if kind == "recompute" else stats["released"] + stats["kept"]
    assert moved == STEPS * len(plan.decisions)
    if kind == "recompute":
        assert stats["replayed_ops"] >= moved  # dropout's mask is replayed from its saved RNG state


def test_a_slow_copy_makes_the_release_wait_instead_of_exceeding_the_budget(tiny_trace):
    plan = swap_all_plan(tiny_trace, lead=1)
    program = compile_program(Problem.of(tiny_trace), plan)
    plan = plan.with_meta(budget_bytes=program.predicted.peak_load_bytes)  # tight: releases must wait
    slow = ThreadCopyEngine(before_job=lambda lane: time.sleep(0.02) if lane == "d2h" else None)
    _, stats = _planned(tiny_workload, plan=plan, engine=slow, trace=tiny_trace)
    assert stats["release_wait_s"] > 0
    _kept_budget(stats)


class _CountingEngine(ThreadCopyEngine):
    """Counts how the compute side waits for copies: on the device (`wait`) or on the host (`sync`)."""

    def __init__(self):
        super().__init__()
        self.calls = {"wait": 0, "sync": 0}

    def wait(self, ticket):
        self.calls["wait"] += 1
        super().wait(ticket)

    def sync(self, ticket):
        self.calls["sync"] += 1
        super().sync(ticket)


def test_a_release_waits_for_its_copy_on_the_compute_side_not_on_the_host(tiny_trace, tiny_reference):
    # On a GPU `sync` blocks the host until the copy is done, draining the device's queue at every
    # release; `wait` orders the free after the copy on the compute stream (engine.py, rule 5).
    engine = _CountingEngine()
    got, stats = _planned(tiny_workload, plan=swap_all_plan(tiny_trace, lead=1), engine=engine, trace=tiny_trace)
    _same_state(got, tiny_reference)
    assert stats["released"] > 0 and engine.calls["sync"] == 0
    assert engine.calls["wait"] >= stats["released"] + stats["prefetched"]


def test_vgg11_cifar_autoswap_doa_at_half_the_peak_keeps_its_budget():
    out = run_workload("vgg11-cifar", 32, planner="autoswap:doa", budget="50%", steps=STEPS, check=True)
    assert out["within_budget"] and out["max_param_diff"] == 0.0 and out["max_buffer_diff"] == 0.0
    for step in out["steps"]:  # the first planned step included
        assert step["measured_peak_bytes"] == out["simulated_peak_bytes"]
    assert out["executor"]["released"] > 0 and out["executor"]["diverged_steps"] == 0


def test_sqrt_n_measures_below_plain_training():
    plain = run_workload("vgg11-cifar", 8, planner="none", budget=None, steps=1)
    trace = optimize(*(lambda w: (w.step, *w.inputs))(workload("vgg11-cifar", 8)), measure=False).trace
    low = min(p.budget_bytes for p in _plans(trace, "sqrt-n", simulate_result=False))
    out = run_workload("vgg11-cifar", 8, planner="sqrt-n", budget=low, steps=2, check=True)
    assert out["within_budget"] and out["max_param_diff"] == 0.0
    assert out["measured_peak_bytes"] < plain["measured_peak_bytes"]
    assert out["executor"]["recomputed"] > 0


def test_swapped_gradients_are_freed_by_zero_grad():
    w = workload("vgg11-cifar", 4)
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, planner="autoswap:doa", budget="60%")
    grads = {d.storage for d in step.plan.decisions if step.trace.storages[d.storage].kind == "grad"}
    assert grads, "the plan swaps no gradient: this test needs one"
    for x in _inputs(w, 2):
        step(*x)
    refs = [StorageWeakRef(p.grad.untyped_storage()) for p in w.model.parameters()]
    w.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    assert all(r.expired() for r in refs)
    step.close()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_first_planned_step_of_a_fresh_optimizer_is_planned(optimizer, tiny_trace):
    def make():
        w = tiny_workload()
        if optimizer == "adam":
            w.optimizer.__init__(w.model.parameters(), lr=1e-3)
        return w

    got, stats = _planned(make, planner="autoswap:doa", budget="70%", min_bytes=0)
    _same_state(got, _plain(make))
    assert stats["diverged_steps"] == 0 and stats["released"] > 0
    _kept_budget(stats)


def test_the_meter_measures_the_traced_peak_of_plain_training(tiny_trace):
    assert plain_step_meter_peak(tiny_workload()) == tiny_trace.peak_load_bytes


def _with_extra_ops_in_step_2(extra: int):
    """A workload whose second step runs `extra` ops after forward that the trace does not have."""
    def make():
        w = tiny_workload()
        calls = [0]
        step = w.step

        def more(m, a, out):
            for _ in range(extra):
                out = out * 1.0
            return out

        def odd_step(x, y):
            calls[0] += 1
            if calls[0] != 2:
                return step(x, y)
            handle = w.model.register_forward_hook(more)
            try:
                return step(x, y)
            finally:
                handle.remove()

        w.step = odd_step
        return w

    return make


def test_an_op_the_trace_does_not_have_runs_unplanned_and_the_step_stays_planned(tiny_trace):
    make = _with_extra_ops_in_step_2(1)
    plan = swap_all_plan(tiny_trace)
    got, stats = _planned(make, plan=plan, trace=tiny_trace, executor="interpreted")
    _same_state(got, _plain(make))
    assert stats["diverged_steps"] == 0 and stats["inserted_ops"] == 2  # the extra product and its gradient
    assert stats["swapped_out"] > 0


def test_a_step_that_leaves_the_trace_brings_everything_back_and_stays_correct(tiny_trace):
    make = _with_extra_ops_in_step_2(INSERTED_LIMIT + 5)
    plan = swap_all_plan(tiny_trace)
    got, stats = _planned(make, plan=plan, trace=tiny_trace, executor="interpreted")
    _same_state(got, _plain(make))
    assert stats["diverged_steps"] == 1 and stats["restored"] > 0


def test_other_shapes_run_unplanned_with_a_warning(tiny_trace):
    w = tiny_workload()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=tiny_trace,
                    plan=swap_all_plan(tiny_trace))
    with pytest.warns(RuntimeWarning, match="without the plan"):
        step(*w.make_inputs(3, seed=1))
    assert step.stats()["swapped_out"] == 0
    step.close()


def test_weights_left_on_the_host_between_steps_come_back_when_the_model_is_used():
    w, ref = workload("vgg11-cifar", 2), workload("vgg11-cifar", 2)
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, planner="autoswap:doa", budget="60%")
    assert step.program.start_away, "the plan leaves no weight on the host between steps"
    torch.manual_seed(SEED)
    for x in _inputs(w, 2):
        step(*x)
    torch.manual_seed(SEED)
    for x in _inputs(ref, 2):
        ref.step(*x)
    away = [d for d in step.runtime.runner.entries.values() if d.state != "resident"]
    assert away
    state = w.model.state_dict()  # brings them back first
    assert all(torch.equal(state[k], v) for k, v in ref.model.state_dict().items())
    assert not [d for d in step.runtime.runner.entries.values() if d.state != "resident"]
    step.close()


def test_modes_and_hooks_are_gone_after_close(tiny_trace):
    w = tiny_workload()
    before = {n: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in w.model.named_modules()}
    with optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=tiny_trace,
                  plan=swap_all_plan(tiny_trace)) as run:
        w.step(*w.inputs)  # the model's forward starts a planned step
        assert run.stats()["swapped_out"] > 0
    assert {n: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in w.model.named_modules()} == before
    assert run.runtime.slab.nbytes == 0
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    assert not _get_current_dispatch_mode_stack()


def test_host_regions_of_gaps_alive_together_do_not_share_bytes(tiny_trace):
    plan = swap_all_plan(tiny_trace, lead=1).with_meta(budget_bytes=tiny_trace.peak_load_bytes)
    program = compile_program(Problem.of(tiny_trace), plan)
    layout = host_layout(tiny_trace, program)
    spans = [(2 * d.out_after + 1, 2 * d.back_before + 1, layout.offsets[k], layout.sizes[k])
             for k, d in enumerate(program.decisions)]
    for i, (a0, a1, ao, asz) in enumerate(spans):
        assert ao + asz <= layout.nbytes
        for b0, b1, bo, bsz in spans[i + 1:]:
            if a0 < b1 and b0 < a1:
                assert ao + asz <= bo or bo + bsz <= ao


def test_zero_value_compression_roundtrip_is_bit_exact():
    t = torch.randn(37, 5)
    t[t < 0.2] = 0
    t[0, 0] = -0.0
    c = compress(t)
    out = decompress(c, torch.empty_like(t))
    assert torch.equal(out.view(torch.int32), t.view(torch.int32))
    n, nnz = t.numel(), int((t.view(torch.int32) != 0).sum())
    assert c.nbytes == (n + 7) // 8 + nnz * 4


def test_thread_engine_orders_after_ticket():
    gate = threading.Event()
    engine = ThreadCopyEngine()
    order = []
    first = engine.submit("d2h", lambda: (gate.wait(), order.append("out")))
    engine.submit("h2d", lambda: order.append("in"), after=first)
    time.sleep(0.01)
    assert order == [] and not engine.done(first)
    gate.set()
    engine.drain()
    assert order == ["out", "in"]
    engine.close()


def _alive(weak) -> bool:
    return not torch.UntypedStorage._expired(weak)


def _copy(dst, src, done=None):
    """A copy job that holds `src` (as the executor's swap-out jobs do)."""
    return lambda: (done if done is not None else []).append(dst.copy_(src))


def test_a_finished_copy_holds_no_reference_to_what_it_copied():
    engine = ThreadCopyEngine()
    src, dst = torch.ones(1024), torch.empty(1024)
    weak = src.untyped_storage()._weak_ref()
    engine.sync(engine.submit("d2h", _copy(dst, src)))
    del src
    assert not _alive(weak)  # nothing on the worker outlives the completed job
    engine.close()


def test_a_cancelled_copy_lets_go_of_its_storage_before_the_lane_reaches_it():
    # A swap-out whose storage is fetched before its release never leaves: when the framework
    # then frees that storage, a queued copy must not keep it alive (memory the plan lacks).
    gate, ran = threading.Event(), []
    engine = ThreadCopyEngine(before_job=lambda lane: gate.wait())
    src, dst = torch.ones(1024), torch.empty(1024)
    weak = src.untyped_storage()._weak_ref()
    ticket = engine.submit("d2h", _copy(dst, src, ran))
    engine.cancel(ticket)
    del src
    assert not _alive(weak) and not engine.done(ticket)
    gate.set()
    engine.drain()
    assert ran == []
    engine.close()


def test_runtime_on_a_fake_trace_plan_runs_real_training(tiny_reference):
    # A plan made from a fake-tensor trace runs on the real model (the op sequences agree).
    from memplan.workflows.workloads import trace_workload

    fake = trace_workload(lambda batch, **kw: tiny_workload(batch), 2, fake=True)
    plan = swap_all_plan(fake)
    got, stats = _planned(tiny_workload, plan=plan, trace=fake)
    _same_state(got, tiny_reference)
    _kept_budget(stats)


def test_the_meter_catches_an_executor_that_keeps_what_its_program_frees(tiny_trace, monkeypatch):
    # A deliberately wrong executor: swap-outs are copied but their memory is never released.
    from memplan.exec.interpreted import InterpretedRunner

    monkeypatch.setattr(InterpretedRunner, "_release", lambda self, entry, k, found=None: None)
    plan = swap_all_plan(tiny_trace)
    _, stats = _planned(tiny_workload, plan=plan, trace=tiny_trace, executor="interpreted")
    assert all(s["measured_peak_bytes"] > stats["simulated_peak_bytes"] for s in stats["steps_measured"])


def test_actions_that_find_no_storage_are_counted_and_warned_about(tiny_trace, monkeypatch, caplog):
    # An executor that cannot find the traced storages (a user's step that differs from its trace).
    import memplan.exec.locate as locate

    monkeypatch.setattr(locate.StorageFinder, "found", lambda self, entry, found: self._usable(entry, None))
    with caplog.at_level("WARNING", logger="memplan.exec.runtime"):
        _, stats = _planned(tiny_workload, plan=swap_all_plan(tiny_trace), trace=tiny_trace)
    assert stats["unresolved"] > 0
    assert all(s["unresolved"] > 0 for s in stats["steps_measured"])
    assert sum("planned actions found no storage" in r.getMessage() for r in caplog.records) == STEPS


class _Chain(torch.nn.Module):
    """a = x·w, a long chain on from a, then a read again: in `odd` steps a chain op reads a
    instead of its predecessor (same op name, same sizes) while a is swapped out."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((64,), 0.5))
        self.odd = False

    def forward(self, x):
        a = x * self.w
        h = a + 1.0
        for k in range(8):
            h = torch.tanh((a if self.odd and k == 4 else h) + 1.0)
        return (h + a).sum()


def _chain_step():
    model = _Chain()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad(set_to_none=True)
        model(x).backward()
        opt.step()

    return model, opt, step


def test_a_plain_op_touching_a_storage_away_brings_it_back_and_leaves_the_program():
    x = torch.linspace(-1.0, 1.0, 64)
    model, opt, step = _chain_step()
    trace = trace_step(step, (x,), model, opt)
    a = trace.ops[0].writes[0]  # x * w
    first, last = trace.accesses[a][1], [j for j in trace.accesses[a] if trace.ops[j].phase == "forward"][-1]
    plan = Plan(decisions=(Decision(storage=a, action="swap", out_after=first, back_before=last),))
    run = optimize(step, x, trace=trace, plan=plan, model=model, optimizer=opt, measure=False, executor="interpreted")
    assert run.runtime.runner.plain[14] and trace.ops[14].reads != (a,)
    model.odd = True  # op 14, plain in the program, now reads a while it is away
    run(x)
    stats = run.stats()
    run.close()
    assert stats["diverged_steps"] == 1 and stats["restored"] == 1
    plain_model, _, plain = _chain_step()
    plain_model.odd = True
    plain(x)
    assert torch.equal(model.w, plain_model.w)
