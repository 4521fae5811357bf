"""Measure the host's work per op and per executor step (the profile's host costs).

A tiny model's training step has kernels so short that its time is the host's: Python, autograd,
dispatch and launch. Timed plainly, under saved-tensor hooks that do what the hooked executor's
do with nothing to act on (count the pack, look its record up), and under a dispatch mode that
only calls each op, it gives per op and per saved tensor what the simulator charges
(memplan.sim.simulate, "host"). Each figure is the median of several repeats after a warm-up.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..tracing.optimes import CLOCKS

LAYERS, WIDTH, BATCH = 48, 16, 4  # 48 x (Linear(16) + ReLU) at batch 4: microseconds of work per op
REPEATS = 9
WARMUP = 3
# A replayed op costs the interpreted executor about ten times what its dispatch mode costs per op
# (benchmarks/results/exec_overhead.md on this project's CPU: 55.8 us per replayed op against 5.2 us
# per op in an empty mode). Actions and region runs are measured with the executor itself
# (memplan.workflows.calibrate_executor).
REPLAY_PER_MODE_OP = 10.7


@dataclass(frozen=True, kw_only=True)
class HostCosts:
    """Seconds of host work, as `DeviceProfile` keeps them."""

    host_op_s: float  # per op of plain eager training
    hook_s: float  # per saved-tensor pack or unpack
    mode_op_s: float  # per op through a dispatch mode
    replay_op_s: float  # per replayed op


def measure_host(device: str = "cpu", launch_s: float = 0.0, repeats: int = REPEATS) -> HostCosts:
    """The host costs on `device` ("cpu" or "cuda").

    Args:
        launch_s: what the roofline already charges every op (left out of host_op_s on the CPU,
            where an op's launch is the host's own work).
    """
    model = torch.nn.Sequential(*[m for _ in range(LAYERS) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())])
    model.to(device)
    x = torch.randn(BATCH, WIDTH, device=device)

    def step():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    ops, packs = _count(step)
    plain = _time(step, device, repeats)
    hooked = _time(step, device, repeats, lambda: torch.autograd.graph.saved_tensors_hooks(*_counting_hooks()))
    moded = _time(step, device, repeats, _EmptyMode)
    hook_s = max(0.0, hooked - plain) / (2 * packs)
    mode_op_s = max(0.0, moded - plain) / ops
    own_launch = launch_s if device == "cpu" else 0.0
    return HostCosts(host_op_s=max(0.0, plain / ops - own_launch), hook_s=hook_s, mode_op_s=mode_op_s,
                     replay_op_s=REPLAY_PER_MODE_OP * mode_op_s)


class _EmptyMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _counting_hooks():
    """Hooks with the hooked executor's bookkeeping and nothing to act on."""
    records = {}
    count = [0]

    def pack(t):
        n = count[0]
        count[0] += 1
        records.get(n)
        t.untyped_storage().nbytes()
        return n, t

    def unpack(packed):
        records.get(packed[0])
        return packed[1]

    return pack, unpack


def _count(step) -> tuple[int, int]:
    """Ops and saved-tensor packs of one step."""
    packs = [0]

    def pack(t):
        packs[0] += 1
        return t

    with _Counter() as counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return counter.ops, packs[0]


def host_clock(device: str):
    """The clock a host cost is measured on: on the CPU this thread's CPU time (the step runs on
    it, and a shared host's other work does not inflate it), on a GPU wall time."""
    return CLOCKS["cpu" if device == "cpu" else "wall"]


def _time(step, device: str, repeats: int, context=None) -> float:
    """Median seconds of `step()` on `host_clock`, inside a fresh `context()` when given."""
    clock = host_clock(device)
    times = []
    for i in range(WARMUP + repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        started = clock()
        if context is None:
            step()
        else:
            with context():
                step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= WARMUP:
            times.append(clock() - started)
    return statistics.median(times)
