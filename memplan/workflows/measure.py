"""Measure training steps: each step's time and peak memory, by the independent meter.

On the CPU the meter is a dispatch-level count of live storages (memplan.exec.meter); on a
GPU, the CUDA allocator's own counters.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Metering:
    """How `measure_steps` meters its steps."""

    host: tuple = ()  # buffers that are host memory beside the device role (the executor's slab): not counted
    compiled: bool = False  # the steps run torch.compile'd code: on the CPU the allocator's own stream meters
    # them (`AllocatorMeter`), which lets them compile and sees inductor's buffers
    memory_cap: int | None = None  # on the CPU, a step measuring more fails (memory_cap.over_cap)


def measure_steps(step: Callable, make_inputs: Callable[[int], tuple], steps: int, model, optimizer,
                  seed: int, metering: Metering = Metering()) -> list[dict]:
    """Run `steps` steps, each under its own memory meter; inputs are made right before each.

    On a GPU the meter is the allocator's counters and its dispatch mode is not entered:
    torch.compile does not compile under a Python dispatch mode. A step that meters itself
    (`meters_itself` true: a compiled memplan step keeping its budget, memplan.workflows.compiled)
    runs without a meter here, and its own record is taken.

    Returns:
        Per step: "time_s" (wall), "meter_s" (of it, the meter's own bookkeeping: CPU only),
        "measured_peak_bytes", "measured_peak_reserved_bytes" (CUDA only).
    """
    torch.manual_seed(seed)
    records, meter = [], None
    for i in range(steps):
        x = make_inputs(i)
        if meter is None:
            meter = StepMeter(_device(model, x), host=metering.host, compiled=metering.compiled)
        with numbered(i):
            if getattr(step, "meters_itself", False):
                step(*x)
                record = dict(step.steps[-1])
            else:
                record = meter.measure(step, x, model, optimizer)[1]
        records.append({"step": i, **record})
        del x
        over_cap(records[-1]["measured_peak_bytes"], metering.memory_cap, meter.device)
    if meter is not None:
        meter.close()
    return records


class StepMeter:
    """Meters whole steps on one device: each step's wall time and peak memory (memplan.exec.meter).

    Args:
        device: where the steps train.
        host: buffers that are host memory beside the device role: not counted.
        compiled: the steps run torch.compile'd code (on the CPU: the allocator's own stream).
    """

    def __init__(self, device: torch.device, host=(), compiled: bool = False):
        self.device = device
        self.compiled = compiled
        self._meter = MemoryMeter(device)
        self._meter.exclude(host)

    def measure(self, step: Callable, inputs: tuple, model, optimizer):
        """(what `step(*inputs)` returned, its record: "time_s", "meter_s", the peaks, "meter")."""
        with self.metering(inputs, model, optimizer) as record:
            out = step(*inputs)
        return out, record

    @contextlib.contextmanager
    def metering(self, inputs: tuple, model, optimizer):
        """Meter the block, a step on `inputs`; the record it yields is filled when the block ends."""
        meter, record = self._meter, {}
        meter.track((owned_tensors(model), _state(optimizer), inputs))
        _sync(self.device)
        meter.reset_peak()
        active = meter if meter.cuda or not self.compiled else AllocatorMeter(meter)
        started = time.perf_counter()
        with contextlib.nullcontext() if meter.cuda else active:  # CUDA: the allocator's counters
            yield record
        _sync(self.device)
        record.update({"time_s": time.perf_counter() - started, "meter_s": active.own_s, **active.peak(),
                       "meter": "cuda" if meter.cuda else "allocator" if self.compiled else "dispatch"})

    def close(self) -> None:
        """Drop what it tracks."""
        self._meter.close()


def time_steps(step: Callable, make_inputs: Callable[[int], tuple], indices: range, model, seed: int) -> dict:
    """Seconds of steps `indices` (inputs made right before each), without a meter, on every clock
    of `CLOCKS` at once: {"wall": [...], "cpu": [...]} ("cpu": this thread's CPU time). Both are read
    around the same step, so a benchmark sets them side by side without running twice.

    The RNG is seeded as `measure_steps` leaves it only when no metered step ran before.
    """
    times: dict[str, list[float]] = {clock: [] for clock in CLOCKS}
    if not indices:
        return times
    if indices.start == 0:
        torch.manual_seed(seed)
    for i in indices:
        x = make_inputs(i)
        device = _device(model, x)
        _sync(device)
        started = {clock: now() for clock, now in CLOCKS.items()}
        with numbered(i):
            step(*x)
        _sync(device)
        for clock, now in CLOCKS.items():
            times[clock].append(now() - started[clock])
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


def owned_tensors(model) -> list:
    """What a step starts from beside the optimizer's state and its inputs: the model's parameters,
    buffers and the gradients the last step left (which a step's zero_grad may drop)."""
    if model is None:
        return []
    params = list(model.parameters())
    return params + list(model.buffers()) + [p.grad for p in params if p.grad is not None]


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
