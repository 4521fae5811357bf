"""Baseline planners: hand-derived decisions on small chains, brute-force peaks, conformance."""

from dataclasses import replace

import pytest

from memplan.errors import InfeasibleBudgetError
from memplan.planners.base import plan
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import MIB, chain_trace
from memplan.model import Op, Storage, Trace
from memplan.sim.validate import validate

BASELINES = ("none", "save-on-cpu", "checkpoint-all", "sqrt-n")


def grouped_chain(n_layers: int = 9, per_block: int = 3, **kwargs) -> Trace:
    """chain_trace with module paths "block{i // per_block}.layer{i}": top-level blocks of layers."""
    trace = chain_trace(n_layers, **kwargs)
    ops = tuple(replace(op, module=f"block{int(op.module[5:]) // per_block}.{op.module}")
                if op.module.startswith("layer") else op for op in trace.ops)
    return Trace(storages=trace.storages, ops=ops, meta=trace.meta)


def _grouped_small():
    return grouped_chain(9, 3)


def _grouped_uneven():
    return grouped_chain(8, 4, sizes=[(8 + 16 * (i % 3)) * MIB for i in range(8)])


def _ids(trace, *names):
    by_name = {s.name: s.id for s in trace.storages}
    return [by_name[n] for n in names]


def _gaps(p):
    return sorted((d.storage, d.out_after, d.back_before) for d in p.decisions)


def _oracle_peak(trace, p):
    """Brute force: at each op, the alive storages not inside a (out_after, fetch) gap."""
    away = [(d.storage, d.out_after + 1, d.prefetch_at) for d in p.decisions]
    return max(sum(s.nbytes for s in trace.storages if s.alloc_op <= i < s.free_op
                   and not any(sid == s.id and lo <= i < hi for sid, lo, hi in away))
               for i in range(len(trace.ops)))


def _plan(trace, name, budget="100%", **params):
    return plan(trace, budget, planner=name, simulate_result=False, **params)


# --- decisions, derived by hand from the chain's structure ----------------------------------------
# chain_trace(n): op i (< n) is layer i's forward writing a_i; op n is the loss backward (reads
# a_{n-1}); op n+1+(n-1-i) is layer i's backward, reading a_{i-1}.


def test_none_keeps_everything_and_names_the_peak():
    trace = chain_trace(4, sizes=[10, 20, 30, 40], param_bytes=3)
    assert _plan(trace, "none").decisions == ()
    with pytest.raises(InfeasibleBudgetError) as err:
        _plan(trace, "none", budget=161)
    assert err.value.min_feasible_bytes == 162 and err.value.budget_bytes == 161


def test_save_on_cpu_swaps_every_saved_activation_synchronously():
    trace = chain_trace(4, sizes=[10, 20, 30, 40], param_bytes=3)
    a0, a1, a2, a3 = _ids(trace, "a0", "a1", "a2", "a3")
    p = _plan(trace, "save-on-cpu")
    # a_i's last forward use is op i+1 (a3: op 3, its producer); backward first reads it at op 4+(3-i).
    assert _gaps(p) == [(a0, 1, 7), (a1, 2, 6), (a2, 3, 5), (a3, 3, 4)]
    assert all(d.action == "swap" and d.sync and d.trigger == d.back_before for d in p.decisions)
    # Load at op 4 (the old peak): a0, a1 and a2 are on the host.
    assert _oracle_peak(trace, p) == max(162 - 60, 155 - 30)


def test_checkpoint_all_recomputes_inside_top_level_blocks():
    trace = grouped_chain(9, 3)
    a0, a1, a3, a4, a6 = _ids(trace, "a0", "a1", "a3", "a4", "a6")
    p = _plan(trace, "checkpoint-all")
    # Block 0 (layers 0-2) comes back before layer 2's backward (op 16), block 1 before layer 5's
    # (op 13), block 2 before the loss backward (op 9); a2, a5 are block outputs and kept; a7 and a8
    # are used right before op 9, so they have no gap to give.
    assert _gaps(p) == [(a0, 1, 16), (a1, 2, 16), (a3, 4, 13), (a4, 5, 13), (a6, 7, 9)]
    assert all(d.action == "recompute" for d in p.decisions)


def test_checkpoint_all_leaves_module_less_ops_alone():
    # Layer 4's forward runs in the model's own code (no module): it is in no checkpointed block, so
    # a4 is kept and a3, read by it, becomes an output of block 1, which then recomputes nothing.
    trace = grouped_chain(9, 3)
    ops = tuple(replace(op, module="") if op.index == 4 else op for op in trace.ops)
    trace = Trace(storages=trace.storages, ops=ops, meta=trace.meta)
    a0, a1, a6 = _ids(trace, "a0", "a1", "a6")
    assert _gaps(_plan(trace, "checkpoint-all")) == [(a0, 1, 16), (a1, 2, 16), (a6, 7, 9)]


def test_sqrt_n_without_module_names_cuts_ops():
    trace = chain_trace(9)
    trace = Trace(storages=trace.storages, ops=tuple(replace(op, module="") for op in trace.ops), meta=trace.meta)
    a0, a1, a3, a4, a6 = _ids(trace, "a0", "a1", "a3", "a4", "a6")
    assert _gaps(_plan(trace, "sqrt-n")) == [(a0, 1, 16), (a1, 2, 16), (a3, 4, 13), (a4, 5, 13), (a6, 7, 9)]


def test_sqrt_n_keeps_what_replays_an_input_freed_before_backward():
    # As an imported log's released constant: x is freed after layer 0 (its backward does not
    # read it here), so a0, whose producer read x, cannot be rebuilt and is kept.
    trace = chain_trace(9)
    x, _a0, a1, a3, a4, a6 = _ids(trace, "x", "a0", "a1", "a3", "a4", "a6")
    ops = tuple(replace(op, reads=tuple(r for r in op.reads if r != x)) if op.index > 0 else op for op in trace.ops)
    storages = tuple(replace(st, free_op=1) if st.id == x else st for st in trace.storages)
    trace = Trace(storages=storages, ops=ops, meta=trace.meta)
    p = _plan(trace, "sqrt-n")
    assert _gaps(p) == [(a1, 2, 16), (a3, 4, 13), (a4, 5, 13), (a6, 7, 9)]
    assert validate(trace, p) == []


def test_sqrt_n_keeps_what_replays_an_input_written_again_in_place():
    # op 0: a = f(x); op 1: b = g(a); op 2: x += 1; op 3: loss = h(b); backward reads b, then a.
    # Two segments, [0, 1] and [2, 3]: a is inside the first, but replaying op 0 would read the new x.
    storages = [Storage(id=0, nbytes=MIB, kind="input", alloc_op=0, free_op=6),
                Storage(id=1, nbytes=MIB, kind="activation", alloc_op=0, free_op=6),
                Storage(id=2, nbytes=MIB, kind="activation", alloc_op=1, free_op=5),
                Storage(id=3, nbytes=4, kind="activation", alloc_op=3, free_op=5),
                Storage(id=4, nbytes=MIB, kind="temp", alloc_op=4, free_op=6)]
    ops = [Op(index=0, name="f", phase="forward", reads=(0,), writes=(1,)),
           Op(index=1, name="g", phase="forward", reads=(1,), writes=(2,)),
           Op(index=2, name="add_", phase="forward", reads=(0,), writes=(0,)),
           Op(index=3, name="h", phase="forward", reads=(2,), writes=(3,)),
           Op(index=4, name="h_backward", phase="backward", reads=(3, 2), writes=(4,)),
           Op(index=5, name="g_backward", phase="backward", reads=(4, 1), writes=(4,))]
    trace = Trace(storages=tuple(storages), ops=tuple(ops))
    assert _plan(trace, "sqrt-n").decisions == ()
    ops[2] = Op(index=2, name="view", phase="forward", reads=(0,))  # without the update, a is recomputed
    assert _gaps(_plan(Trace(storages=tuple(storages), ops=tuple(ops)), "sqrt-n")) == [(1, 1, 5)]


def test_checkpoint_all_of_single_layer_blocks_keeps_everything():
    # Every layer is its own top-level module: each activation is a block output.
    assert _plan(chain_trace(6), "checkpoint-all").decisions == ()


def test_sqrt_n_segments_a_chain():
    trace = chain_trace(9)
    a0, a1, a3, a4, a6 = _ids(trace, "a0", "a1", "a3", "a4", "a6")
    # 9 layers, 3 segments of 3: the same cut as checkpoint-all on grouped_chain(9, 3).
    assert _gaps(_plan(trace, "sqrt-n")) == [(a0, 1, 16), (a1, 2, 16), (a3, 4, 13), (a4, 5, 13), (a6, 7, 9)]


def test_sqrt_n_keeps_only_segment_outputs_and_cuts_memory():
    n = 16
    trace = chain_trace(n, act_bytes=MIB, param_bytes=1)
    p = _plan(trace, "sqrt-n")
    recomputed = {trace.storages[d.storage].name for d in p.decisions}
    kept_outputs = {"a3", "a7", "a11", "a15"}  # 4 segments of 4 layers
    last_segment_used_at_once = {"a14"}  # a12, a13 have a gap before the loss; a14 does not
    assert recomputed == {f"a{i}" for i in range(n)} - kept_outputs - last_segment_used_at_once
    # Peak: roughly the sqrt(n) kept outputs plus one segment rebuilt, far below the n of plain training.
    assert _oracle_peak(trace, p) <= (4 + 4 + 3) * MIB < trace.peak_load_bytes


def test_sqrt_n_segment_parameter():
    trace = chain_trace(8)
    one = _plan(trace, "sqrt-n", segments=1)
    assert len(one.decisions) == 6  # all but a7 (the output) and a6 (used at once by the loss)
    assert _plan(trace, "sqrt-n", segments=8).decisions == ()  # every layer is a segment


@pytest.mark.parametrize("name", BASELINES)
def test_infeasible_names_the_static_peak(name):
    trace = grouped_chain(9, 3, sizes=[(4 + i) * MIB for i in range(9)])
    p = _plan(trace, name)
    peak = _oracle_peak(trace, p)
    assert _gaps(_plan(trace, name, budget=peak)) == _gaps(p)
    with pytest.raises(InfeasibleBudgetError) as err:
        _plan(trace, name, budget=peak - 1)
    assert err.value.min_feasible_bytes == peak


# --- shared conformance -------------------------------------------------------------------------


class TestNoneConformance(PlannerConformance):
    planner = "none"


class TestSaveOnCpuConformance(PlannerConformance):
    planner = "save-on-cpu"


class TestCheckpointAllConformance(PlannerConformance):
    planner = "checkpoint-all"
    traces = [_grouped_small, _grouped_uneven]


class TestSqrtNConformance(PlannerConformance):
    planner = "sqrt-n"


class TestSqrtNSegmentsConformance(PlannerConformance):
    planner = "sqrt-n"
    params = {"segments": 2}
    traces = [_grouped_uneven]
