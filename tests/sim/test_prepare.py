"""The simulator's fast preparation of a plan (memplan.sim.decisions, lowering, regions, prepare and
the compiled per-plan pass) gives exactly what the Decision-by-Decision restatement in
tests/sim/reference_preparation.py gives: the same level, dropped decisions and reason, and the
same kernel results (time, every part of the breakdown, peak, link and host bytes, the infeasible
op and its shortfall), at every level, on traced models with hook records (hooked plans) and on
drawn traces without (interpreted ones), for drawn plans, budgets and host costs; and a search's
question (`time_if_fits`: the time, or None) gets the same answer. And the lower bounds of a form's
peak that let the simulator skip it (hooked) or answer a search without the kernel (interpreted) are
never above the peak it reaches."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memplan
from memplan.budget import NO_LIMIT
from memplan.cost.model import Cost
from memplan.cost.profiles import get_profile
from memplan.model import Decision, Plan
from memplan.sim import _codes as K
from memplan.sim.arrays import producer_ids
from memplan.sim.simulate import Simulator
from memplan.testing.strategies import training_traces

from tests.sim.reference_preparation import ReferenceLowering, reference_run

GPT2 = {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "seq_len": 16}
# A host that prices everything, issuing ahead of the device (a GPU's) or being it (the CPU).
HOST = {"host_op_s": 3e-6, "hook_s": 1e-6, "hook_call_s": 1.5e-6, "mode_op_s": 2e-6, "guard_op_s": 0.5e-6,
        "replay_op_s": 1e-6, "record_op_s": 2.5e-6, "action_s": 4e-6, "region_s": 5e-6}
PROFILES = ("h100", "gpu-host", "cpu-host")
SHARES = (None, 1.0, 0.9, 0.7, 0.5, 0.3)
EXAMPLES = 25


@pytest.fixture(scope="module")
def traced():
    return {"gpt2": memplan.trace_workload("hf:gpt2", 1, fake=True, **GPT2),
            "resnet": memplan.trace_workload("resnet18-cifar", 2, fake=True)}


def _cost(trace, profile):
    if profile == "h100":
        return Cost.for_trace(trace, "h100")
    base = dataclasses.replace(get_profile("h100"), **HOST, kind="cpu" if profile == "cpu-host" else "gpu")
    return dataclasses.replace(Cost.for_trace(trace, base), priced_host=True)


def random_plan(trace, rng: random.Random) -> Plan:
    """At most one decision a storage: swaps (some across the boundary, synchronous, overlapping or
    compressed, prefetched anywhere in their gap) and recomputations, over gaps between accesses."""
    decisions = []
    n = len(trace.ops)
    share = rng.choice((0.1, 0.3, 0.6, 0.9))
    for sid, acc in enumerate(trace.accesses):
        if len(acc) < 2 or rng.random() > share:
            continue
        if trace.storages[sid].persistent:
            if acc[-1] - acc[0] >= 2:
                trigger = rng.choice((None, rng.randint(0, acc[0]), rng.randint(acc[-1], n - 1)))
                decisions.append(Decision(storage=sid, action="swap", out_after=acc[-1], back_before=acc[0],
                                          trigger=trigger))
            continue
        k = rng.randrange(len(acc) - 1)
        out, back = acc[k], acc[k + 1]
        if back - out < 2:
            continue
        if trace.recomputable(sid) and rng.random() < 0.5:
            decisions.append(Decision(storage=sid, action="recompute", out_after=out, back_before=back))
            continue
        kind = rng.choice(("plain", "sync", "overlap", "compressed"))
        decisions.append(Decision(storage=sid, action="swap", out_after=out, back_before=back,
                                  trigger=rng.choice((None, rng.randint(out + 1, back))), sync=kind == "sync",
                                  overlap=kind == "overlap", compress_ratio=0.5 if kind == "compressed" else None))
    return Plan(decisions=tuple(decisions))


def two_gap_plan(trace, rng: random.Random) -> Plan:
    """`random_plan`'s decisions plus, on some storages with two gaps between accesses, a decision for
    each of the last two (in backward, both can run hooked: the lowering reads such a storage's gaps as
    a list)."""
    decisions = list(random_plan(trace, rng).decisions)
    decided = {d.storage for d in decisions}
    for sid, acc in enumerate(trace.accesses):
        if sid in decided or trace.storages[sid].persistent or len(acc) < 3 or rng.random() > 0.5:
            continue
        for k in (len(acc) - 3, len(acc) - 2):
            out, back = acc[k], acc[k + 1]
            if back - out >= 2:
                action = "recompute" if trace.recomputable(sid) and rng.random() < 0.5 else "swap"
                decisions.append(Decision(storage=sid, action=action, out_after=out, back_before=back))
    return Plan(decisions=tuple(decisions))


SEEDS = st.integers(0, 2**32 - 1)


def _fast(sim, plan, budget, hooked_only=False):
    result = sim.hooked(plan, budget) if hooked_only else sim.run(plan, budget)
    if result is None:
        return None
    b = result.breakdown
    floats = [result.time_s if result.feasible else None, b["compute_s"], b["memory_stall_s"], b["prefetch_stall_s"],
              b["recompute_s"], b["sync_stall_s"], b["host_s"]]
    ints = [result.feasible, result.infeasible_op, result.shortfall_bytes, result.peak_load_bytes, result.link_bytes]
    return result.level, result.dropped, result.level_reason, floats, ints, result.host_peak_bytes


def _reference(sim, plan, budget, hooked_only=False):
    out = reference_run(sim, plan, budget, hooked_only)
    if out is None:
        return None
    level, dropped, reason, f, i, host = out
    feasible = bool(i[K.I_FEASIBLE])
    floats = [float(f[K.R_TIME]) if feasible else None, *(float(f[j]) for j in (
        K.R_COMPUTE, K.R_MEM_STALL, K.R_PREFETCH_STALL, K.R_RECOMPUTE, K.R_SYNC_STALL, K.R_HOST))]
    ints = [feasible, None if feasible else int(i[K.I_BAD_OP]), 0 if feasible else int(i[K.I_SHORTFALL]),
            int(i[K.I_PEAK]), int(i[K.I_LINK])]
    return level, dropped, reason, floats, ints, host


def _same_everywhere(trace, plan, profile):
    sim = Simulator(trace, _cost(trace, profile))
    for share in SHARES:
        budget = NO_LIMIT if share is None else int(trace.peak_load_bytes * share)
        expected = _reference(sim, plan, budget)
        assert _fast(sim, plan, budget) == expected, (share, profile)
        assert Simulator(trace, sim.cost).time_if_fits(plan, budget) == expected[3][0]  # a search's question alone
        assert _fast(sim, plan, budget, hooked_only=True) == _reference(sim, plan, budget, hooked_only=True)


@pytest.mark.parametrize("model", ["gpt2", "resnet"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(seed=SEEDS, profile=st.sampled_from(PROFILES))
def test_traced_models_simulate_as_the_reference_prepares_them(traced, model, seed, profile):
    trace = traced[model]
    _same_everywhere(trace, random_plan(trace, random.Random(seed)), profile)


@pytest.mark.parametrize("model", ["gpt2", "resnet"])
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(seed=SEEDS)
def test_plans_with_two_gaps_a_storage_simulate_as_the_reference_prepares_them(traced, model, seed):
    trace = traced[model]
    _same_everywhere(trace, two_gap_plan(trace, random.Random(seed)), "gpu-host")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=training_traces(), seed=SEEDS, profile=st.sampled_from(PROFILES))
def test_drawn_traces_simulate_as_the_reference_prepares_them(trace, seed, profile):
    _same_everywhere(trace, random_plan(trace, random.Random(seed)), profile)


@pytest.mark.parametrize("model", ["gpt2", "resnet"])
@pytest.mark.parametrize("planner", ["sqrt-n", "checkpoint-all", "save-on-cpu", "capuchin", "dtr"])
def test_planners_plans_simulate_as_the_reference_prepares_them(traced, model, planner):
    trace = traced[model]
    for budget in ("90%", "60%"):
        try:
            plan = memplan.plan(trace, budget, planner=planner, simulate_result=False)
        except memplan.InfeasibleBudgetError:
            continue
        _same_everywhere(trace, Plan(decisions=plan.decisions), "gpu-host")


def on_traced_plans(test):
    """`test(traced, model, seed)` for both traced models and drawn seeds."""
    test = given(seed=SEEDS)(test)
    test = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])(test)
    return pytest.mark.parametrize("model", ["gpt2", "resnet"])(test)


def _drawn(traced, model: str, seed: int):
    """(trace, its simulator on h100, a random plan of the seed)."""
    trace = traced[model]
    return trace, Simulator(trace, _cost(trace, "h100")), random_plan(trace, random.Random(seed))


@on_traced_plans
def test_the_hooked_forms_peak_is_never_below_its_floor(traced, model, seed):
    trace, sim, plan = _drawn(traced, model, seed)
    hooked = sim.hooked(plan, NO_LIMIT)
    if hooked is not None:
        entry = sim._prepared(plan.decisions)
        assert entry.placed_floor <= hooked.peak_load_bytes
        assert entry.lowered_floor <= hooked.peak_load_bytes
        assert not entry.cannot_fit(hooked.peak_load_bytes)


@on_traced_plans
def test_the_hooked_forms_floor_is_never_below_the_interpreted_forms(traced, model, seed):
    """So the interpreted form's floor alone says when neither form fits (`Prepared.cannot_fit`)."""
    trace, sim, plan = _drawn(traced, model, seed)
    entry = sim._prepared(plan.decisions)
    if entry.given is None:
        assert entry.placed_floor >= entry.interpreted_floor
    for share in SHARES[1:]:
        cap = int(share * trace.peak_load_bytes)
        if entry.cannot_fit(cap):
            assert not sim.run(plan, cap).feasible  # simulated at every level it may run at


@on_traced_plans
def test_the_interpreted_forms_peak_is_never_below_its_replayed_floor(traced, model, seed):
    """So a search's question (`time_if_fits`) answers None from that floor where it exceeds the budget,
    without making the kernel's arrays: the same answer as the kernel's, for the plan as it is and as its
    planner may have chosen to run it (interpreted)."""
    trace, sim, plan = _drawn(traced, model, seed)
    interpreted = dataclasses.replace(plan, level="interpreted")
    entry = sim._prepared(plan.decisions)
    assert entry.interpreted_floor <= entry.replayed_floor <= sim.run(interpreted, NO_LIMIT).peak_load_bytes
    bare = dataclasses.replace(trace, saved=(), calls=())  # without hook records: it has no hooked form
    for share in SHARES[1:]:
        cap = int(share * trace.peak_load_bytes)
        for simulator, form in ((sim, plan), (sim, interpreted), (Simulator(bare, sim.cost), plan)):
            ran = simulator.run(form, cap)
            asked = Simulator(simulator.trace, sim.cost).time_if_fits(form, cap)
            assert asked == (ran.time_s if ran.feasible else None)


@on_traced_plans
def test_the_floor_without_the_region_runs_rules_out_only_what_they_would(traced, model, seed):
    """The bound taken before region runs are chosen (the decisions no call can run left out) is never
    above the hooked form's own (`lowered_floor`) or, where it runs nothing, the plain run's; so under
    every cap it rules out the hooked form only where that form does not fit."""
    trace, sim, plan = _drawn(traced, model, seed)
    entry = sim._prepared(plan.decisions)
    if entry.given is not None:
        return
    lowered = entry.lowered
    bound = entry.lowered_floor if lowered.level == "hooked" else sim._prepare.floor_bytes(lowered.arrays)
    assert entry.unrun_floor <= bound
    for share in SHARES[1:]:
        cap = int(share * trace.peak_load_bytes)
        if entry.hooked_cannot_fit(cap) and lowered.level == "hooked":
            assert entry.placed_floor > cap or entry.lowered_floor > cap
        elif entry.hooked_cannot_fit(cap):  # nothing runs hooked: the plain run does not fit either
            assert not sim.hooked(plan, cap).feasible


@on_traced_plans
def test_plans_are_lowered_as_the_reference_lowers_them(traced, model, seed):
    """The hooked form itself: its decisions, region runs, holds and which decision carries each run."""
    trace, sim, plan = _drawn(traced, model, seed)
    reference = ReferenceLowering(sim)
    level, decisions, regions, holds, dropped, reason = reference.lower(plan.decisions)
    lowered = sim.lower(plan.decisions)
    assert (lowered.level, lowered.decisions, lowered.regions, lowered.holds, lowered.dropped, lowered.reason) == \
        (level, decisions, regions, holds, dropped, reason)
    chains = sim._prepare.chains(lowered) if level == "hooked" else {}
    carried = {k for k, chain in chains.items() if chain.steps}
    expected = reference.chains(decisions, regions, producer_ids(trace)) if level == "hooked" else {}
    assert carried == {k for k, chain in expected.items() if chain.steps}
