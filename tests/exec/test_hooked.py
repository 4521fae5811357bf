"""The hooked executor (memplan.exec.hooked): plans run at autograd's saved-tensor hooks and recompute by
running module calls again. Oracles: plain training from the same seed (bit-identical parameters and
buffers), the independent memory meter, and PyTorch's own dispatch-mode stack (no mode is entered)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from memplan.budget import NO_LIMIT
from memplan.exec.meter import MemoryMeter
from memplan.cost.profiles import get_profile
from memplan.model import Decision, Plan
from memplan.model.program import HOOKED
from memplan.planners.base import plan as make_plan
from memplan.problem import Problem
from memplan.sim.simulate import Simulator
from memplan.workflows.optimize import optimize
from memplan.workflows.run import BUDGET_TOLERANCE

from tests.exec.helpers import (STEPS, batches, gap, saved_activations, state_diffs, swap_all_plan, tiny_workload, traced,
                                train_plain)

# A GPT-2 of short ops (the CPU proxy of a GPU's host-bound step), at batch 1
GPT2 = {"n_layer": 6, "n_embd": 64, "n_head": 2, "vocab_size": 256, "seq_len": 64}


def gpt2_workload():
    from memplan.zoo.registry import get_workload

    return get_workload("hf:gpt2", 1, seed=0, **GPT2)


def _planned(make, plan, trace, steps: int = STEPS):
    """Train `steps` steps under `plan`, every one measured, recording the dispatch-mode stack in forward."""
    w = make()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=trace, measure=True)
    modes = []
    handle = next(m for m in w.model.modules() if not any(m.children())).register_forward_hook(
        lambda *_: modes.append(sum(not isinstance(m, MemoryMeter) for m in _get_current_dispatch_mode_stack())))
    torch.manual_seed(5)
    for i in range(steps):  # each step's inputs made right before it (older ones would be live memory)
        step(*w.make_inputs(w.batch, seed=100 + i))
    handle.remove()
    stats = step.stats()
    step.close()
    return w, stats, modes


def _plain(make, steps: int = STEPS):
    w = make()
    torch.manual_seed(5)
    train_plain(w, batches(w, steps))
    return w


@pytest.fixture(scope="module")
def tiny():
    return traced(tiny_workload())


@pytest.fixture(scope="module")
def gpt2():
    return traced(gpt2_workload())


def _at_checkpoint_memory(trace, planner: str) -> Plan:
    """`planner`'s plan at the peak sqrt-n's hooked form (block by block, as torch.utils.checkpoint) reaches."""
    budget = Simulator(trace, Problem.of(trace).cost).hooked(make_plan(trace, None, planner="sqrt-n"), NO_LIMIT).peak_load_bytes
    assert budget < trace.peak_load_bytes
    return make_plan(trace, budget, planner=planner)


def _checked(stats, modes):
    assert stats["level"] == "hooked" and stats["diverged_steps"] == 0 and stats["unresolved"] == 0
    assert stats["ops_in_mode"] == 0 and stats["replayed_ops"] == 0
    assert modes and max(modes) == 0  # no dispatch mode but the memory meter's while the model's forward runs
    for step in stats["steps_measured"]:
        assert step["measured_peak_bytes"] <= stats["budget_bytes"] * (1 + BUDGET_TOLERANCE)
        assert abs(step["measured_peak_bytes"] - stats["simulated_peak_bytes"]) <= \
            BUDGET_TOLERANCE * stats["simulated_peak_bytes"]


@pytest.mark.parametrize("planner", ["sqrt-n", "dtr"])
def test_gpt2_under_a_hooked_plan_is_bit_identical_and_enters_no_mode(gpt2, planner):
    plan = _at_checkpoint_memory(gpt2, planner)
    assert plan.predicted["level"] == "hooked", plan.predicted["level_reason"]
    got, stats, modes = _planned(gpt2_workload, plan, gpt2)
    _checked(stats, modes)
    assert stats["regions_recomputed"] >= STEPS and stats["recomputed"] >= stats["regions_recomputed"]
    assert max(state_diffs(got.model, _plain(gpt2_workload).model).values()) == 0.0


def test_region_recompute_with_dropout_batch_norm_and_in_place_ops_is_bit_identical(tiny):
    # TinyNet's blocks draw dropout masks, update batch-norm statistics and ReLU in place: a block run
    # again must draw the same masks and leave the statistics as one forward did.
    plan = _at_checkpoint_memory(tiny, "sqrt-n")
    assert plan.predicted["level"] == "hooked", plan.predicted["level_reason"]
    got, stats, modes = _planned(tiny_workload, plan, tiny)
    _checked(stats, modes)
    assert stats["regions_recomputed"] >= STEPS
    assert max(state_diffs(got.model, _plain(tiny_workload).model).values()) == 0.0  # buffers included


def encoder_workload():
    from memplan.zoo.registry import get_workload

    return get_workload("transformer-encoder", 2, seed=0, d_model=32, nhead=2, seq_len=16, vocab_size=50, num_layers=2)


def test_a_region_run_holds_what_it_captures_from_the_op_that_makes_it_on():
    # Rebuilding a transformer layer's feed-forward runs the whole layer again: its attention's
    # transients are gone before the feed-forward makes what the run captures, so the run never holds
    # both (the simulator once counted the captures and the largest transient at once: 16 KiB over
    # the meter here, and over it on a loaded host in test_calibrate_cpu's run of sqrt-n)
    trace = traced(encoder_workload())
    calls = {c.module: c for c in trace.calls}
    first, end = calls["encoder.layers.1.norm2"].first_op, calls["encoder.layers.1.dropout"].end_op
    feed_forward = [s for s in saved_activations(trace) if first <= trace.storages[s].alloc_op < end]
    due = min(gap(trace, s)[1] for s in feed_forward)
    plan = Plan(decisions=tuple(Decision(storage=s, action="recompute", out_after=gap(trace, s)[0], back_before=due)
                                for s in feed_forward), planner="test", trace_digest=trace.digest, level=HOOKED)
    lowered = Simulator(trace, Problem.of(trace).cost).lower(plan.decisions)
    assert {trace.calls[run.call].module for run in lowered.regions.values()} == {"encoder.layers.1"}
    got, stats, modes = _planned(encoder_workload, plan, trace)
    assert stats["regions_recomputed"] >= STEPS
    assert {s["measured_peak_bytes"] for s in stats["steps_measured"]} == {stats["simulated_peak_bytes"]}
    assert max(state_diffs(got.model, _plain(encoder_workload).model).values()) == 0.0


def test_a_hooked_swap_plan_is_bit_identical_and_frees_what_it_moves(tiny):
    plan = swap_all_plan(tiny, lead=1)
    plan = plan.with_meta(budget_bytes=make_plan(tiny, None, planner="none").predicted["peak_load_bytes"])
    got, stats, modes = _planned(tiny_workload, plan, tiny)
    _checked(stats, modes)
    assert stats["released"] > 0 and stats["prefetched"] + stats["kept"] > 0
    assert stats["measured_peak_bytes"] < tiny.peak_load_bytes
    assert max(state_diffs(got.model, _plain(tiny_workload).model).values()) == 0.0


def test_an_unpack_before_its_storage_is_back_brings_it_back_first(gpt2):
    # rule 3: with every recomputation postponed past the end of the step, each first unpack rebuilds
    plan = _at_checkpoint_memory(gpt2, "sqrt-n")
    w = gpt2_workload()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=gpt2, measure=False)
    runner = step.runtime.runner
    late = len(gpt2.ops) + 1
    runner.when = [late if a.kind.value == "recompute" else at for a, at in zip(step.runtime.program.actions, runner.when)]
    runner.when = [max(runner.when[:i + 1]) for i in range(len(runner.when))]  # the cursor's order holds
    torch.manual_seed(5)
    for x in batches(w):
        step(*x)
    assert step.stats()["late_unpacks"] > 0
    assert max(state_diffs(w.model, _plain(gpt2_workload).model).values()) == 0.0


def test_a_step_that_saves_other_tensors_than_traced_runs_unplanned(gpt2):
    # rule 2: with the dropouts off the step saves fewer tensors (no masks): a window's packs are not the
    # traced ones, and it leaves the program, training as plain training does
    plan = _at_checkpoint_memory(gpt2, "dtr")
    w, ref = gpt2_workload(), gpt2_workload()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=gpt2, measure=False)
    for model in (w.model, ref.model):
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.eval()
    x = w.make_inputs(w.batch, seed=3)
    torch.manual_seed(5)
    step(*x)
    torch.manual_seed(5)
    ref.step(*x)
    assert step.stats()["diverged_steps"] == 1
    assert max(state_diffs(w.model, ref.model).values()) == 0.0


def test_an_empty_plan_installs_nothing(tiny):
    got, stats, modes = _planned(tiny_workload, Plan(decisions=(), trace_digest=tiny.digest), tiny)
    assert stats["level"] != "hooked" and stats["ops_in_mode"] == 0 and max(modes) == 0


def test_saved_tensors_the_plan_never_moves_cost_no_hook(tiny):
    # one swap: the runner's saved-tensor hooks are installed only around the call that saves it (its window),
    # so a step calls Python at that window's packs and unpacks and a few module hooks, not at every pack
    sid = saved_activations(tiny)[3]
    out, back = gap(tiny, sid)
    plan = Plan(decisions=(Decision(storage=sid, action="swap", out_after=out, back_before=back),),
                trace_digest=tiny.digest, budget_bytes=tiny.peak_load_bytes)
    got, stats, modes = _planned(tiny_workload, plan, tiny)
    _checked(stats, modes)
    window = [c for c in tiny.calls if any(s.storage == sid for s in tiny.saved[c.first_saved:c.end_saved])]
    inner = min(window, key=lambda c: c.end_saved - c.first_saved)
    saved = tiny.saved[inner.first_saved:inner.end_saved]
    per_step = stats["hook_calls"] / STEPS
    assert len(saved) <= per_step < len(tiny.saved)
    assert stats["released"] == STEPS
    assert max(state_diffs(got.model, _plain(tiny_workload).model).values()) == 0.0


def test_a_region_run_passes_one_tensor_given_twice_as_one():
    # nn.MultiheadAttention takes its packed projection only where query, key and value are one object:
    # a run that cut each argument apart would save other tensors than the forward did
    from memplan.exec.rerun import Held, run_again

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True)
    x = torch.randn(2, 5, 16, requires_grad=True)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.untyped_storage().nbytes()) or t,
                                                  lambda t: t):
        mha(x, x, x)
    held = Held.of(mha, (x, x, x), {}, torch.device("cpu"))
    fresh = run_again(held, 0, {k: k for k in range(len(sizes))}, restores=False)
    assert [fresh[k].nbytes() for k in range(len(sizes))] == sizes


@pytest.mark.parametrize("which", ["one swap", "sqrt-n", "swap all"])
def test_the_simulator_counts_the_hook_calls_the_executor_makes(tiny, which):
    # the host is priced per hook call (hook_call_s): where the simulator's hook sites fire is where the
    # executor's hooks call Python, one list of points for both. (On a CPU, whose copies are inline, a
    # swap's release is at its swap-out's point; on a GPU it may come at a later site of its own.)
    cpu = dataclasses.replace(get_profile("h100"), kind="cpu")
    if which == "one swap":
        sid = saved_activations(tiny)[3]
        out, back = gap(tiny, sid)
        plan = Plan(decisions=(Decision(storage=sid, action="swap", out_after=out, back_before=back),))
    else:
        plan = make_plan(tiny, None, planner="sqrt-n") if which == "sqrt-n" else swap_all_plan(tiny)
    plan = dataclasses.replace(plan, trace_digest=tiny.digest, budget_bytes=tiny.peak_load_bytes, level=HOOKED)
    w = tiny_workload()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=tiny, profile=cpu)
    for i in range(STEPS):
        step(*w.make_inputs(w.batch, seed=100 + i))
    stats = step.stats()
    step.close()
    assert stats["level"] == "hooked" and stats["steps"] == STEPS
    simulator = Simulator(tiny, Problem.of(tiny, profile=cpu).cost)
    assert stats["hook_calls"] / STEPS == simulator.lowering.sites.firings(simulator.lower(plan.decisions).sites).sum()
