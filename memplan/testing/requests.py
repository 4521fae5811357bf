"""The allocation requests of a real planned step on the CPU, replayed through the host pool.

PyTorch's CPU allocator cannot be replaced, but `torch.profiler` (with `profile_memory`)
records every allocation and free it makes, with the time. The interpreted runner's op clock is
swapped for one that remembers when each op began, so every request gets the op it was made
at -- what the CUDA allocator reads from the clock directly. Replaying that stream through the
host backend of the replay allocator shows, without a GPU, whether a real step's requests find
the plan's slots (`memplan.pool.requests`) as they would on one.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import torch

from ..pool.replay_allocator import ReplayAllocator, ReplayPlan


@dataclass(frozen=True, kw_only=True)
class Request:
    """One allocation (size > 0) or free (size < 0) of the CPU allocator during a step."""

    op: int  # the trace op the runner was at (-1 before the first)
    address: int  # the CPU allocator's address
    size: int  # bytes; negative for a free


class _RecordingClock:
    """Stands in for the allocator's op clock: remembers (wall time, op) at every change."""

    def __init__(self):
        self.marks: list[tuple[int, int]] = []

    @property
    def value(self) -> int:
        return self.marks[-1][1] if self.marks else -1

    @value.setter
    def value(self, op: int) -> None:
        self.marks.append((time.time_ns(), op))


def record_cpu_requests(step, inputs: tuple) -> list[Request]:
    """Run one call of an OptimizedStep on the CPU and return its allocator's requests, in order.

    Args:
        step: a `memplan.optimize` step on the CPU.
        inputs: the call's inputs.
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    runner = step.runtime.runner
    clock, saved, idle = _RecordingClock(), runner.op_clock, runner.idle
    runner.op_clock, runner.idle = clock, False  # the runner counts every op, as with a pool attached
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step(*inputs)
    finally:
        runner.op_clock, runner.idle = saved, idle
    events, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        e = todo.pop()
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == torch.device("cpu").type:
            events.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size))
        todo.extend(e.children)
    times = [t for t, _ in clock.marks]
    out = []
    for t, address, size in sorted(events):
        k = bisect.bisect_right(times, t) - 1
        out.append(Request(op=clock.marks[k][1] if k >= 0 else -1, address=address, size=size))
    return out


def replay_requests(allocator: ReplayAllocator, plan: ReplayPlan, requests: list[Request], check=None) -> dict:
    """Replay `requests` as one iteration of `plan` on a host allocator; returns its counters
    for the iteration. `check(address, size, alive)` sees every block handed out and freed."""
    allocator.configure(plan)
    allocator.begin_iteration(0)
    held = {}
    for r in requests:
        allocator.op_clock.value = r.op
        if r.size > 0:
            held[r.address] = (allocator.malloc(r.size), r.size)
            if check:
                check(*held[r.address], True)
        elif r.address in held:  # frees of what existed before the step are not the pool's
            address, size = held.pop(r.address)
            if check:
                check(address, size, False)
            allocator.free(address, size)
    allocator.end_iteration()
    for address, size in held.values():  # what outlives the step (gradients, the loss)
        allocator.free(address, size)
    return allocator.stats()
