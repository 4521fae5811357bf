"""Executor tests: training under swap / recompute plans equals plain training (the oracle)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks

from memplan.workflows.optimize import optimize, trace_step
from memplan.exec.compress import compress, decompress
from memplan.exec.engine import ThreadCopyEngine
from memplan.exec.runtime import PlanRuntime
from memplan.exec.slab import HostSlab

from test_exec_helpers import batches, recompute_plan, swap_all_plan, workload

MODELS = (pytest.param("vgg11-cifar", marks=pytest.mark.slow),
          pytest.param("resnet18-cifar", marks=pytest.mark.slow), "hf:gpt2")
SEED = 5
REL_TOL = 1e-6


@pytest.fixture(scope="module", params=MODELS)
def traced(request):
    w = workload(request.param)
    return request.param, trace_step(w.step, w.inputs, w.model, w.optimizer)


def _reference(name):
    w = workload(name)
    torch.manual_seed(SEED)
    for x in batches(w):
        w.step(*x)
    return [p.detach().clone() for p in w.model.parameters()]


def _train(name, tr, plan, **kw):
    w = workload(name)
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=tr, plan=plan, **kw)
    torch.manual_seed(SEED)
    for x in batches(w):
        step(*x)
    step.close()
    return [p.detach() for p in w.model.parameters()], step


@pytest.mark.parametrize("kind", ["async", "sync+zvc"])
def test_swap_plans_are_bit_identical(traced, kind):
    name, tr = traced
    plan = swap_all_plan(tr) if kind == "async" else swap_all_plan(tr, compress=0.5, sync=True)
    got, step = _train(name, tr, plan)
    stats = step.stats()
    assert stats["offloaded"] > 0 and stats["late_prefetches"] == 0 and stats["diverged_steps"] == 0
    assert all(torch.equal(a, b) for a, b in zip(got, _reference(name)))


def test_recompute_plans_match(traced):
    name, tr = traced
    got, step = _train(name, tr, recompute_plan(tr))
    assert step.stats()["recomputed_ops"] > 0
    for a, b in zip(got, _reference(name)):
        assert (a - b).abs().max() <= REL_TOL * b.abs().max().clamp_min(1e-30)


def _tiny():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    return model, opt, step


def test_delayed_copy_worker_never_hands_out_unfinished_data():
    model, opt, step = _tiny()
    x = torch.randn(8, 16)
    tr = trace_step(step, (x,), model, opt)
    ref_model, ref_opt, ref_step = _tiny()
    ref_step(x)

    def slow(lane):  # the copy "stream" lags far behind compute
        time.sleep(0.02)

    runtime = PlanRuntime(tr, swap_all_plan(tr, lead=1), model, engine=ThreadCopyEngine(before_job=slow))
    with runtime.installed():
        runtime.begin_step()
        step(x)
    assert runtime.stats()["offloaded"] > 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))
    runtime.close()


def test_hooks_removed_and_memory_released_after_context():
    model, opt, step = _tiny()
    x = torch.randn(8, 16)
    tr = trace_step(step, (x,), model, opt)
    before = {n: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in model.named_modules()}
    with optimize(step, x, model=model, optimizer=opt, trace=tr, plan=swap_all_plan(tr)) as run:
        loss = model(x).square().mean()
        loss.backward()
        assert run.runtime.slab.nbytes > 0
        assert any(m._forward_hooks for m in model.modules())
    assert {n: (dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in model.named_modules()} == before
    assert run.runtime.slab.buffer.numel() == 0
    seen = []
    with saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):  # ours are gone: this is innermost
        model(x).sum().backward()
    assert seen


def test_other_shapes_run_unplanned_with_warning():
    model, opt, step = _tiny()
    x = torch.randn(8, 16)
    tr = trace_step(step, (x,), model, opt)
    planned = optimize(step, x, model=model, optimizer=opt, trace=tr, plan=swap_all_plan(tr))
    with pytest.warns(RuntimeWarning, match="without the plan"):
        planned(torch.randn(3, 16))
    assert planned.stats()["offloaded"] == 0
    planned.close()


def test_zero_value_compression_roundtrip_is_bit_exact():
    t = torch.randn(37, 5)
    t[t < 0.2] = 0
    t[0, 0] = -0.0
    c = compress(t)
    out = decompress(c, torch.empty_like(t))
    assert torch.equal(out.view(torch.int32), t.view(torch.int32))
    n, nnz = t.numel(), int((t.view(torch.int32) != 0).sum())
    assert c.nbytes == (n + 7) // 8 + nnz * 4


def test_slab_recycles_and_overflows():
    calls = []
    slab = HostSlab(1024, on_recycle=lambda: calls.append(1))
    a, b = slab.take(512), slab.take(512)
    c = slab.take(10)  # full: overflow
    assert a.in_slab and b.in_slab and not c.in_slab and slab.overflow_bytes == 512
    slab.give_back(a)
    slab.give_back(c)
    assert not calls
    slab.give_back(b)
    assert calls == [1] and slab.used_bytes == 0
    assert a.data.data_ptr() == slab.take(1).data.data_ptr()


def test_thread_engine_orders_after_ticket():
    gate = threading.Event()
    engine = ThreadCopyEngine()
    order = []
    first = engine.submit("d2h", lambda: (gate.wait(), order.append("out")))
    engine.submit("h2d", lambda: order.append("in"), after=first)
    time.sleep(0.01)
    assert order == []
    gate.set()
    engine.drain()
    assert order == ["out", "in"]
    engine.close()
