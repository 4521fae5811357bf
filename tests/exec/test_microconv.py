"""The micro-batched convolution: split kernels equal the undivided ones within float rounding,
as functions, as a swapped-in module, and inside the executor under a plan (where the
memory it holds is what the plan charges)."""

import pytest
import torch
from tests.exec.helpers import state_diffs, tiny_workload

from memplan.conv.options import accumulator_bytes
from memplan.exec import microconv
from memplan.model import MicroBatch, Plan
from memplan.workflows.optimize import optimize, trace_step

aten = torch.ops.aten
GEOMETRIES = [  # (c, k, h, w, r, s, stride, padding, dilation, groups)
    (3, 5, 8, 8, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (4, 6, 9, 7, 3, 5, (2, 1), (1, 2), (1, 1), 2),
    (8, 8, 12, 10, 3, 3, (2, 2), (2, 2), (2, 2), 4),
    (6, 4, 11, 11, 1, 1, (2, 2), (0, 0), (1, 1), 1),
]
SPLITS = [(2, 2, 1), (1, 1, 1, 1, 1), (4, 1)]


def _case(geometry, dtype=torch.float32, n=5, seed=0):
    c, k, h, w, r, s, stride, padding, dilation, groups = geometry
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g).to(dtype)
    weight = torch.randn(k, c // groups, r, s, generator=g).to(dtype)
    bias = torch.randn(k, generator=g).to(dtype)
    conv = (list(stride), list(padding), list(dilation), False, [0, 0], groups)
    y = aten.convolution.default(x, weight, bias, *conv)
    return x, weight, bias, conv, torch.randn(y.shape, generator=g).to(dtype)


def _close(got, want, rtol):
    scale = want.double().abs().max().clamp_min(1e-30)
    assert float((got.double() - want.double()).abs().max() / scale) <= rtol


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("sizes", SPLITS)
def test_split_kernels_equal_the_undivided_ones(geometry, sizes):
    x, weight, bias, conv, dy = _case(geometry)
    _close(microconv.forward(x, weight, bias, *conv, sizes=sizes), aten.convolution.default(x, weight, bias, *conv), 1e-6)
    mask = [True, True, True]
    want = aten.convolution_backward.default(dy, x, weight, [weight.shape[0]], *conv, mask)
    got = microconv.backward(dy, x, weight, [weight.shape[0]], *conv, mask, data_sizes=sizes, filter_sizes=sizes[::-1])
    for g, w in zip(got, want):
        _close(g, w, 1e-6)
    only_filter = microconv.backward(dy, x, weight, None, *conv, [False, True, False], filter_sizes=sizes)
    assert only_filter[0] is None and only_filter[2] is None
    _close(only_filter[1], want[1], 1e-6)


def test_half_precision_weight_gradients_are_summed_in_fp32():
    x, weight, _bias, conv, dy = _case(GEOMETRIES[0], dtype=torch.bfloat16, n=16)
    exact = aten.convolution_backward.default(dy.double(), x.double(), weight.double(), None, *conv,
                                              [False, True, False])[1]
    split = microconv.backward(dy, x, weight, None, *conv, [False, True, False], filter_sizes=(1,) * 16)[1]
    assert split.dtype == torch.bfloat16
    _close(split, exact, 2e-2)  # bfloat16's own rounding of the result; a bf16 running sum drifts further


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_split_weight_gradient_holds_exactly_its_accumulator_beside_the_gradient(dtype):
    from memplan.exec.meter import MemoryMeter

    x, weight, _, conv, dy = _case(GEOMETRIES[0], dtype=dtype, n=6)
    meter = MemoryMeter("cpu")
    meter.track((x, weight, dy))
    meter.reset_peak()
    before = meter.live_bytes()
    with meter:
        microconv.backward(dy, x, weight, None, *conv, [False, True, False], filter_sizes=(2, 2, 2))
    nbytes = weight.numel() * weight.element_size()
    extra = accumulator_bytes("bwd_filter", nbytes, weight.element_size())
    assert meter.peak()["measured_peak_bytes"] - before == nbytes + extra


def test_the_swapped_in_module_trains_like_nn_conv2d():
    torch.manual_seed(0)
    plain = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    split = microconv.MicroBatchConv2d.wrapping(torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
                                                {"fwd": (3, 3), "bwd_data": (1, 5), "bwd_filter": (2, 2, 2)})
    split.load_state_dict(plain.state_dict())
    x = torch.randn(6, 4, 9, 9)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = plain(xa), split(xb)
    _close(yb.detach(), ya.detach(), 1e-6)
    (ya * ya).sum().backward()
    (yb * yb).sum().backward()
    ya, yb = ya.detach(), yb.detach()
    for got, want in ((xb.grad, xa.grad), (split.weight.grad, plain.weight.grad), (split.bias.grad, plain.bias.grad)):
        _close(got, want, 1e-6)


def _split_plan(trace):
    """Every conv kernel of the tiny net split in two micro-batches of one sample."""
    out = []
    for op in trace.ops:
        if op.conv is None:
            continue
        for kind in op.conv.kernels:
            weight = op.conv.k * op.conv.c // op.conv.groups * op.conv.r * op.conv.s * 4
            out.append(MicroBatch(op=op.index, kernel=kind, sizes=(1, 1), algos=("pytorch",) * 2, time_s=1e-4,
                                  workspace_bytes=0, accumulator_bytes=accumulator_bytes(kind, weight, 4)))
    return Plan(microbatches=tuple(out), trace_digest=trace.digest)


def test_the_executor_runs_planned_splits_exactly_and_holds_what_the_plan_charges():
    w = tiny_workload()
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer)
    plan = _split_plan(trace)
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, plan=plan, trace=trace, measure=True)
    plain = tiny_workload()
    for model_step, make in ((step, w.make_inputs), (plain.step, plain.make_inputs)):
        torch.manual_seed(5)  # the same dropout masks
        for seed in range(3):
            model_step(*make(2, seed=100 + seed))
    stats = step.stats()
    step.close()
    assert stats["diverged_steps"] == 0 and stats["unresolved"] == 0
    assert max(state_diffs(w.model, plain.model).values()) <= 1e-5
    for s in stats["steps_measured"]:
        assert s["measured_peak_bytes"] == stats["simulated_peak_bytes"]
