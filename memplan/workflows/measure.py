"""Measure training steps: each step's time and peak memory, by the independent meter.

On the CPU the meter is a dispatch-level count of live storages (memplan.exec.meter); on a
GPU, the CUDA allocator's own counters.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves

from ..exec.meter import AllocatorMeter, MemoryMeter
from ..tracing.optimes import CLOCKS
from .memory_cap import over_cap


def measured_step_s(records: list[dict], timed: list[float]) -> float:
    """The median of the unmetered `timed` steps; without them, the median metered step
    after the first (warm-up) one, less the meter's own bookkeeping."""
    if timed:
        return statistics.median(timed)
    times = [r["time_s"] - (r.get("meter_s") or 0.0) for r in records]
    return statistics.median(times[1:] if len(times) > 1 else times)


def measure_steps(step: Callable, make_inputs: Callable[[int], tuple], steps: int, model, optimizer,
                  seed: int, host=(), compiled: bool = False, memory_cap: int | None = None) -> list[dict]:
    """Run `steps` steps, each under its own memory meter; inputs are made right before each.

    On a GPU the meter is the allocator's counters and its dispatch mode is not entered:
    torch.compile does not compile under a Python dispatch mode.

    Args:
        host: buffers that are host memory beside the device role (the executor's slab): not counted.
        compiled: the step runs torch.compile'd code: on the CPU it is measured by the
            allocator's own stream (`AllocatorMeter`), which lets it compile and sees inductor's buffers.
        memory_cap: on the CPU, a step measuring more fails (memory_cap.over_cap).
    Returns:
        Per step: "time_s" (wall), "meter_s" (of it, the meter's own bookkeeping: CPU only),
        "measured_peak_bytes", "measured_peak_reserved_bytes" (CUDA only).
    """
    torch.manual_seed(seed)
    records, meter = [], None
    for i in range(steps):
        x = make_inputs(i)
        if meter is None:
            device = _device(model, x)
            meter = MemoryMeter(device)
            meter.exclude(host)
        owned = (list(model.parameters()), list(model.buffers())) if model is not None else ()
        meter.track((owned, _state(optimizer), x))
        _sync(device)
        meter.reset_peak()
        active = meter if meter.cuda or not compiled else AllocatorMeter(meter.live_bytes())
        started = time.perf_counter()
        with contextlib.nullcontext() if meter.cuda else active, numbered(i):  # CUDA: the allocator's counters
            step(*x)
        _sync(device)
        wall = time.perf_counter() - started
        records.append({"step": i, "time_s": wall, "meter_s": active.own_s, **active.peak(),
                        "meter": "cuda" if meter.cuda else "allocator" if compiled else "dispatch"})
        del x
        over_cap(records[-1]["measured_peak_bytes"], memory_cap, device)
    if meter is not None:
        meter.close()
    return records


def time_steps(step: Callable, make_inputs: Callable[[int], tuple], indices: range, model, seed: int,
               clock: str = "wall") -> list[float]:
    """Seconds of steps `indices` (inputs made right before each), without a meter, on `clock`
    ("wall", or "cpu": this thread's CPU time).

    The RNG is seeded as `measure_steps` leaves it only when no metered step ran before.
    """
    if not indices:
        return []
    if indices.start == 0:
        torch.manual_seed(seed)
    times, now = [], CLOCKS[clock]
    for i in indices:
        x = make_inputs(i)
        device = _device(model, x)
        _sync(device)
        started = now()
        with numbered(i):
            step(*x)
        _sync(device)
        times.append(now() - started)
        del x
    return times


@contextlib.contextmanager
def numbered(i: int):
    """An exception out of step `i` carries its number (`memplan_step`): a failing run says which step
    it came from (a GPU's errors surface at the step that synchronizes)."""
    try:
        yield
    except BaseException as exc:
        if getattr(exc, "memplan_step", None) is None:
            exc.memplan_step = i
        raise


def _device(model, inputs) -> torch.device:
    """Where the training runs: the model's parameters, else the first input tensor."""
    tensors = list(model.parameters()) if model is not None else []
    tensors += [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    return tensors[0].device if tensors else torch.device("cpu")


def _state(optimizer) -> list:
    return [v for st in getattr(optimizer, "state", {}).values() for v in st.values() if isinstance(v, torch.Tensor)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def state_differences(model: torch.nn.Module, reference: torch.nn.Module) -> dict:
    """{"max_param_diff": .., "max_buffer_diff": ..}: largest absolute differences."""
    def worst(pairs) -> float:
        return max((float((a.detach().double() - b.detach().double()).abs().max()) for a, b in pairs
                    if a.numel()), default=0.0)

    return {"max_param_diff": worst(zip(model.parameters(), reference.parameters())),
            "max_buffer_diff": worst(zip(model.buffers(), reference.buffers()))}
