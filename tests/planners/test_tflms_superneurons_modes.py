"""Paper 002's baselines as planners: TFLMS-like swap count and SuperNeurons' three modes."""

from __future__ import annotations

import pytest

from memplan.cost.model import Cost
from memplan.errors import InfeasibleBudgetError
from memplan.planners.base import plan as make_plan
from memplan.sim.validate import validate
from memplan.testing.conformance import PlannerConformance
from memplan.testing.synthetic import MIB, _Builder, chain_trace


def _sizes(trace, plan, action):
    return sorted(trace.storages[d.storage].nbytes // MIB for d in plan.decisions if d.action == action)


def test_tflms_swaps_the_count_largest_saved_activations():
    trace = chain_trace(6, sizes=[16 * MIB, 48 * MIB, 32 * MIB, 64 * MIB, 24 * MIB, 8 * MIB])
    plan = make_plan(trace, None, planner="tflms", count=3)
    # a5 (the last layer's output) is read right away in backward: no gap, never a candidate
    assert _sizes(trace, plan, "swap") == [32, 48, 64]
    assert validate(trace, plan) == []


def test_tflms_without_a_count_swaps_the_fewest_that_fit():
    trace = chain_trace(6)
    fewer = make_plan(trace, "90%", planner="tflms")
    more = make_plan(trace, "70%", planner="tflms")
    assert 0 < len(fewer.decisions) < len(more.decisions)
    with pytest.raises(InfeasibleBudgetError) as exc:
        make_plan(trace, "10%", planner="tflms")
    assert exc.value.min_feasible_bytes > exc.value.budget_bytes


def _conv_net():
    """conv -> bn -> relu -> conv -> loss: two expensive outputs (convs), two cheap ones."""
    b = _Builder()
    x = b.storage("x", MIB, "input", pre=True)
    w = [b.storage(f"w{i}", MIB, "param", pre=True, persistent=True) for i in range(2)]
    c0, n0, r0, c1 = (b.storage(name, 8 * MIB, "activation") for name in ("c0", "n0", "r0", "c1"))
    loss, g = b.storage("loss", MIB, "temp"), [b.storage(f"g{i}", 8 * MIB, "temp") for i in range(4)]
    b.op("aten.convolution.default", "forward", "conv0", reads=[x, w[0]], writes=[c0], flops=1e9)
    b.op("aten.native_batch_norm.default", "forward", "bn0", reads=[c0], writes=[n0], flops=1e6)
    b.op("aten.relu.default", "forward", "relu0", reads=[n0], writes=[r0], flops=1e6)
    b.op("aten.convolution.default", "forward", "conv1", reads=[r0, w[1]], writes=[c1], flops=1e9)
    b.op("aten.mse_loss.default", "forward", "loss", reads=[c1], writes=[loss], flops=1e6)
    b.op("aten.mse_loss_backward.default", "backward", "loss", reads=[loss, c1], writes=[g[0]], flops=1e6)
    b.op("aten.convolution_backward.default", "backward", "conv1", reads=[g[0], r0, w[1]], writes=[g[1]],
         flops=2e9)
    b.op("aten.threshold_backward.default", "backward", "relu0", reads=[g[1], r0], writes=[g[2]], flops=1e6)
    b.op("aten.native_batch_norm_backward.default", "backward", "bn0", reads=[g[2], c0, n0], writes=[g[3]],
         flops=1e6)
    b.op("aten.convolution_backward.default", "backward", "conv0", reads=[g[3], x, w[0]], writes=[], flops=2e9)
    return b.build(meta={"model": "convnet"})


@pytest.mark.parametrize("mode, swapped, recomputed", [
    ("recompute", [], ["n0", "r0"]), ("swap", ["c0"], []), ("both", ["c0"], ["n0", "r0"])])
def test_superneurons_modes_keep_convolutions_as_checkpoints(mode, swapped, recomputed):
    trace = _conv_net()
    plan = make_plan(trace, None, planner=f"superneurons-modes:{mode}", cost=Cost.for_trace(trace, "h100"))
    names = lambda action: sorted(trace.storages[d.storage].name for d in plan.decisions
                                  if d.action == action)
    assert (names("swap"), names("recompute")) == (swapped, recomputed)
    assert validate(trace, plan) == []


class TestTflmsConformance(PlannerConformance):
    planner = "tflms"


class TestSuperNeuronsRecomputeConformance(PlannerConformance):
    planner = "superneurons-modes:recompute"
    traces = [lambda: chain_trace(6), _conv_net]


class TestSuperNeuronsBothConformance(PlannerConformance):
    planner = "superneurons-modes:both"
    traces = [lambda: chain_trace(6), _conv_net]
