"""The local search on a plan's own decisions (`memplan.planners.kit.plan_search`, auto's refinement):
from a planner's plan it returns a plan the validator accepts, within the budget in the simulator,
never slower than the plan it started from (issue 39: `refined:capuchin` came out at 28.3% where
Capuchin's own plan was 20.9%, the search having started from a policy read off the plan), and
faster where the start is not a local optimum."""

from __future__ import annotations

import time

import numpy as np
import pytest

from memplan.cost.model import Cost
from memplan.model import Plan
from memplan.planners.base import plan as make_plan
from memplan.planners.kit.featuremaps import feature_maps
from memplan.planners.kit.plan_search import PlanSearch
from memplan.sim.simulate import Simulator
from memplan.sim.validate import validate
from memplan.testing.synthetic import MIB, chain_trace, residual_trace


@pytest.mark.parametrize("factory, share, start, faster", [
    (lambda: residual_trace(3, flops_per_block=3e10), 0.8, "capuchin", True),
    (lambda: residual_trace(3, flops_per_block=3e10), 0.8, "autoswap:swdoa", True),
    (lambda: residual_trace(3, flops_per_block=3e10), 0.7, "tflms", True),
    (lambda: chain_trace(9, sizes=[(16 + 24 * (i % 4)) * MIB for i in range(9)]), 0.6, "capuchin", False),
])
def test_the_search_never_slows_a_plan_down(factory, share, start, faster):
    trace = factory()
    cost = Cost.for_trace(trace, "h100")
    budget = int(share * trace.peak_load_bytes)
    simulator = Simulator(trace, cost)
    begun = make_plan(trace, budget, planner=start, cost=cost)
    before = simulator.run(begun, budget)
    polished = PlanSearch(feature_maps(trace), simulator, budget).polish(begun, time.monotonic() + 60.0)
    after = simulator.run(polished, budget)
    assert validate(trace, polished, budget) == [] and after.feasible and after.peak_load_bytes <= budget
    assert after.time_s <= before.time_s
    assert (after.time_s < before.time_s * (1 - 1e-6)) == faster
    if not faster:
        assert polished is begun  # nothing improved: the plan itself, its prefetch ops untouched


def test_the_iterated_search_is_never_slower_than_the_local_optimum_and_seeded():
    """`PlanSearch.iterate` kicks the polished plan (drops one to three decisions at random) and searches again:
    what it returns validates, fits, is no slower than `polish`'s local optimum, and the same for a seed."""
    trace = residual_trace(3, flops_per_block=3e10)
    cost = Cost.for_trace(trace, "h100")
    budget = int(0.7 * trace.peak_load_bytes)
    simulator = Simulator(trace, cost)
    start = make_plan(trace, budget, planner="tflms", cost=cost)
    search = PlanSearch(feature_maps(trace), simulator, budget)
    local = search.polish(start, time.monotonic() + 60.0)
    kicked = [search.iterate(start, time.monotonic() + 120.0, seed=3) for _ in range(2)]
    assert kicked[0].decisions == kicked[1].decisions
    assert validate(trace, kicked[0], budget) == [] and simulator.run(kicked[0], budget).peak_load_bytes <= budget
    assert search.time_s(kicked[0].decisions) <= search.time_s(local.decisions)


def test_a_recomputation_is_tried_with_its_inputs_swaps_dropped():
    """Swapping a recomputation's input away keeps the recomputation out (the validator refuses it
    beside that swap), so the search also tries it without the swap: on vgg16@64 at 50% the input
    image's swap kept the 784 MiB first convolution's output swapped (issue 49)."""
    from memplan.model import Decision

    trace = chain_trace(4)
    ids = {s.name: s.id for s in trace.storages}
    fm = feature_maps(trace)
    k = [int(s) for s in fm.storage].index(ids["a0"])
    out, back = int(fm.out_after[k]), int(fm.back_before[k])
    x = trace.storages[ids["x"]]
    accesses = trace.accesses[ids["x"]]
    swap_x = Decision(storage=x.id, action="swap", out_after=accesses[0], back_before=accesses[-1],
                      trigger=accesses[-1])
    swap_a0 = Decision(storage=ids["a0"], action="swap", out_after=out, back_before=back, trigger=back)
    search = PlanSearch(fm, Simulator(trace, Cost.for_trace(trace, "h100")), trace.peak_load_bytes)
    trials = list(search._sweep([swap_x, swap_a0]))
    recompute = Decision(storage=ids["a0"], action="recompute", out_after=out, back_before=back)
    assert [swap_x, recompute] in trials  # the plain move (the validator refuses it)
    assert [recompute] in trials  # ... and with x resident
    assert validate(trace, Plan(decisions=(recompute,))) == []


def test_a_prefetch_across_the_iteration_boundary_moves_within_its_head():
    """An optimizer state away from its update to its next one is prefetched in the head of the step
    it is due in: the search moves that prefetch too, to the backward layer starts before it is due
    (gpt2@8 with 4 layers at 70%: its plan's Adam states' prefetches crowded the activations'; 10.3% ->
    9.6%), and leaves one prefetched in the tail, for the next step, as planned."""
    from dataclasses import replace

    from memplan.model import Decision

    trace = chain_trace(4, state_bytes=8 * MIB)
    state = next(s.id for s in trace.storages if s.name == "m3")
    update = trace.accesses[state][0]
    swap = Decision(storage=state, action="swap", out_after=update, back_before=update, trigger=update)
    search = PlanSearch(feature_maps(trace), Simulator(trace, Cost.for_trace(trace, "h100")), trace.peak_load_bytes)
    moved = [trial[0] for trial in search._trigger_moves([swap], 0)]
    assert [d.trigger for d in moved] == [max(s for s in search.starts if s < update)]
    assert all(validate(trace, Plan(decisions=(d,))) == [] for d in [swap] + moved)
    tail = replace(swap, back_before=update - 1, trigger=update + 1)  # issued after its update: for the next step
    assert tail.wraps and list(search._trigger_moves([tail], 0)) == []


def _gap(trace, name: str) -> tuple[int, int, int]:
    """(storage, last forward access, first backward access) of an activation of `chain_trace`."""
    sid = next(s.id for s in trace.storages if s.name == name)
    accesses = trace.accesses[sid]
    return sid, accesses[-2], accesses[-1]


def test_prefetches_are_issued_again_in_order_of_need_each_as_soon_as_it_fits():
    """`retimed`: a plan's prefetches issued by §4.5, the one due first first, each at the first op
    from which its bytes fit under the cap until it is due (from the backward's first op on), then at
    the first hook point from there."""
    from memplan.model import Decision
    from memplan.planners.kit.gaps import load_without
    from memplan.planners.kit.prefetch import retimed
    from memplan.planners.kit.saved import first_backward_op

    trace = chain_trace(6)
    (a1, *_), (a2, _, a2_due) = gaps = [_gap(trace, "a1"), _gap(trace, "a2")]  # a2 is due first
    late = [Decision(storage=s, action="swap", out_after=o, back_before=b, trigger=b) for s, o, b in gaps]
    cap = int(load_without(trace, gaps).max()) + trace.nbytes[a2]  # room for one of them at the peak
    again = {d.storage: d.trigger for d in retimed(trace, late, cap)}
    assert again == {a2: first_backward_op(trace), a1: a2_due}  # a1 fits only once a2 is in use
    points = np.arange(len(trace.ops) + 1)
    points[again[a2]] = again[a2] + 1  # no hook point at a2's op: the next one, still before it is due
    assert {d.storage: d.trigger for d in retimed(trace, late, cap, points)} == {a2: again[a2] + 1, a1: a2_due}


def test_a_swap_no_feature_map_owns_is_exchanged_for_a_feature_map():
    """An optimizer state swapped over the iteration boundary is tried in place of each of the
    EXCHANGED_WITH largest feature maps without a decision, swapped and recomputed, with every prefetch
    issued again: where the plan fits only with one of the two, no single change finds the other (the
    state's actions fall in the optimizer's step, the activation's in the forward)."""
    from memplan.model import Decision
    from memplan.planners.kit.plan_search import EXCHANGED_WITH

    trace = chain_trace(4, state_bytes=8 * MIB)
    state = next(s.id for s in trace.storages if s.name == "m3")
    update = trace.accesses[state][0]
    swap = Decision(storage=state, action="swap", out_after=update, back_before=update, trigger=update)
    fm = feature_maps(trace)
    search = PlanSearch(fm, Simulator(trace, Cost.for_trace(trace, "h100")), trace.peak_load_bytes)
    exchanged = {(t[0].storage, t[0].action) for t in search._sweep([swap]) if len(t) == 1 and t[0].storage != state}
    largest = search.order[:EXCHANGED_WITH]
    assert exchanged == {(int(fm.storage[k]), a) for k in largest for a in ("swap", "recompute")
                         if a == "swap" or fm.recomputable[k]}


def test_a_recomputation_rebuilt_on_a_neighbours_chain_is_brought_back_with_it():
    """chain_trace(4): a2's chain (due at op 5) replays op 2, which reads a1, so with a1 recomputed away
    it rebuilds a1 too, and a1's own chain (due at op 6) replays op 1 again. Due at op 5 with a2, a1
    is rebuilt once (resnet50@256 at 1/3: 3.2 of 15.1 ms of replays were such repeats)."""
    from memplan.model import Decision

    trace = chain_trace(4, act_bytes=64 * MIB)
    ids = {s.name: s.id for s in trace.storages}
    a1 = Decision(storage=ids["a1"], action="recompute", out_after=2, back_before=6)
    a2 = Decision(storage=ids["a2"], action="recompute", out_after=3, back_before=5)
    simulator = Simulator(trace, Cost.for_trace(trace, "h100"))
    search = PlanSearch(feature_maps(trace), simulator, trace.peak_load_bytes)
    together = Decision(storage=ids["a1"], action="recompute", out_after=2, back_before=5)
    trials = list(search._sweep([a1, a2]))
    assert [together, a2] in trials
    assert [a1, Decision(storage=ids["a2"], action="recompute", out_after=3, back_before=6)] not in trials
    apart, moved = (simulator.run(Plan(decisions=d)) for d in ((a1, a2), (together, a2)))
    assert validate(trace, Plan(decisions=(together, a2))) == []
    replay = float(Cost.for_trace(trace, "h100").durations[1])  # op 1, once fewer
    assert apart.breakdown["recompute_s"] - moved.breakdown["recompute_s"] == pytest.approx(replay)


def test_a_recomputation_is_brought_back_with_an_earlier_one_the_same_module_call_rebuilds():
    """Two of a GELU's saved tensors recomputed, due at different hook points, make the hooked executor run
    the call again twice; due at the earlier one, one run rebuilds both (gpt2@8 with 4 layers at 70%:
    auto 12.44% -> 11.45% from that alone)."""
    from dataclasses import replace

    from memplan.model import Decision
    from memplan.workflows.workloads import trace_workload

    trace = trace_workload("hf:gpt2", 2, fake=True, n_layer=1, n_embd=32, n_head=2, vocab_size=64, seq_len=64)
    simulator = Simulator(trace, Cost.for_trace(trace, "h100"))
    fm = feature_maps(trace, min_bytes=1)
    search = PlanSearch(fm, simulator, trace.peak_load_bytes)
    act = next(c for c, call in enumerate(trace.calls) if call.module.endswith("mlp.act"))
    alone = [Decision(storage=int(fm.storage[k]), action="recompute", out_after=int(fm.out_after[k]),
                      back_before=int(fm.back_before[k])) for k in range(len(fm)) if fm.recomputable[k]]
    mine = sorted((d for d in alone if search._region_calls([d]) == {0: act}), key=lambda d: d.back_before)
    first, later = mine[0], next(d for d in mine if d.back_before > mine[0].back_before)
    apart = [later, first]
    together = [replace(later, back_before=first.back_before), first]
    assert search._region_calls(apart) == {0: act, 1: act}
    assert together in list(search._sweep(apart))
    runs = [len(set(simulator.lower(tuple(d)).regions.values())) for d in (apart, together)]
    assert runs == [2, 1]
    assert validate(trace, Plan(decisions=tuple(together))) == []
    assert search.time_s(together) < search.time_s(apart)


def _optimizer_states_of_a_tiny_gpt2(every: int):
    """A tiny traced GPT-2 (AdamW steps it a parameter at a time), every `every`-th of its optimizer
    states, a plan search at its peak and the stretches a plan splits its optimizer's step into."""
    from memplan.workflows.workloads import trace_workload

    trace = trace_workload("hf:gpt2", 2, fake=True, n_layer=1, n_embd=32, n_head=2, vocab_size=64, seq_len=64)
    simulator = Simulator(trace, Cost.for_trace(trace, "h100"))
    states = [s.id for s in trace.storages if s.kind == "optimizer_state" and trace.accesses[s.id]][::every]
    search = PlanSearch(feature_maps(trace), simulator, trace.peak_load_bytes)

    def stretches(decisions) -> int:
        return int(simulator.lowering.sites.stretches(simulator.lower(tuple(decisions)).sites).sum())

    return trace, states, search, stretches


def test_a_swap_across_the_boundary_is_tried_swapped_out_at_the_steps_end():
    """An Adam state swapped out after its update splits the optimizer's step at a hook there, a stretch
    the host pays (memplan.tracing.stepwise); swapped out at the step's end instead, it splits it
    nowhere (gpt2@8 with 4 layers at 70%: auto 7.3% -> 6.1%). The search tries each one there,
    and all at once; one prefetched in the tail stays where it is."""
    from dataclasses import replace

    from memplan.model import Decision

    trace, states, search, stretches = _optimizer_states_of_a_tiny_gpt2(every=6)
    last = trace.num_steps - 1
    swaps = [Decision(storage=s, action="swap", out_after=trace.accesses[s][-1], back_before=trace.accesses[s][0],
                      trigger=0) for s in states]
    trials = list(search._sweep(swaps))
    assert swaps[0].out_after < last and [replace(swaps[0], out_after=last)] + swaps[1:] in trials
    at_end = [replace(d, out_after=last) for d in swaps]
    assert at_end in trials
    assert stretches(at_end) < stretches(swaps)  # (their prefetches, due at their updates, still split it)
    assert search.time_s(at_end) < search.time_s(swaps) and validate(trace, Plan(decisions=tuple(at_end))) == []
    tail = replace(swaps[0], trigger=swaps[0].out_after + 1)  # prefetched after its update: for the next step
    assert not any(trial[0].out_after == last for trial in search._sweep([tail]) if trial)


def test_prefetches_waited_inside_the_optimizers_step_are_tried_waited_at_the_mark_before():
    """A prefetch waited at its parameter's update mark splits the optimizer's step there (a stretch the
    host pays); one that landed before an earlier mark is waited there at no cost, and the step splits
    fewer times (gpt2@8 with 4 layers at 70%: auto 6.1% -> 4.3%). The search tries each mark's waits at
    the mark before (the first one's at the step's start); one issued after that mark is not moved."""
    from dataclasses import replace

    from memplan.model import Decision

    trace, states, search, stretches = _optimizer_states_of_a_tiny_gpt2(every=3)
    last = trace.num_steps - 1
    swaps = [Decision(storage=s, action="swap", out_after=last, back_before=trace.accesses[s][0], trigger=0)
             for s in states]
    merged, trials = swaps, list(search._waits_merged(swaps))
    assert len(trials) > 1 and trials[0] in list(search._sweep(swaps))
    while trials:  # every mark merged into the one before, until all are waited at the step's start
        merged = trials[0]
        trials = list(search._waits_merged(merged))
    assert {d.back_before for d in merged} == {search.step_start} and stretches(merged) < stretches(swaps)
    assert search.time_s(merged) < search.time_s(swaps) and validate(trace, Plan(decisions=tuple(merged))) == []
    late = replace(swaps[-1], trigger=swaps[-1].back_before)  # issued at its own mark: waited nowhere earlier
    assert all(trial[-1] == late for trial in search._waits_merged(swaps[:-1] + [late]))
