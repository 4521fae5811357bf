"""The trace strategies and exporters of memplan.testing, checked by an independent rule checker."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings

from memplan.model import Trace
from memplan.cost.device_memory import device_view
from memplan.testing.exporters import DEFAULT_OP_NS, reimport
from memplan.testing.strategies import consistency_errors, training_traces
from memplan.testing.synthetic import chain_trace


@given(training_traces())
def test_generated_traces_keep_the_tracers_rules(trace):
    assert consistency_errors(trace) == []
    assert trace.peak_load_bytes > 0 and {op.phase for op in trace.ops} >= {"forward"}


def _has_view(t):
    return any(not op.writes and op.reads for op in t.ops)


def _has_in_place(t):
    return any(set(op.reads) & set(op.writes) for op in t.ops)


def _freed_late(t):
    return any(not s.persistent and s.kind != "grad" and s.free_op < len(t.ops) and s.free_op > t.accesses[s.id][-1] + 1
               for s in t.storages)


FEATURES = {
    "a view": _has_view,
    "an in-place op": _has_in_place,
    "a multi-output op": lambda t: any(len(op.writes) > 1 for op in t.ops),
    "a zero-size storage": lambda t: any(s.nbytes == 0 for s in t.storages),
    "a zero-duration op that is not a view": lambda t: any(op.duration_s == 0.0 and op.writes for op in t.ops),
    "persistent optimizer state": lambda t: any(s.kind == "optimizer_state" and s.persistent for s in t.storages),
    "a storage freed late": _freed_late,
    "module paths on some ops only": lambda t: len({bool(op.module) for op in t.ops if op.phase != "optimizer"}) == 2,
    "no module at all, with backward": lambda t: not any(op.module for op in t.ops) and t.ops[-1].phase != "forward",
    "a forward pass only": lambda t: all(op.phase == "forward" for op in t.ops),
    "activations and temps": lambda t: {"activation", "temp", "workspace"} <= {s.kind for s in t.storages},
}


FIRST_FOUND = settings(phases=[Phase.generate], max_examples=500, derandomize=True, database=None)  # no shrinking


def test_generated_traces_have_every_feature_the_issue_lists():
    for what, has in FEATURES.items():
        assert has(find(training_traces(), has, settings=FIRST_FOUND)), what


def test_the_rule_checker_finds_broken_traces():
    trace = chain_trace(3)
    assert consistency_errors(trace) == []
    early = tuple(replace(s, free_op=2) if s.name == "a0" else s for s in trace.storages)  # a0 is read later
    assert any("outside" in e for e in consistency_errors(Trace(storages=early, ops=trace.ops)))
    late_birth = tuple(replace(s, alloc_op=2) if s.name == "loss_grad" else s for s in trace.storages)  # op 3 makes it
    assert any("born at op 2" in e for e in consistency_errors(Trace(storages=late_birth, ops=trace.ops)))


@given(training_traces())
def test_exported_traces_import_with_the_same_memory(trace):
    native, dtr, snap, csv = (reimport(trace, fmt) for fmt in ("memplan", "dtr", "snapshot", "minimalloc"))
    assert native.digest == trace.digest
    # A DTR log keeps every op, its time and the load at every op (in-place writes become reads).
    assert dtr.meta["source"] == "dtr" and len(dtr.ops) == len(trace.ops)
    assert np.array_equal(dtr.load, trace.load)
    assert [op.duration_s for op in dtr.ops] == pytest.approx(
        [DEFAULT_OP_NS / 1e9 if op.duration_s is None else op.duration_s for op in trace.ops], abs=1e-9)
    # A snapshot has one op per alloc and free, a minimalloc CSV none: the peak is the same (a
    # snapshot's sizes are requests, which the import counts as the allocator's blocks).
    assert snap.meta["source"] == "snapshot" and snap.peak_load_bytes == device_view(trace).peak_load_bytes
    assert csv.meta["source"] == "minimalloc" and not csv.ops and csv.peak_load_bytes == trace.peak_load_bytes
    for imported in (dtr, snap, csv):
        assert consistency_errors(imported) == []
