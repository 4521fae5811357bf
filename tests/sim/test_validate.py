"""The independent plan validator: one hand-made bad plan per violation kind, and valid plans.

Trace used throughout: chain_trace(4, sizes=[10, 20, 30, 40], param_bytes=3), whose
storage ids, accesses and lifetimes are listed in `_layout` below (checked by a test, so
a change to the synthetic trace cannot silently make these plans mean something else).
"""

import pytest

from memplan.model import Decision, Plan, PoolSlot
from memplan.sim import validate as v
from memplan.testing.synthetic import chain_trace

X, W0, W3, A0, A1, A2, A3 = 0, 1, 4, 5, 6, 7, 8
N_OPS = 13


@pytest.fixture(scope="module")
def trace():
    return chain_trace(4, sizes=[10, 20, 30, 40], param_bytes=3)


def swap(sid, out_after, back_before, trigger=None, sync=False):
    return Decision(storage=sid, action="swap", out_after=out_after, back_before=back_before, trigger=trigger,
                    sync=sync)


def recompute(sid, out_after, back_before):
    return Decision(storage=sid, action="recompute", out_after=out_after, back_before=back_before)


def kinds(trace, plan, budget=None):
    return [x.kind for x in v.validate(trace, plan, budget)]


def test_layout(trace):
    """The ids and accesses the hand-made plans below rely on."""
    named = {s.name: s.id for s in trace.storages}
    assert (named["x"], named["w0"], named["w3"], named["a0"], named["a1"], named["a2"], named["a3"]) == \
        (X, W0, W3, A0, A1, A2, A3)
    assert trace.accesses[A0] == (0, 1, 7) and trace.accesses[A1] == (1, 2, 6)
    assert trace.accesses[W0] == (0, 8, 12) and trace.accesses[W3] == (3, 5, 9)
    assert len(trace.ops) == N_OPS and trace.storages[A0].free_op == 8


def test_valid_plans_give_no_violation(trace):
    plan = Plan(decisions=(swap(A0, 1, 7, trigger=6), swap(A1, 2, 6, trigger=4, sync=True),
                           swap(W3, 9, 3, trigger=1), swap(W0, 12, 0, trigger=0)))
    assert v.validate(trace, plan) == []
    assert v.validate(trace, Plan()) == []


def test_multi_swap_with_disjoint_gaps_is_valid(trace):
    plan = Plan(decisions=(swap(W0, 0, 8, trigger=7), swap(W0, 8, 12, trigger=10)))
    assert v.validate(trace, plan) == []


def test_unknown_storage(trace):
    assert kinds(trace, Plan(decisions=(swap(999, 1, 7),))) == [v.UNKNOWN_STORAGE]


@pytest.mark.parametrize("decision", [
    swap(A0, 1, 8),        # back_before at free_op: the storage is gone by then
    recompute(A1, 0, 6),   # out_after before a1's first write (op 1)
    swap(A0, 1, 40),       # past the end of the trace
])
def test_out_of_lifetime(trace, decision):
    assert kinds(trace, Plan(decisions=(decision,))) == [v.OUT_OF_LIFETIME]


def test_wrap_around_only_for_persistent(trace):
    assert kinds(trace, Plan(decisions=(swap(A0, 7, 1),))) == [v.BAD_WRAP]


def test_read_while_absent(trace):
    found = v.validate(trace, Plan(decisions=(swap(A0, 0, 7),)))
    assert [(x.kind, x.storage, x.op) for x in found] == [(v.READ_WHILE_ABSENT, A0, 1)]


def test_read_while_absent_in_a_wrap_around_gap(trace):
    # w0 is read at op 8; a gap from op 0 wrapping to op 0 hides ops 1..12 and 0 of the next iteration.
    found = v.validate(trace, Plan(decisions=(swap(W0, 0, 0),)))
    assert [(x.kind, x.op) for x in found] == [(v.READ_WHILE_ABSENT, 8)]


@pytest.mark.parametrize("decision", [
    swap(A0, 1, 7, trigger=1),    # at out_after: before the swap-out
    swap(A0, 1, 7, trigger=8),    # after back_before
    swap(W3, 9, 3, trigger=5),    # wrap-around: op 5 lies outside (9, 13) + [0, 3]
])
def test_bad_trigger(trace, decision):
    assert kinds(trace, Plan(decisions=(decision,))) == [v.BAD_TRIGGER]


@pytest.mark.parametrize("decisions", [
    (swap(A0, 1, 7), swap(A0, 2, 7)),            # the second starts inside the first
    (swap(A0, 1, 7), recompute(A0, 1, 7)),       # the same gap twice
    (swap(W3, 5, 9), swap(W3, 9, 6)),            # a wrap-around ending inside a plain gap
])
def test_overlapping_gaps(trace, decisions):
    assert v.OVERLAPPING_GAPS in kinds(trace, Plan(decisions=decisions))


@pytest.mark.parametrize("decision", [recompute(X, 0, 8), recompute(W3, 5, 9)])
def test_not_recomputable(trace, decision):
    assert kinds(trace, Plan(decisions=(decision,))) == [v.NOT_RECOMPUTABLE]


def test_recompute_input_absent_when_input_swapped(trace):
    # a1 = layer1(a0, w1); a0 is on the host over op 6, so a1 cannot be rebuilt there.
    found = v.validate(trace, Plan(decisions=(swap(A0, 1, 7, trigger=7), recompute(A1, 2, 6))))
    assert [(x.kind, x.storage, x.op) for x in found] == [(v.RECOMPUTE_INPUT_ABSENT, A1, 6)]


def test_recompute_chain_through_recomputed_input(trace):
    # a2 needs a1 at op 5; a1 is itself recomputed then (its gap covers op 5) from a0, which is resident.
    plan = Plan(decisions=(recompute(A1, 2, 6), recompute(A2, 3, 5)))
    assert v.validate(trace, plan) == []
    # ... but not when a0, a1's own input, is on the host at op 5.
    plan = Plan(decisions=(recompute(A1, 2, 6), recompute(A2, 3, 5), swap(A0, 1, 7, trigger=7)))
    found = v.validate(trace, plan)
    assert sorted((x.kind, x.storage) for x in found) == [(v.RECOMPUTE_INPUT_ABSENT, A1),
                                                          (v.RECOMPUTE_INPUT_ABSENT, A2)]


def test_wrong_trace(trace):
    assert kinds(trace, Plan(trace_digest="0" * 16)) == [v.WRONG_TRACE]
    assert kinds(trace, Plan(trace_digest=trace.digest)) == []


# --- budget ------------------------------------------------------------------------------------


def _oracle_static_peak(trace, gaps):
    """Brute force: at each op, sum the storages alive whose (sid, first_away, back) gap does not hide them."""
    peak = 0
    for i in range(len(trace.ops)):
        load = sum(s.nbytes for s in trace.storages if s.alloc_op <= i < s.free_op
                   and not any(sid == s.id and lo <= i < hi for sid, lo, hi in gaps))
        peak = max(peak, load)
    return peak


def test_over_budget_without_plan(trace):
    peak = trace.peak_load_bytes
    assert peak == 162
    assert kinds(trace, Plan(), budget=peak) == []
    found = v.validate(trace, Plan(), budget=peak - 1)
    assert [(x.kind, x.op) for x in found] == [(v.OVER_BUDGET, 4)]


def test_budget_defaults_to_the_plan_budget(trace):
    assert kinds(trace, Plan(budget_bytes=100)) == [v.OVER_BUDGET]
    assert kinds(trace, Plan(budget_bytes=100), budget="100%") == []


def test_static_load_counts_prefetch_from_trigger(trace):
    # a2 (30 B) is away over ops 4..4 only when the prefetch is issued at op 5 itself.
    early = Plan(decisions=(swap(A2, 3, 5, trigger=4),))
    late = Plan(decisions=(swap(A2, 3, 5, trigger=5),))
    expected_late = _oracle_static_peak(trace, [(A2, 4, 5)])
    assert expected_late < 162
    assert kinds(trace, late, budget=expected_late) == []
    assert kinds(trace, early, budget=expected_late) == [v.OVER_BUDGET]
    assert kinds(trace, early, budget=162) == []


def test_static_load_of_recomputes_matches_oracle(trace):
    decisions = (recompute(A2, 3, 5), swap(A0, 1, 7, trigger=6), swap(W3, 9, 3, trigger=1))
    expected = _oracle_static_peak(trace, [(A2, 4, 5), (A0, 2, 6), (W3, 10, 13), (W3, 0, 1)])
    assert int(v.static_load(trace, list(decisions)).max()) == expected
    assert kinds(trace, Plan(decisions=decisions), budget=expected) == []
    assert kinds(trace, Plan(decisions=decisions), budget=expected - 1) == [v.OVER_BUDGET]


# --- pool --------------------------------------------------------------------------------------


def _disjoint_pool(trace, extra=()):
    """A trivially valid layout: every storage in its own byte range, plus `extra` (sid, start) slots."""
    slots, offset, offsets = [], 0, {}
    for s in trace.storages:
        offsets[s.id] = offset
        slots.append(PoolSlot(storage=s.id, start=s.alloc_op, offset=offset))
        offset += s.nbytes
    slots += [PoolSlot(storage=sid, start=start, offset=offsets[sid]) for sid, start in extra]
    return slots, offset


def test_valid_pool(trace):
    slots, size = _disjoint_pool(trace)
    assert v.validate(trace, Plan(pool=tuple(slots), pool_bytes=size)) == []


def test_pool_with_swap_needs_a_slot_per_residency(trace):
    # a0 is resident [0, 2) and again from its prefetch at op 6: two slots.
    slots, size = _disjoint_pool(trace)
    decisions = (swap(A0, 1, 7, trigger=6),)
    found = v.validate(trace, Plan(decisions=decisions, pool=tuple(slots), pool_bytes=size))
    assert [(x.kind, x.storage, x.op) for x in found] == [(v.POOL_MISSING_SLOT, A0, 6)]
    slots, size = _disjoint_pool(trace, extra=[(A0, 6)])
    assert v.validate(trace, Plan(decisions=decisions, pool=tuple(slots), pool_bytes=size)) == []


def test_pool_wrap_around_splits_at_the_boundary(trace):
    # w3 swapped after op 9, prefetched at op 11 for op 3 of the next iteration: resident [0, 10) and [11, 13).
    assert v.residency_intervals(trace, W3, [swap(W3, 9, 3, trigger=11)]) == [(0, 10), (11, 13)]
    assert v.residency_intervals(trace, W3, [swap(W3, 9, 3, trigger=1)]) == [(1, 10)]
    slots, size = _disjoint_pool(trace, extra=[(W3, 11)])
    plan = Plan(decisions=(swap(W3, 9, 3, trigger=11),), pool=tuple(slots), pool_bytes=size)
    assert v.validate(trace, plan) == []


def test_pool_overlap(trace):
    slots, size = _disjoint_pool(trace)
    # a1 [1, 7) moved onto a0's bytes [0, 8): both alive at op 1.
    a0_offset = next(p.offset for p in slots if p.storage == A0)
    slots = [PoolSlot(storage=A1, start=1, offset=a0_offset + 5) if p.storage == A1 else p for p in slots]
    found = v.validate(trace, Plan(pool=tuple(slots), pool_bytes=size))
    assert [(x.kind, x.op) for x in found] == [(v.POOL_OVERLAP, 1)]


def test_pool_reuse_after_free_is_fine(trace):
    slots, size = _disjoint_pool(trace)
    # g0 [8, 9) reuses a3's bytes: a3 is freed at op 5.
    a3_offset = next(p.offset for p in slots if p.storage == A3)
    g0 = next(s.id for s in trace.storages if s.name == "g0")
    slots = [PoolSlot(storage=g0, start=8, offset=a3_offset) if p.storage == g0 else p for p in slots]
    assert v.validate(trace, Plan(pool=tuple(slots), pool_bytes=size)) == []


def test_pool_out_of_range(trace):
    slots, size = _disjoint_pool(trace)
    assert kinds(trace, Plan(pool=tuple(slots), pool_bytes=size - 1)) == [v.POOL_OUT_OF_RANGE]


def test_pool_stray_slot(trace):
    slots, size = _disjoint_pool(trace, extra=[(A0, 4)])
    assert kinds(trace, Plan(pool=tuple(slots), pool_bytes=size)) == [v.POOL_STRAY_SLOT]


def test_every_kind_is_a_distinct_string():
    assert len(set(v.KINDS)) == len(v.KINDS)
    assert all(isinstance(k, str) for k in v.KINDS)


def test_a_recompute_whose_input_is_written_again_before_it_runs_is_rejected():
    # op 0: b = f(a); op 1: a += 1 (in place); op 2: reads b. Recomputing b before op 2 would
    # replay op 0 on the new value of a.
    from memplan.model import Op, Storage, Trace

    storages = (Storage(id=0, nbytes=8, kind="input", alloc_op=0, free_op=3),
                Storage(id=1, nbytes=8, kind="activation", alloc_op=0, free_op=3))
    ops = (Op(index=0, name="f", phase="forward", reads=(0,), writes=(1,)),
           Op(index=1, name="add_", phase="forward", reads=(0,), writes=(0,)),
           Op(index=2, name="g", phase="backward", reads=(1,)))
    trace = Trace(storages=storages, ops=ops)
    assert kinds(trace, Plan(decisions=(recompute(1, 0, 2),))) == [v.RECOMPUTE_INPUT_OVERWRITTEN]
    assert v.validate(Trace(storages=storages, ops=(ops[0], Op(index=1, name="h", phase="forward", reads=(0,)),
                                                   ops[2])), Plan(decisions=(recompute(1, 0, 2),))) == []


def test_a_recompute_whose_chain_rebuilds_an_input_from_data_written_since_is_rejected():
    # chain_trace(3) with its input kept: rebuilding dw1 before the optimizer's op 8 replays op 5,
    # whose input g2 the trace freed, so op 4 runs again too, and op 4 reads w2, which the
    # optimizer's op 7 updated: the chain would compute dw1 from the new weight.
    import dataclasses

    trace = chain_trace(3)
    ids = {s.name: s.id for s in trace.storages}
    storages = list(trace.storages)
    storages[ids["x"]] = dataclasses.replace(storages[ids["x"]], free_op=len(trace.ops))
    trace = dataclasses.replace(trace, storages=tuple(storages))
    assert trace.writers[ids["w2"]] and trace.storages[ids["g2"]].free_op < 8
    violations = v.validate(trace, Plan(decisions=(recompute(ids["dw1"], 5, 8),)))
    assert [x.kind for x in violations] == [v.RECOMPUTE_INPUT_OVERWRITTEN]
    assert f"input storage {ids['w2']} is written again by op 7" in violations[0].message
    # before the optimizer writes w2, the same chain reads what the step read
    assert v.validate(trace, Plan(decisions=(recompute(ids["dw1"], 5, 7),))) == []


CARRIED_TRACE = """\
{"schema": "memplan.trace", "version": 5, "meta": {"source": "hypothesis"}, "num_steps_hint": 0, "storages": 9, "ops": 6, "owners": 0, "saved": 0, "calls": 0, "marks": 0}
{"type": "storage", "id": 0, "nbytes": 64, "kind": "input", "alloc_op": 0, "free_op": 4, "dtype": "float32"}
{"type": "storage", "id": 1, "nbytes": 1048576, "kind": "param", "alloc_op": 0, "free_op": 6, "persistent": true, "dtype": "float32"}
{"type": "storage", "id": 2, "nbytes": 0, "kind": "temp", "alloc_op": 0, "free_op": 2, "dtype": "float32"}
{"type": "storage", "id": 3, "nbytes": 0, "kind": "temp", "alloc_op": 0, "free_op": 1, "dtype": "float32"}
{"type": "storage", "id": 4, "nbytes": 64, "kind": "activation", "alloc_op": 1, "free_op": 3, "dtype": "float32"}
{"type": "storage", "id": 5, "nbytes": 0, "kind": "temp", "alloc_op": 2, "free_op": 4, "dtype": "float32"}
{"type": "storage", "id": 6, "nbytes": 0, "kind": "temp", "alloc_op": 3, "free_op": 4, "dtype": "float32"}
{"type": "storage", "id": 7, "nbytes": 1048576, "kind": "grad", "alloc_op": 3, "free_op": 6, "dtype": "float32"}
{"type": "storage", "id": 8, "nbytes": 1048576, "kind": "optimizer_state", "alloc_op": 0, "free_op": 6, "persistent": true, "dtype": "float32"}
{"type": "op", "index": 0, "name": "aten.layer", "phase": "forward", "reads": [0, 1], "writes": [2, 3], "bytes_accessed": 1048640}
{"type": "op", "index": 1, "name": "aten.loss", "phase": "forward", "reads": [2], "writes": [4], "bytes_accessed": 64}
{"type": "op", "index": 2, "name": "aten.loss_backward", "phase": "backward", "reads": [4], "writes": [5], "bytes_accessed": 64}
{"type": "op", "index": 3, "name": "aten.layer_backward", "phase": "backward", "reads": [5, 0, 1], "writes": [6, 7], "bytes_accessed": 2097216}
{"type": "op", "index": 4, "name": "aten.mul_", "phase": "optimizer", "reads": [8, 7], "writes": [8], "bytes_accessed": 2097152}
{"type": "op", "index": 5, "name": "aten.add_", "phase": "optimizer", "reads": [1, 7, 8], "writes": [1], "bytes_accessed": 3145728}
"""


def test_a_pool_slot_for_a_swap_out_carried_into_the_next_step_is_no_stray(tmp_path):
    """A swap-out after the step's last op is copied, and released, in the next step (memplan.sim.program):
    the pool holds its storage at the step's start, which the validator accepts (found by the planner
    property suite: `autoswap:doa+smartpool` on this generated trace was refused as a stray slot)."""
    from memplan.pool.api import with_pool
    from memplan.tracing.io import read_trace

    path = tmp_path / "carried.jsonl"
    path.write_text(CARRIED_TRACE)
    trace = read_trace(path)
    swap = Decision(storage=8, action="swap", out_after=5, back_before=4, trigger=4)
    plan = with_pool(trace, Plan(decisions=(swap,), budget_bytes=3 * 2**20))
    assert {(p.storage, p.start) for p in plan.pool if p.storage == 8} == {(8, 0), (8, 4)}
    assert v.validate(trace, plan) == []
    stray = plan.with_meta(pool=plan.pool + (PoolSlot(storage=4, start=0, offset=0),))
    assert [x.kind for x in v.validate(trace, stray)] == [v.POOL_STRAY_SLOT]
