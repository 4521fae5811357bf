"""Measured op durations on the CPU: per op, the median over a few timed iterations.

The recorder's own bookkeeping is far heavier than plain training, so the CPU times come
from separate iterations under a light dispatch mode that only reads the clock. An op's
duration is the wall time from the end of the op before it to its own end: on the CPU every
op is synchronous, and the host work that leads to it (module code, autograd, dispatch) is
part of what the step pays for it, so the durations add up to the step's wall time.
An iteration whose op sequence differs from the traced one is discarded.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode

from .opinfo import counts_as_op, is_recorded

log = logging.getLogger(__name__)


class _OpClock(TorchDispatchMode):
    """Records (op name, seconds since the previous op ended) for every op the tracer records."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []
        self.seconds: list[float] = []
        self._last = time.perf_counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if is_recorded(func) and counts_as_op(func, args, kwargs, out):
            now = time.perf_counter()
            self.names.append(str(func))
            self.seconds.append(now - self._last)
            self._last = now
        return out


def time_ops(step_fn: Callable, inputs: tuple, names: list[str], repeats: int) -> list[float] | None:
    """Median seconds per op over `repeats` iterations of `step_fn(*inputs)` on the CPU.

    Args:
        names: the traced op names, in order: iterations that run other ops are discarded.
        repeats: timed iterations.
    Returns:
        One duration per op, or None when no iteration ran the traced ops.
    """
    runs = []
    for _ in range(repeats):
        clock = _OpClock()
        with clock:
            step_fn(*inputs)
        if clock.names == names:
            runs.append(clock.seconds)
        else:
            log.warning("a timed iteration ran %d ops where the trace has %d: discarded", len(clock.names),
                        len(names))
    if not runs:
        return None
    return [statistics.median(column) for column in zip(*runs)]
