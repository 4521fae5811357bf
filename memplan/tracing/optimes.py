"""Measured op durations on the CPU: per op, the least over a few timed iterations.

The recorder's own bookkeeping is far heavier than plain training, so the CPU times come
from separate iterations under a light dispatch mode that only reads the clock. An op's
duration is the wall time from the end of the op before it to its own end: on the CPU every
op is synchronous, and the host work that leads to it (module code, autograd, dispatch) is
part of what the step pays for it, so the durations add up to the step's wall time (less the
timing mode's own bookkeeping, which is measured and left out).
An iteration whose op sequence differs from the traced one is discarded. Each op keeps its
least time over the iterations: other work on a shared host only ever adds time, and a burst
of it during one iteration would otherwise raise every op of that iteration (seen here: the
median of 3 doubled by one burst). The timing mode itself costs each op an entry into Python
that plain training does not pay: the durations are brought back to the time of plain iterations
measured beside them (`_as_plain`).

Two clocks: "wall" (perf_counter), and "cpu", the calling thread's CPU time (thread_time),
which a shared host's other work does not inflate (a descheduled thread's clock stops); it
leaves out what the thread waits for, so it suits steps that wait for nothing (a CPU step
on one thread) or a comparison where both sides use it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .opinfo import counts_as_op, is_recorded

log = logging.getLogger(__name__)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
MIN_SHARE = 0.1  # of an op's timed duration that it keeps when the timing mode's entry is taken off


class _OpClock(TorchDispatchMode):
    """Records (op name, seconds since the previous op ended) for every op the tracer records."""

    def __init__(self, clock: str = "wall"):
        super().__init__()
        self.names: list[str] = []
        self.seconds: list[float] = []
        self._now = CLOCKS[clock]
        self._last = self._now()
        self._own = 0.0  # this mode's bookkeeping since the last recorded op: not the step's time

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        end = self._now()
        if is_recorded(func) and counts_as_op(func, args, kwargs, out):
            self.names.append(str(func))
            self.seconds.append(end - self._last - self._own)
            self._last, self._own = end, 0.0
        self._own += self._now() - end
        return out


def time_ops(step_fn: Callable, inputs: tuple, names: list[str], repeats: int,
             clock: str = "wall") -> list[float] | None:
    """Least seconds per op over `repeats` iterations of `step_fn(*inputs)` on the CPU.

    Args:
        names: the traced op names, in order: iterations that run other ops are discarded.
        repeats: timed iterations.
        clock: "wall" or "cpu" (see the module doc).
    Returns:
        One duration per op, or None when no iteration ran the traced ops.
    """
    runs = []
    for _ in range(repeats):
        timer = _OpClock(clock)
        with timer, torch.autograd.graph.saved_tensors_hooks(_same, _same):  # the trace's ops (tracer.py)
            step_fn(*inputs)
        if timer.names == names:
            runs.append(timer.seconds)
        else:
            log.warning("a timed iteration ran %d ops where the trace has %d: discarded", len(timer.names),
                        len(names))
    if not runs:
        return None
    return _as_plain([min(column) for column in zip(*runs)], _plain_s(step_fn, inputs, repeats, clock))


def _plain_s(step_fn: Callable, inputs: tuple, repeats: int, clock: str) -> float:
    """The least time of `repeats` plain iterations (no mode, no hooks)."""
    now, best = CLOCKS[clock], float("inf")
    for _ in range(repeats):
        started = now()
        step_fn(*inputs)
        best = min(best, now() - started)
    return best


def _as_plain(durations: list[float], plain_s: float) -> list[float]:
    """Op times that add up to the plain step's: the timing mode costs every op the same entry into
    Python, which plain training does not pay (several microseconds, as long as a small op's kernel):
    it is taken off each op (leaving at least MIN_SHARE of its timed duration: no op is free), and
    what is left scaled to the plain step."""
    excess = (sum(durations) - plain_s) / len(durations) if durations else 0.0
    if excess <= 0:
        return durations
    less = [max(d - excess, MIN_SHARE * d) for d in durations]
    total = sum(less)
    return [d * plain_s / total for d in less] if total > 0 else less



def _same(t):
    return t
