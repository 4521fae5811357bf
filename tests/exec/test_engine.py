"""The CUDA copy lanes (memplan.exec.engine.CudaCopyEngine) under CUDA's rules, on the CPU: every kind
of plan trains on memplan.testing.cuda_rules' stand-in bit-identically to plain training, and no copy
is used, and no block freed, before the stream that needs it waited for it (the NOTE's rules 1-5)."""

from __future__ import annotations

import pytest
import torch

from memplan.testing.cuda_rules import CudaRules
from memplan.workflows.cuda_graph import on_cuda_runtime
from memplan.workflows.optimize import optimize, trace_step

from tests.exec.helpers import batches, carried_state_plan, recompute_plan, swap_all_plan, tiny_workload, train_plain

PLANS = {"swaps": lambda t: swap_all_plan(t), "sync swaps": lambda t: swap_all_plan(t, sync=True),
         "early prefetches": lambda t: swap_all_plan(t, lead=40), "recomputations": recompute_plan,
         "state carried over": carried_state_plan}


@pytest.fixture(scope="module")
def tiny():
    w = tiny_workload()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    ref = tiny_workload()
    torch.manual_seed(5)
    return trace, train_plain(ref, batches(ref))


@pytest.mark.parametrize("executor", ["auto", "interpreted"])
@pytest.mark.parametrize("kind", sorted(PLANS))
def test_every_kind_of_plan_keeps_cudas_rules_and_trains_exactly(tiny, kind, executor):
    """Also the stand-in's first catch: a swap-out prefetched before its release (`kept`) left its copy
    unordered with the storage's later free, which the caching allocator could hand out under it. A state
    swapped out at the step's end is released in the next step, its copy's event waited for there."""
    trace, expected = tiny
    w, rules = tiny_workload(), CudaRules()
    plan = PLANS[kind](trace)
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=trace,
                    executor=executor)
    torch.manual_seed(5)
    with rules:
        on_cuda_runtime(step, rules, mode="off")
        for x in batches(w):
            step(*x)
    stats = step.stats()
    assert stats["swapped_out"] + stats["recomputed"] > 0 and stats["diverged_steps"] == 0
    assert stats["unresolved"] == 0
    if kind == "state carried over":  # sent away before the first step, released in each later one
        n = len(plan.decisions)
        assert len(step.program.carried_over) == n > 0 and stats["start_sent"] == n
        assert stats["released"] == len(batches(w)) * n and stats["swapped_out"] == (len(batches(w)) + 1) * n
    for p, q in zip(w.model.parameters(), expected):
        assert torch.equal(p, q)
    step.close()


@pytest.mark.parametrize("ratio", [0.3, 0.9])
def test_a_compressed_swap_out_makes_the_host_wait_for_no_kernel(tiny, ratio):
    """Finding 13: zero-value compression sized its output by the data on the copy lane, which waits for the
    compute stream: the host waited for all the work queued before every compressed swap-out. Now the host
    copy has a fixed layout; the host waits only at the release, for that copy, and a storage whose zeros
    were fewer than planned (dense data at ratio 0.3) is copied whole then."""
    trace, expected = tiny
    w, rules = tiny_workload(), CudaRules()
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer,
                    plan=swap_all_plan(trace, compress=ratio), trace=trace, executor="interpreted")
    torch.manual_seed(5)
    with rules:
        on_cuda_runtime(step, rules, mode="off")
        for x in batches(w):
            step(*x)
    assert step.stats()["swapped_out"] > 0
    assert not [s for s in rules.host_syncs if "reads a device value" in s]
    for p, q in zip(w.model.parameters(), expected):
        assert torch.equal(p, q)
    step.close()
