"""Storage-level swaps: parameters, gradients and optimizer state, across the iteration boundary.

Oracles: plain training from the same seed (bit-identical parameters and optimizer state),
and a dispatch mode that checks every op of a step reads storages that are really there.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

from memplan.workflows.optimize import trace_step
from memplan.exec.engine import ThreadCopyEngine
from memplan.exec.runtime import PlanRuntime
from memplan.planners.autoswap import load_min_bytes
from memplan.planners.base import plan as make_plan
from memplan.model import Plan
from memplan.zoo.registry import get_workload

from test_exec_helpers import SMALL, STEPS, ReadsOnlyPresentStorages, batches

SEED = 5
SHARE = 0.1  # budget = load_min + SHARE x (peak - load_min): low enough that AutoSwap swaps weights and state
BO_TRIALS = 8  # fewer Bayesian-optimisation evaluations than the default: the plan's quality is not tested here
STORAGE_KINDS = ("param", "optimizer_state", "grad")
LAG_S = {"d2h": 0.005, "h2d": 0.03}  # delays of the deliberately slow copy engine, per job
CASES = [pytest.param((m, o, p), id=f"{m}-{o}-{p}", marks=[pytest.mark.slow] if m != "hf:gpt2" else [])
         for m, o, p in (("vgg11-cifar", "sgd", "autoswap:doa"), ("vgg11-cifar", "adam", "autoswap:bo"),
                         ("resnet18-cifar", "sgd", "autoswap:bo"), ("resnet18-cifar", "adam", "autoswap:doa"),
                         ("hf:gpt2", "adam", "autoswap:doa"), ("hf:gpt2", "sgd", "autoswap:aoa"))]


def _lagging(lane: str) -> None:
    """The copy lanes lag far behind compute: a consumer that does not wait reads unlanded data."""
    time.sleep(LAG_S[lane])


def _workload(name: str, optimizer: str):
    return get_workload(name, 2, seed=0, optimizer=optimizer, **SMALL.get(name, {}))


def _low_budget_plan(tr, planner: str) -> Plan:
    low = load_min_bytes(tr)
    params = {"n_trials": BO_TRIALS} if planner == "autoswap:bo" else {}
    return make_plan(tr, int(low + SHARE * (tr.peak_load_bytes - low)), planner=planner, device="h100", seed=0,
                     **params)


def _reference(name: str, optimizer: str):
    w = _workload(name, optimizer)
    torch.manual_seed(SEED)
    for x in batches(w):
        w.step(*x)
    return w


def _same_state(w, ref) -> bool:
    """Parameters, buffers and optimizer state bit-identical."""
    same = all(torch.equal(a, b) for a, b in zip(w.model.state_dict().values(), ref.model.state_dict().values()))
    for p, q in zip(w.model.parameters(), ref.model.parameters()):
        s, r = w.optimizer.state.get(p, {}), ref.optimizer.state.get(q, {})
        same &= s.keys() == r.keys() and all(torch.equal(s[k], r[k]) for k in s if isinstance(s[k], torch.Tensor))
    return same


@pytest.fixture(scope="module", params=CASES)
def planned(request):
    name, opt, planner = request.param
    w = _workload(name, opt)
    tr = trace_step(w.step, w.inputs, w.model, w.optimizer)
    return name, opt, tr, _low_budget_plan(tr, planner), _reference(name, opt)


def test_autoswap_plans_swap_weights_and_state_across_iterations(planned):
    name, opt, tr, plan, _ = planned
    kinds = Counter((tr.storages[d.storage].kind, d.wraps) for d in plan.decisions)
    assert kinds[("param", True)] and kinds[("optimizer_state", True)], kinds


def _train_under(name: str, opt: str, tr, plan: Plan, delayed: bool):
    """Train STEPS steps under `plan` (the oracle watching every op); the workload and counters."""
    w = _workload(name, opt)
    engine = ThreadCopyEngine(before_job=_lagging) if delayed else None
    runtime = PlanRuntime(tr, plan, w.model, optimizer=w.optimizer, engine=engine)
    oracle = ReadsOnlyPresentStorages()
    torch.manual_seed(SEED)
    for x in batches(w):
        with runtime.installed(), oracle:
            runtime.begin_step()
            w.step(*x)
    stats = runtime.stats()
    runtime.close()
    assert oracle.ops > 0
    return w, stats, runtime.schedule


def test_training_under_storage_swaps_is_bit_identical(planned):
    name, opt, tr, plan, ref = planned
    # The delayed engine is the harder case; the plain one once per optimizer suffices.
    for delayed in (False, True) if name == "hf:gpt2" else (True,):
        w, stats, schedule = _train_under(name, opt, tr, plan, delayed)
        assert _same_state(w, ref)
        reasons = " ".join(stats["skipped_reasons"])
        assert not any(tr.storages[d.storage].kind in STORAGE_KINDS for d, _ in schedule.skipped), reasons
        assert "persistent" not in reasons and "cross-iteration" not in reasons
        planned_here = sum(tr.storages[d.storage].kind in STORAGE_KINDS for d in plan.decisions)
        assert stats["storage_swaps_planned"] == planned_here
        assert stats["storage_swapped_out"] >= planned_here * (STEPS - 1)  # step 1 creates the optimizer state
        assert stats["storage_late_prefetches"] == stats["storage_rescued"] == stats["storage_diverged_steps"] == 0
        assert stats["storage_slab_bytes"] > 0


@pytest.mark.slow
def test_multi_swap_plans_run_later_gaps_of_activations_and_weights():
    name, batch = "vgg11-cifar", 8
    w = get_workload(name, batch, seed=0)
    tr = trace_step(w.step, w.inputs, w.model, w.optimizer)
    low = load_min_bytes(tr, multi_swap=True)
    plan = make_plan(tr, int(low + SHARE * (tr.peak_load_bytes - low)), planner="autoswap:doa", device="h100",
                     seed=0, allow_multi_swap=True)
    runtime = PlanRuntime(tr, plan, w.model, optimizer=w.optimizer, engine=ThreadCopyEngine(before_job=_lagging))
    kinds = Counter(s.owner.kind for s in runtime.schedule.storage.swaps)
    assert kinds["activation"] and kinds["param"] > len({s.storage for s in runtime.schedule.storage.swaps
                                                         if s.owner.kind == "param"})  # several gaps of a weight
    for _, reason in runtime.schedule.skipped:  # what stays resident: nothing references it then
        assert reason.startswith(("no run-time reference", "autograd saves it only after", "no hook point")), reason
    torch.manual_seed(SEED)
    for x in [w.make_inputs(batch, seed=100 + i) for i in range(STEPS)]:
        with runtime.installed(), ReadsOnlyPresentStorages():
            runtime.begin_step()
            w.step(*x)
    stats = runtime.stats()
    runtime.close()
    assert stats["storage_late_prefetches"] == stats["storage_diverged_steps"] == stats["storage_dropped"] == 0
    ref = get_workload(name, batch, seed=0)
    torch.manual_seed(SEED)
    for x in [ref.make_inputs(batch, seed=100 + i) for i in range(STEPS)]:
        ref.step(*x)
    assert _same_state(w, ref)
