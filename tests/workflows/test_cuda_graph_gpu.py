"""The planned step captured as a CUDA graph on a real GPU (issue 35; skipped without CUDA, run by
`pytest -m gpu`). Oracles: plain eager training of the same model from the same seed on the same
device (bit-identical parameters after N steps: the graph replays what the eager steps compute,
dropout masks included) and the allocator's own counters (the capture's peak within the budget + 2%)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memplan.errors import MemplanError
from memplan.exec.graphed import WARMUP_STEPS
from memplan.workflows.optimize import optimize, prime_optimizer_state, trace_step
from memplan.workflows.run import BUDGET_TOLERANCE

from tests.exec.helpers import swap_all_plan, train_step_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")]

STEPS = WARMUP_STEPS + 4  # warm-up steps, the capture (and its replay), then replays
WIDTH, BATCH = 1024, 2048  # activations of 8 MiB: they, not the allocator's rounding, are the memory


class Net(nn.Module):
    """Linear blocks with GELU and dropout: matmuls, saved activations, RNG."""

    def __init__(self, blocks: int = 6):
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(0.1))
                                      for _ in range(blocks)))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        return self.head(self.blocks(x))


def _workload(optimizer: str):
    torch.manual_seed(0)
    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if optimizer == "sgd" else \
        torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    return model, opt, train_step_of(model, opt)


def _batch(i: int) -> tuple:
    """Batch i, made right before its step (earlier ones would be memory the plan does not have)."""
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(BATCH, WIDTH, generator=g).cuda(), torch.randint(0, 10, (BATCH,), generator=g).cuda()


def _train(step) -> list[float]:
    torch.manual_seed(5)
    return [float(step(*_batch(i))) for i in range(STEPS)]


def _eager(optimizer: str) -> tuple[list, list]:
    """Plain eager training's losses and parameters after STEPS steps."""
    model, opt, step_fn = _workload(optimizer)
    losses = _train(step_fn)
    return losses, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("planner,budget", [("none", None), ("sqrt-n", "70%"), ("activation swaps", None)])
def test_a_captured_step_trains_as_eager_training_does(planner, budget, optimizer):
    losses, eager = _eager(optimizer)
    model, opt, step_fn = _workload(optimizer)
    how = {"planner": planner, "budget": budget}
    if planner == "activation swaps":  # every saved activation swapped: copy lanes and events in the capture
        prime_optimizer_state(opt)  # the trace is a steady-state step, as optimize's own
        trace = trace_step(step_fn, _batch(0), model, opt, fake=True)
        how = {"plan": swap_all_plan(trace), "trace": trace}
    step = optimize(step_fn, *_batch(0), model=model, optimizer=opt, cuda_graph="on", measure=True, **how)
    assert _train(step) == losses  # each read back after its replay
    for p, q in zip(model.parameters(), eager):
        assert torch.equal(p, q)
    stats = step.stats()
    graph = stats["cuda_graph"]
    assert graph["captured"] and graph["warmup_steps"] >= WARMUP_STEPS and graph["replays"] >= 1
    assert graph["warmup_steps"] + graph["replays"] <= STEPS
    if budget is not None:  # the caller's batch lives beside the static copy the graph reads
        held = graph["memory"]["capture"]["allocated_bytes"] - graph["schedule"]["static_input_bytes"]
        assert held <= stats["budget_bytes"] * (1 + BUDGET_TOLERANCE)
    step.close()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_plan_that_swaps_parameters_within_the_step_runs_eagerly(optimizer):
    """Issue 51: autoswap:doa swaps weights of this net from their forward to their backward (and the batch):
    a replay would read them where they were before the capture. Refused, the step trains eagerly."""
    losses, eager = _eager(optimizer)
    model, opt, step_fn = _workload(optimizer)
    step = optimize(step_fn, *_batch(0), model=model, optimizer=opt, planner="autoswap:doa", budget="70%",
                    cuda_graph="auto", measure=True)
    assert _train(step) == losses
    for p, q in zip(model.parameters(), eager):
        assert torch.equal(p, q)
    graph = step.stats()["cuda_graph"]
    assert not graph["captured"] and "within the step" in graph["reason"]
    step.close()


def test_a_changed_batch_runs_eagerly_with_auto_and_fails_with_on():
    model, opt, step_fn = _workload("sgd")
    step = optimize(step_fn, *_batch(0), model=model, optimizer=opt, planner="none", cuda_graph="auto")
    _train(step)
    assert step.stats()["cuda_graph"]["captured"]
    half = tuple(t[: BATCH // 2] for t in _batch(0))
    with pytest.warns(RuntimeWarning):
        step(*half)  # runs eagerly, without the plan
    assert step.stats()["cuda_graph"]["refused_calls"] == 1
    step.close()
    model, opt, step_fn = _workload("sgd")
    step = optimize(step_fn, *_batch(0), model=model, optimizer=opt, planner="none", cuda_graph="on")
    with pytest.raises(MemplanError, match="input 0: shape"):
        step(*half)
    step.close()


def test_a_step_that_reads_a_value_is_not_captured():
    model, opt, _ = _workload("sgd")

    def step_fn(x, y):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    step = optimize(step_fn, *_batch(0), model=model, optimizer=opt, planner="none", fake=False, cuda_graph="auto")
    for i in range(2):
        step(*_batch(i))
    graph = step.stats()["cuda_graph"]
    assert not graph["captured"] and "aten._local_scalar_dense" in graph["reason"]
    step.close()
