"""The device memory a run may use: a cap that emulates a smaller GPU, and the allocator set up
so that what a plan keeps in allocated bytes it also keeps in reserved ones.

- `prepare_device`: on a GPU the cap is the allocator's own limit
  (`torch.cuda.set_per_process_memory_fraction`: past it the caching allocator frees its
  cache and retries, then raises OutOfMemoryError). Which allocator serves the run is
  memplan.workflows.allocators' choice (by default expandable segments, which grow and
  shrink in pages and leave little unused in reserved memory, where fixed segments
  fragment: reserved was 1.3-2.5x the budget on an H200 without them).
- `release_cache`: cached blocks from building the model are given back before training.
- `hold_reserved`: once a plan keeps its budget (memplan.workflows.keep_budget, which judges a
  step's reserved bytes against the budget + RESERVED_TOLERANCE too), the allocator may hold no
  more than the budget + RESERVED_TOLERANCE (or the cap, if smaller; never less than the step
  that kept the budget reserved): past that it frees its cache before it grows. On an H200 a capuchin plan at 3 GiB held 3.15 GiB reserved
  this way, where under a 4 GiB cap the cache grew to 3.17-3.62 GiB (benchmarks/gpu_budget.py).
- `refuse_what_cannot_fit`: a run whose plan simulates above the cap stops before training,
  naming planners and a budget that would fit.
- `over_cap`: on the CPU nothing limits the allocator; a step that measures more than the
  cap fails as running out of memory would.
"""

from __future__ import annotations

import logging

import torch

from ..errors import InfeasibleBudgetError, MemplanError
from ..planners.base import plan as make_plan
from ..units import format_bytes

log = logging.getLogger(__name__)

RESERVED_TOLERANCE = 0.05  # reserved bytes may exceed the budget by this share (allocator segments)
SUGGESTED = ("capuchin", "dtr", "sqrt-n", "autoswap:doa")  # fast planners tried for the error's advice
SUGGESTED_SHARE = 0.9  # the budget suggested, as a share of the cap (room for what the trace does not see)


def prepare_device(device: str, memory_cap: int | None, pooled: bool = False) -> None:
    """Put `memory_cap` in force on `device` (none: the whole GPU; nothing to do on the CPU).

    Raises:
        MemplanError: a cap larger than the GPU, or a cap for the pool allocator (which
            serves the plan's own layout and has no such limit).
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return
    if pooled:
        if memory_cap is not None:
            raise MemplanError("--memory-cap limits PyTorch's CUDA allocator; --allocator pool replaces it "
                               "(its footprint is the plan's pool, reported per step)")
        return
    total = torch.cuda.get_device_properties(dev).total_memory
    if memory_cap is not None and memory_cap > total:
        raise MemplanError(f"--memory-cap {format_bytes(memory_cap)} is more than the GPU's {format_bytes(total)}")
    torch.cuda.set_per_process_memory_fraction(1.0 if memory_cap is None else memory_cap / total, _index(dev))


def lift_cap(device: str) -> None:
    """The whole GPU again (after a capped run in a process that goes on)."""
    if torch.device(device).type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, _index(torch.device(device)))


def _index(device: torch.device) -> int:
    """The CUDA device's index (the allocator's limit is set per device: "cuda" alone is the current one)."""
    return torch.cuda.current_device() if device.index is None else device.index


def hold_reserved(device, budget_bytes: int, memory_cap: int | None = None, reserved_bytes: int = 0) -> None:
    """Limit the allocator to the budget + RESERVED_TOLERANCE, or to `reserved_bytes` (what the step
    that kept the budget reserved) if more, or to `memory_cap` if smaller, from now on, its cache
    emptied first (between steps; nothing to do on the CPU). Never below what that step needed: a
    limit under it would turn a plan that fits into an out-of-memory error."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return
    limit = max(int(budget_bytes * (1 + RESERVED_TOLERANCE)), reserved_bytes)
    limit = limit if memory_cap is None else min(limit, memory_cap)
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(dev).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), _index(dev))


def release_cache(device: str) -> None:
    """Give the allocator's cached blocks back to the device (before the measured steps)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(torch.device(device))
        torch.cuda.empty_cache()


def refuse_what_cannot_fit(step, memory_cap: int, what: str) -> None:
    """Stop before training when the plan simulates above `memory_cap` (the step is closed).

    Raises:
        MemplanError: one line with the simulated peak, the cap, and planners that fit it.
    """
    peak = step.predicted.peak_load_bytes or step.trace.peak_load_bytes
    if peak <= memory_cap:
        return
    step.close()
    budget = int(memory_cap * SUGGESTED_SHARE)
    fitting = [name for name in SUGGESTED if _plans(step.trace, budget, name)]
    advice = (f"plan it to fit, e.g. --budget {format_bytes(budget)} with --planner {' or '.join(fitting)}" if fitting
              else f"no planner of {', '.join(SUGGESTED)} fits {format_bytes(budget)}: try a smaller --batch")
    raise MemplanError(f"{what} needs {format_bytes(peak)} under planner {step.plan.planner or 'none'}, more than "
                       f"the memory cap of {format_bytes(memory_cap)}: {advice}")


def _plans(trace, budget: int, planner: str) -> bool:
    try:
        make_plan(trace, budget, planner=planner, simulate_result=False)
    except InfeasibleBudgetError:
        return False
    return True


def over_cap(measured_bytes: int, memory_cap: int | None, device: torch.device) -> None:
    """On the CPU, where nothing limits the allocator: a step over the cap fails as on a GPU.

    Raises:
        MemplanError: the step measured more than the cap.
    """
    if memory_cap is not None and device.type != "cuda" and measured_bytes > memory_cap:
        raise MemplanError(f"a step measured {format_bytes(measured_bytes)}, more than the memory cap of "
                           f"{format_bytes(memory_cap)} (on a GPU with that much memory it would have run out)")
