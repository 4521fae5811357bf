"""Shared helpers for the executor tests: workloads, hand-made plans, an independent oracle.

Imported as tests.exec.helpers by the tests that run planned steps; it holds no tests itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from memplan.model import Decision, Plan
from memplan.model import Trace

STEPS = 3
SMALL = {"vgg11-cifar": {}, "resnet18-cifar": {}, "hf:gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 2}}


def workload(name: str, batch: int = 2, seed: int = 0):
    """A fresh workload (same seed: same parameters and inputs)."""
    from memplan.zoo.registry import get_workload

    return get_workload(name, batch, seed=seed, **SMALL.get(name, {}))


def batches(w, k: int = STEPS) -> list[tuple]:
    """k input batches, the same for every workload built with the same seed."""
    return [w.make_inputs(w.batch, seed=100 + i) for i in range(k)]


def train_plain(w, inputs) -> list[torch.Tensor]:
    """The oracle: plain training steps, parameters after them."""
    for x in inputs:
        w.step(*x)
    return [p.detach().clone() for p in w.model.parameters()]


class TinyBlock(nn.Module):
    """conv-bn-relu_-conv-bn plus identity, relu_, dropout: in-place ops, BN buffers, RNG."""

    def __init__(self, channels: int, dropout: float):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(dropout)
        self.conv2, self.bn2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.drop(self.relu(self.bn2(self.conv2(out)) + x))


class TinyNet(nn.Module):
    """A three-block residual CNN small enough to train in milliseconds on CPU."""

    def __init__(self, channels: int = 4, classes: int = 3, dropout: float = 0.2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True))
        self.blocks = nn.Sequential(*(TinyBlock(channels, dropout) for _ in range(3)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


@dataclass
class TinyWorkload:
    """TinyNet with its optimizer, step and inputs (the zoo's Workload interface, in small)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable
    inputs: tuple
    batch: int

    def make_inputs(self, batch: int, seed: int) -> tuple:
        """Deterministic (images, labels) for `seed`."""
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch, 3, 8, 8, generator=g), torch.randint(0, 3, (batch,), generator=g)


def train_step_of(model: nn.Module, opt: torch.optim.Optimizer) -> Callable:
    """The usual training step of `model`: gradients zeroed, cross-entropy, backward, optimizer step;
    it returns the loss."""

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def traced(w) -> Trace:
    """A real trace of workload `w`'s step (its state restored after)."""
    from memplan.workflows.optimize import trace_step

    return trace_step(w.step, w.inputs, w.model, w.optimizer)


def tiny_workload(batch: int = 2, seed: int = 0) -> TinyWorkload:
    """A fresh TinyNet workload: same seed, same parameters."""
    torch.manual_seed(seed)
    model = TinyNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    w = TinyWorkload(model=model, optimizer=opt, step=train_step_of(model, opt), inputs=(), batch=batch)
    w.inputs = w.make_inputs(batch, seed=99)
    return w


def state_diffs(a: nn.Module, b: nn.Module) -> dict[str, float]:
    """Largest relative difference per state_dict entry (parameters and buffers) of two models."""
    out = {}
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        x, y = x.detach().double(), y.detach().double()
        out[name] = float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)) if x.numel() else 0.0
    return out


def saved_activations(trace: Trace) -> list[int]:
    """Activations made in forward that backward reads (what autograd saved)."""
    out = []
    for s in trace.storages:
        phases = {trace.ops[i].phase for i in trace.accesses[s.id]}
        if s.kind == "activation" and {"forward", "backward"} <= phases:
            out.append(s.id)
    return out


def gap(trace: Trace, sid: int) -> tuple[int, int]:
    """(last forward access, first backward access) of a storage."""
    acc = trace.accesses[sid]
    return (max(i for i in acc if trace.ops[i].phase == "forward"),
            min(i for i in acc if trace.ops[i].phase == "backward"))


def swap_all_plan(trace: Trace, lead: int = 4, compress: float | None = None, sync: bool = False) -> Plan:
    """Swap every saved activation, prefetching `lead` ops before its use."""
    decisions = []
    for sid in saved_activations(trace):
        out, back = gap(trace, sid)
        if back - out > 1:
            decisions.append(Decision(storage=sid, action="swap", out_after=out, back_before=back,
                                      trigger=max(out + 1, back - lead), sync=sync, compress_ratio=compress))
    return Plan(decisions=tuple(decisions), planner="test-swap", trace_digest=trace.digest)


def carried_state_plan(trace: Trace, lead: int = 2) -> Plan:
    """Swap every optimizer state out after the step's last op (its copy carried over to the next step,
    memplan.sim.simulate) and back before its first access, prefetching `lead` ops before it."""
    last = len(trace.ops) - 1
    decisions = tuple(Decision(storage=s.id, action="swap", out_after=last, back_before=trace.accesses[s.id][0],
                               trigger=max(0, trace.accesses[s.id][0] - lead))
                      for s in trace.storages if s.kind == "optimizer_state" and trace.accesses[s.id])
    return Plan(decisions=decisions, planner="test-carried", trace_digest=trace.digest)


def recompute_plan(trace: Trace, every: int = 1) -> Plan:
    """Recompute every `every`-th saved activation that has a producer in the forward pass."""
    decisions = []
    for sid in saved_activations(trace)[::every]:
        out, back = gap(trace, sid)
        if trace.recomputable(sid) and back - out > 1:
            decisions.append(Decision(storage=sid, action="recompute", out_after=out, back_before=back))
    return Plan(decisions=tuple(decisions), planner="test-recompute", trace_digest=trace.digest)


class ReadsOnlyPresentStorages(TorchDispatchMode):
    """Oracle: fails the step if any op touches a tensor whose storage is smaller than the tensor."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for t in tree_leaves((args, kwargs or {})):
            if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
                extent = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
                assert t.untyped_storage().nbytes() >= extent * t.element_size(), f"{func} reads an absent storage"
        self.ops += 1
        return func(*args, **(kwargs or {}))


def plain_step_meter_peak(w) -> int:
    """The meter's peak over one plain step of workload `w` from the steady state (one step
    first, as traced), the storages that exist before the step tracked."""
    from memplan.exec.meter import MemoryMeter

    w.step(*w.inputs)
    meter = MemoryMeter("cpu")
    meter.track((list(w.model.parameters()), list(w.model.buffers()),
                 [v for s in w.optimizer.state.values() for v in s.values()], w.inputs))
    meter.reset_peak()
    with meter:
        w.step(*w.inputs)
    return meter.peak()["measured_peak_bytes"]
