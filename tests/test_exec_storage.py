"""Storage-level swaps on a tiny net: where storages are during their gaps, hooks, divergence,
translation, and the tracer's hook-point and owner record."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memplan.workflows.optimize import optimize, trace_step
from memplan.exec.engine import ThreadCopyEngine
from memplan.exec.events import HookPoint, hook_points, select_points
from memplan.exec.runtime import PlanRuntime
from memplan.model import Decision, Plan

from test_exec_helpers import STEPS, ReadsOnlyPresentStorages

LAG_S = {"d2h": 0.002, "h2d": 0.01}  # the deliberately slow copy engine's delay per job


def _lagging(lane: str) -> None:
    time.sleep(LAG_S[lane])


def _tiny(optimizer: str = "adam"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1) if optimizer == "adam" else \
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(x):
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    return model, opt, step


def _sid(tr, name: str) -> int:
    return next(s.id for s in tr.storages if s.name == name)


def _gaps(tr, sid: int) -> list[tuple[int, int]]:
    """Every gap between two accesses (at least one op apart), plus the wrap-around one."""
    acc = tr.accesses[sid]
    return [(a, b) for a, b in zip(acc, acc[1:]) if b - a >= 2] + [(acc[-1], acc[0])]


def _swap(tr, sid: int, gap, lead: int = 0) -> Decision:
    out, back = gap
    return Decision(storage=sid, action="swap", out_after=out, back_before=back, trigger=max(back - lead, 0))


def _tiny_plan(tr) -> Plan:
    """Every gap of layer 2's weight, the wrap-around gap of layer 0's state (Adam's exp_avg or SGD's
    momentum), the backward-to-optimizer gap of a gradient."""
    state = next(s.name for s in tr.storages if s.name in ("0.weight.exp_avg", "0.weight.momentum_buffer"))
    w2, m0 = _sid(tr, "2.weight"), _sid(tr, state)
    decisions = [_swap(tr, w2, g) for g in _gaps(tr, w2)] + [_swap(tr, m0, _gaps(tr, m0)[-1])]
    g4 = _sid(tr, "4.weight.grad")
    decisions.append(_swap(tr, g4, _gaps(tr, g4)[0]))  # its backward-to-optimizer gap
    return Plan(decisions=tuple(decisions), planner="test-storage", trace_digest=tr.digest)


def _warm(model, opt, step, x):
    """One plain step first: Adam's state exists, so every planned step is a steady-state one."""
    step(x)
    return model, opt, step


def test_swapped_storages_leave_during_their_gap_and_are_back_before_use():
    x = torch.randn(8, 16)
    model, opt, step = _warm(*_tiny(), x)
    tr = trace_step(step, (x,), model, opt)
    plan = _tiny_plan(tr)
    run = optimize(step, x, model=model, optimizer=opt, trace=tr, plan=plan)
    assert run.stats()["skipped_decisions"] == 0
    seen = []

    def probe(module, args):  # layer 0's forward: layer 2's weight and layer 0's state are still away
        run.runtime.engine.drain()  # swap-outs free the storage when their copy is done
        seen.append((model[2].weight.untyped_storage().nbytes(), opt.state[model[0].weight]["exp_avg"].untyped_storage().nbytes()))

    handle = model[0].register_forward_pre_hook(probe)
    oracle = ReadsOnlyPresentStorages()
    for i in range(STEPS):
        with oracle:
            run(torch.randn(8, 16, generator=torch.Generator().manual_seed(i)))
        run.runtime.engine.drain()
        away = model[2].weight.untyped_storage().nbytes(), opt.state[model[0].weight]["exp_avg"].untyped_storage().nbytes()
        assert away == (0, 0)  # between steps: out after their last use, back only in the next step
    handle.remove()
    full = (model[2].weight.numel() * 4, model[0].weight.numel() * 4)
    assert seen[0] == full and seen[1:] == [(0, 0)] * (STEPS - 1)  # the first step starts with them resident
    stats = run.stats()
    assert stats["storage_swapped_out"] >= len(plan.decisions) * (STEPS - 1) and stats["storage_late_prefetches"] == 0
    run.restore()
    assert model[2].weight.untyped_storage().nbytes() == full[0]
    run.close()
    ref_model, ref_opt, ref_step = _warm(*_tiny(), x)
    for i in range(STEPS):
        ref_step(torch.randn(8, 16, generator=torch.Generator().manual_seed(i)))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))


def test_model_use_between_steps_brings_storages_back():
    x = torch.randn(8, 16)
    model, opt, step = _warm(*_tiny(), x)
    tr = trace_step(step, (x,), model, opt)
    run = optimize(step, x, model=model, optimizer=opt, trace=tr, plan=_tiny_plan(tr))
    run(x)
    run.runtime.engine.drain()  # swap-outs free the storage when their copy is done
    assert model[2].weight.untyped_storage().nbytes() == 0
    state = model.state_dict()  # a state_dict pre-hook brings everything back first
    assert model[2].weight.untyped_storage().nbytes() > 0 and torch.equal(state["2.weight"], model[2].weight)
    run(x)
    run.runtime.engine.drain()
    assert model[2].weight.untyped_storage().nbytes() == 0
    with torch.no_grad():
        model(x)  # a forward outside the plan, likewise
    assert opt.state[model[0].weight]["exp_avg"].untyped_storage().nbytes() > 0
    run.close()


def test_hooks_removed_and_host_memory_released_after_context():
    from torch.nn.modules import module as module_mod
    from torch.optim import optimizer as optimizer_mod

    model, opt, step = _tiny()
    x = torch.randn(8, 16)
    tr = trace_step(step, (x,), model, opt)

    def hooks():
        per_module = {n: (dict(m._forward_hooks), dict(m._forward_pre_hooks), dict(m._state_dict_pre_hooks))
                      for n, m in model.named_modules()}
        params = {n: dict(p._post_accumulate_grad_hooks or {}) for n, p in model.named_parameters()}
        return (per_module, params, dict(optimizer_mod._global_optimizer_pre_hooks),
                dict(optimizer_mod._global_optimizer_post_hooks), dict(opt._optimizer_step_pre_hooks),
                dict(module_mod._global_forward_pre_hooks))

    before = hooks()
    with optimize(step, x, model=model, optimizer=opt, trace=tr, plan=_tiny_plan(tr)) as run:
        for _ in range(STEPS):
            step(x)
        assert run.runtime.storage_slab.nbytes > 0 and run.stats()["storage_swapped_out"] > 0
        run.runtime.engine.drain()
        assert model[2].weight.untyped_storage().nbytes() == 0  # away across the boundary
        assert hooks() != before
    assert hooks() == before
    assert run.runtime.storage_slab.buffer.numel() == 0
    assert model[2].weight.untyped_storage().nbytes() == model[2].weight.numel() * 4  # back on exit


def test_a_step_that_leaves_the_trace_runs_unswapped_and_correctly():
    x = torch.randn(8, 16)
    model, opt, step = _warm(*_tiny("sgd"), x)
    tr = trace_step(step, (x,), model, opt)
    run = optimize(step, x, model=model, optimizer=opt, trace=tr, plan=_tiny_plan(tr))
    ref_model, ref_opt, ref_step = _warm(*_tiny("sgd"), x)

    def odd_step(m, o):  # layer 2 runs twice: its hook points no longer line up with the trace
        o.zero_grad(set_to_none=True)
        (m(x).square().mean() + m[2](torch.tanh(m[0](x))).mean()).backward()
        o.step()

    run(x)
    ref_step(x)
    with run.runtime.installed():
        run.runtime.begin_step()
        odd_step(model, opt)
    odd_step(ref_model, ref_opt)
    run(x)
    ref_step(x)
    run.close()
    stats = run.stats()
    assert stats["storage_diverged_steps"] == 1 and stats["storage_swapped_out"] > 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))


# --- translation ----------------------------------------------------------------------------------


def _points(*spec) -> tuple[HookPoint, ...]:
    return tuple(HookPoint(key=("p", str(i), 0), pos=pos) for i, pos in enumerate(spec))


def test_select_points_orders_out_fetch_wait_inside_the_gap():
    pts = _points(0, 2, 5, 5, 8, 9)  # ten ops
    assert select_points(pts, 10, 1, 8, 5) == (("p", "1", 0), ("p", "3", 0), ("p", "4", 0))
    assert select_points(pts, 10, 1, 8, 2) == (("p", "1", 0), ("p", "2", 0), ("p", "4", 0))  # first after out
    assert select_points(pts, 10, 5, 7, 6) is None  # no point strictly between the accesses
    # wrap-around: out after op 8 (point at 9), back before op 2 of the next iteration
    assert select_points(pts, 10, 8, 2, 9) == (("p", "5", 0), ("p", "0", 0), ("p", "1", 0))
    assert select_points(pts, 10, 8, 2, 0) == (("p", "5", 0), ("p", "0", 0), ("p", "1", 0))
    assert select_points(pts, 10, 1, 8, 5, out_ok=lambda p: p.key[1] == "3") == \
        (("p", "3", 0), ("p", "4", 0), ("p", "4", 0))


def test_undoable_storage_decisions_are_skipped_with_reasons():
    model, opt, step = _tiny()
    x = torch.randn(8, 16)
    tr = trace_step(step, (x,), model, opt)
    w2 = _sid(tr, "2.weight")
    acc = tr.accesses[w2]
    bad = Decision(storage=w2, action="swap", out_after=acc[0], back_before=acc[-1])  # spans an access
    no_meta = type(tr)(storages=tr.storages, ops=tr.ops, meta={k: v for k, v in tr.meta.items() if k != "hook_events"})
    for trace, reason in ((tr, "accessed inside the gap"), (no_meta, "no hook-point record")):
        runtime = PlanRuntime(trace, Plan(decisions=(bad,) if trace is tr else (_swap(tr, w2, _gaps(tr, w2)[-1]),)),
                              model, optimizer=opt)
        assert reason in " ".join(runtime.stats()["skipped_reasons"])
        runtime.close()


def test_trace_records_hook_points_and_owners():
    model, opt, step = _tiny()
    x = torch.randn(8, 16)
    tr = trace_step(step, (x,), model, opt)
    events = tr.meta["hook_events"]
    positions = [e[3] for e in events]
    assert positions == sorted(positions) and positions[-1] <= len(tr.ops)
    kinds = Counter(e[0] for e in events)
    assert kinds["fwd_pre"] == kinds["fwd_post"] == len(list(model.modules()))
    assert kinds["acc"] == len(list(model.parameters())) and kinds["opt_pre"] == kinds["opt_post"] == 1
    assert kinds["pack"] == len(tr.meta["pack_order"])
    first_bwd = min(op.index for op in tr.ops if op.phase == "backward")
    first_opt = min(op.index for op in tr.ops if op.phase == "optimizer")
    assert all(e[3] <= first_bwd for e in events if e[0] in ("fwd_pre", "fwd_post"))
    assert all(first_bwd <= e[3] <= first_opt for e in events if e[0] in ("bwd", "acc"))
    owners = {r["sid"]: r for r in tr.meta["owners"]}
    for name, p in model.named_parameters():
        assert owners[_sid(tr, name)] == {"sid": _sid(tr, name), "owner": "param", "name": name}
        assert owners[_sid(tr, f"{name}.grad")]["owner"] == "grad"
    states = [r for r in owners.values() if r["owner"] == "state"]
    assert len(states) == 3 * len(list(model.parameters()))  # exp_avg, exp_avg_sq, step
    assert all(tr.storages[r["sid"]].kind == "optimizer_state" for r in states)
    # opt_op points: one between every two ops of the optimizer step
    pts = hook_points(tr)
    pre, post = (next(p.pos for p in pts if p.key[0] == k) for k in ("opt_pre", "opt_post"))
    assert [p.pos for p in pts if p.key[0] == "opt_op"] == list(range(pre + 1, post))


def test_fake_and_real_traces_record_the_same_hook_points():
    from memplan.tracing.tracer import trace

    model, opt, step = _tiny()
    x = torch.randn(8, 16)
    real = trace(step, x, fake=False, model=model, optimizer=opt)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fmodel, fopt, fstep = _tiny()
        fx = mode.from_tensor(x)
    fake = trace(fstep, fx, fake=True, model=fmodel, optimizer=fopt)
    assert fake.meta["hook_events"] == real.meta["hook_events"]
    assert fake.meta["owners"] == real.meta["owners"]


class _LowestSize(TorchDispatchMode):
    """Records the smallest size the watched storages had while any op of the step ran."""

    def __init__(self, tensors: list):
        super().__init__()
        self.tensors = tensors
        self.lowest = [t.untyped_storage().nbytes() for t in tensors]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.lowest = [min(low, t.untyped_storage().nbytes()) for low, t in zip(self.lowest, self.tensors)]
        return func(*args, **(kwargs or {}))


def test_activation_later_gaps_run_at_the_storage_level():
    x = torch.randn(8, 16)
    model, opt, step = _warm(*_tiny(), x)
    tr = trace_step(step, (x,), model, opt)
    tanh_out = sorted({sid for sid in tr.meta["pack_order"] if tr.storages[sid].kind == "activation"
                       and tr.ops[tr.producer(sid)].name.startswith("aten.tanh")})
    # sync: the swap-out (and so the free) is done when the compute stream goes on, so the watch sees it
    decisions = [replace(_swap(tr, sid, g, lead=2), sync=True) for sid in tanh_out for g in _gaps(tr, sid)[:-1]]
    assert len(tanh_out) == 2 and len(decisions) >= 2 * len(tanh_out)  # a forward gap, forward-to-backward, backward
    plan = Plan(decisions=tuple(decisions), planner="test-activations", trace_digest=tr.digest)
    runtime = PlanRuntime(tr, plan, model, optimizer=opt, engine=ThreadCopyEngine(before_job=_lagging))
    storage = runtime.schedule.storage
    assert {s.owner.kind for s in storage.swaps} == {"activation"} and len(storage.swaps) >= 2 * len(tanh_out)
    assert all(d.out_after < tr.meta["pack_ops"][tr.meta["pack_order"].index(d.storage)]
               for d, _ in runtime.schedule.skipped)  # only gaps before autograd saved the tensor stay
    outputs = []
    handles = [model[i].register_forward_hook(lambda m, a, out: outputs.append(out)) for i in (1, 3)]
    oracle = ReadsOnlyPresentStorages()
    for i in range(STEPS):
        outputs.clear()
        with runtime.installed(), oracle:
            runtime.begin_step()
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
            with _LowestSize(outputs) as watch:  # from the end of forward through backward
                loss.backward()
            opt.step()
        assert watch.lowest == [0, 0]  # each tanh output left the device inside backward
    for handle in handles:
        handle.remove()
    stats = runtime.stats()
    runtime.close()
    assert stats["storage_late_prefetches"] == 0 and stats["storage_dropped"] == 0
    ref_model, ref_opt, ref_step = _warm(*_tiny(), x)
    for _ in range(STEPS):
        ref_step(x)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref_model.parameters()))


def test_hook_points_and_owners_survive_the_trace_file(tmp_path):
    from memplan.tracing.io import read_trace, write_trace

    x = torch.randn(8, 16)
    model, opt, step = _warm(*_tiny(), x)
    tr = trace_step(step, (x,), model, opt)
    write_trace(tr, tmp_path / "t.jsonl")
    loaded = read_trace(tmp_path / "t.jsonl")
    plan = _tiny_plan(tr)
    a, b = (PlanRuntime(t, plan, model, optimizer=opt) for t in (tr, loaded))
    assert a.schedule.storage == b.schedule.storage and a.schedule.storage.swaps
    a.close()
    b.close()
