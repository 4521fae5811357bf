"""Shared helpers for the executor tests: workloads, hand-made plans, an independent oracle."""

from __future__ import annotations

import torch

from memplan.plan.model import Decision, Plan
from memplan.trace.model import Trace

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


def saved_activations(trace: Trace) -> list[int]:
    """Storages autograd saved that live from the forward into the backward pass."""
    packed = dict.fromkeys(trace.meta["pack_order"])
    out = []
    for sid in packed:
        s = trace.storages[sid]
        phases = {trace.ops[i].phase for i in trace.accesses[sid]}
        if s.kind in ("activation", "temp") and not s.persistent and {"forward", "backward"} <= phases:
            out.append(sid)
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
        decisions.append(Decision(storage=sid, action="swap", out_after=out, back_before=back,
                                  trigger=max(out + 1, back - lead), sync=sync, compress_ratio=compress))
    return Plan(decisions=tuple(decisions), planner="test-swap", trace_digest=trace.digest)


def recompute_plan(trace: Trace, every: int = 1) -> Plan:
    """Recompute every `every`-th saved activation that has a producer in the forward pass."""
    decisions = []
    for sid in saved_activations(trace)[::every]:
        if trace.recomputable(sid):
            out, back = gap(trace, sid)
            decisions.append(Decision(storage=sid, action="recompute", out_after=out, back_before=back))
    return Plan(decisions=tuple(decisions), planner="test-recompute", trace_digest=trace.digest)
