"""Convolutions in traces and plans: the tracer records every 2-D convolution's geometry and
kernels (the same with fake and real tensors), traces keep them on disk, and a plan's conv
decisions are checked against them and charged by the simulator and the validator."""

import dataclasses

import pytest
import torch

from memplan.errors import TraceFormatError
from memplan.model import MicroBatch, Plan, PlanMismatchError, check_plan
from memplan.problem import Problem
from memplan.sim.stage import simulate
from memplan.sim.validate import BAD_CONV_DECISION, OVER_BUDGET, validate
from memplan.tracing.io import parse_trace, read_trace, write_trace
from memplan.tracing.tracer import trace as trace_step
from memplan.workflows.workloads import trace_workload

MIB = 2**20


class Net(torch.nn.Module):
    """Strided, dilated, grouped and 1x1 convolutions (the first one sees no input gradient)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, (3, 5), stride=(2, 1), padding=(1, 2))
        self.b = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4, bias=False)
        self.c = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.c(torch.relu(self.b(self.a(x)))).sum()


def _trace(fake: bool):
    torch.manual_seed(0)
    if fake:
        from memplan.tracing.fake import new_fake_mode

        with new_fake_mode():
            net, x = Net(), torch.randn(2, 3, 12, 10)
    else:
        net, x = Net(), torch.randn(2, 3, 12, 10)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(x):
        opt.zero_grad()
        net(x).backward()
        opt.step()

    return trace_step(step, x, fake=fake, model=net, optimizer=opt)


@pytest.fixture(scope="module")
def traced():
    return _trace(fake=True)


def test_every_convolution_op_records_its_geometry_and_kernels(traced):
    convs = [(op.module, op.conv) for op in traced.ops if op.conv is not None]
    assert [(m, c.kernels) for m, c in convs] == [
        ("a", ("fwd",)), ("b", ("fwd",)), ("c", ("fwd",)),
        ("c", ("bwd_data", "bwd_filter")), ("b", ("bwd_data", "bwd_filter")), ("a", ("bwd_filter",))]
    a = convs[0][1]
    assert (a.n, a.c, a.h, a.w, a.k, a.r, a.s, a.pad_h, a.pad_w, a.stride_h, a.stride_w) == (2, 3, 12, 10, 8, 3, 5,
                                                                                               1, 2, 2, 1)
    assert (a.out_h, a.out_w) == (6, 10)
    b = convs[1][1]
    assert (b.groups, b.dil_h, b.pad_h, b.c, b.out_h) == (4, 2, 2, 8, 6)


def test_fake_and_real_traces_record_the_same_convolutions(traced):
    real = _trace(fake=False)
    assert [op.conv for op in real.ops] == [op.conv for op in traced.ops]
    assert real.digest == traced.digest


def test_traces_keep_convolutions_on_disk(traced, tmp_path):
    write_trace(traced, tmp_path / "t.jsonl")
    assert [op.conv for op in read_trace(tmp_path / "t.jsonl").ops] == [op.conv for op in traced.ops]
    text = (tmp_path / "t.jsonl").read_text().replace('"groups": 4', '"groups": "4"')
    with pytest.raises(TraceFormatError, match="conv"):
        parse_trace(text, "t.jsonl")


def test_zoo_models_expose_their_kernels():
    trace = trace_workload("resnet50", batch=2, input_size=64)
    forward = [op for op in trace.ops if op.conv is not None and op.conv.kernels == ("fwd",)]
    assert len(forward) == 53


def _decide(trace, op, kernels, sizes=None, workspace=0, time_s=1e-3):
    n = trace.ops[op].conv.n
    sizes = sizes or (n,)
    return tuple(MicroBatch(op=op, kernel=k, sizes=sizes, algos=("implicit_gemm",) * len(sizes), time_s=time_s,
                            workspace_bytes=workspace) for k in kernels)


def _conv_ops(trace):
    return [op.index for op in trace.ops if op.conv is not None]


def test_plans_with_conv_decisions_are_checked_against_the_trace(traced):
    fwd, bwd = _conv_ops(traced)[0], _conv_ops(traced)[3]
    check_plan(traced, Plan(microbatches=_decide(traced, fwd, ["fwd"], sizes=(1, 1))))
    relu = next(op.index for op in traced.ops if op.conv is None)
    bad = {"not a convolution": MicroBatch(op=relu, kernel="fwd", sizes=(2,), algos=("x",), time_s=0.0,
                                           workspace_bytes=0),
           "runs fwd": _decide(traced, fwd, ["bwd_data"])[0],
           "do not sum": _decide(traced, fwd, ["fwd"], sizes=(1, 2))[0]}
    for message, decision in bad.items():
        with pytest.raises(PlanMismatchError, match=message):
            check_plan(traced, Plan(microbatches=(decision,)))
        assert [v.kind for v in validate(traced, Plan(microbatches=(decision,)))] == [BAD_CONV_DECISION]
    with pytest.raises(PlanMismatchError, match="decide each of its kernels once"):
        check_plan(traced, Plan(microbatches=_decide(traced, bwd, ["bwd_data"])))


def test_the_simulator_and_the_validator_charge_chosen_times_and_workspaces(traced):
    ops = _conv_ops(traced)
    decisions = _decide(traced, ops[0], ["fwd"], time_s=0.5, workspace=64 * MIB) + \
        _decide(traced, ops[3], ["bwd_data", "bwd_filter"], time_s=0.25, workspace=32 * MIB)
    device = dataclasses.replace(Problem.of(traced).cost, priced_host=False)  # the device's time (no executor)
    plain, planned = simulate(traced, cost=device), simulate(traced, Plan(microbatches=decisions), cost=device)
    assert planned.time_s == pytest.approx(plain.time_s - plain_time(traced, ops[0]) - plain_time(traced, ops[3]) + 1.0)
    assert simulate(traced, Plan(microbatches=decisions)).level == "interpreted"  # op by op, its host priced
    load = traced.load
    assert planned.peak_load_bytes == max(traced.peak_load_bytes, int(load[ops[0]]) + 64 * MIB,
                                          int(load[ops[3]]) + 32 * MIB)
    assert planned.baseline_time_s == plain.baseline_time_s
    tight = Plan(microbatches=decisions, budget_bytes=traced.peak_load_bytes)
    assert [v.kind for v in validate(traced, tight)] == [OVER_BUDGET]


def plain_time(trace, op):
    return float(Problem.of(trace).cost.durations[op])
