"""The cost of a compiled step: fused ops without eager's per-op work, views free, the optimizer eager."""

from __future__ import annotations

import numpy as np
import pytest

from memplan.cost.compiled import compiled_cost
from memplan.problem import Problem
from memplan.workflows.step_trace import trace_step
from tests.exec.helpers import tiny_workload

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def timed():
    """TinyNet's trace with every op timed on this CPU, and its eager cost on a CPU profile."""
    w = tiny_workload()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer, time_repeats=2)
    return trace, Problem.of(trace, profile="h100").cost


def _phases(trace):
    return np.array([op.phase for op in trace.ops])


def test_a_compiled_op_costs_no_more_than_its_eager_self_and_a_view_nothing(timed):
    trace, eager = timed
    compiled = compiled_cost(trace, eager)
    moves_nothing = np.array([op.bytes_accessed == 0 and op.flops == 0 for op in trace.ops])
    forward_backward = _phases(trace) != "optimizer"
    assert np.all(compiled.durations[moves_nothing & forward_backward] == 0.0)
    assert np.all(compiled.durations <= eager.durations + 1e-12)
    assert compiled.durations[forward_backward].sum() < eager.durations[forward_backward].sum()
    assert not compiled.priced_host and compiled.executor_s("action") == 0.0  # no executor at a compiled step's ops


def test_the_optimizer_step_stays_eager(timed):
    trace, eager = timed
    optimizer = _phases(trace) == "optimizer"
    assert optimizer.any()
    assert np.array_equal(compiled_cost(trace, eager).durations[optimizer], eager.durations[optimizer])


def test_roofline_prices_keep_a_computing_ops_time_and_a_fused_op_writes_its_result(timed):
    trace, _ = timed
    roofline = Problem.of(trace.__class__(storages=trace.storages, ops=tuple(
        op.__class__(**{**op.__dict__, "duration_s": None}) for op in trace.ops)), profile="h100").cost
    compiled = compiled_cost(trace, roofline)
    profile = roofline.profile
    for op in trace.ops:
        if op.phase == "optimizer" or not op.bytes_accessed:
            continue
        if op.flops > 0:
            assert compiled.durations[op.index] == roofline.durations[op.index]
        else:
            written = min(op.bytes_accessed, sum(trace.storages[w].nbytes for w in op.writes))
            assert compiled.durations[op.index] == pytest.approx(
                written / (profile.hbm_bytes_per_s * profile.memory_efficiency))
