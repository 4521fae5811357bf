"""Measure training under a plan: step time and peak memory of every step, and the check run.

Used by `memplan run`. Every step's peak memory is measured by the independent meter
(memplan.exec.meter: a dispatch-level count of live storages on CPU, the CUDA allocator's
own counters on a GPU), for plans and PyTorch's own tools alike, beside the peak the
simulator predicted for the plan's step program and the budget.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves

from ..cost.profiles import get_profile
from ..errors import MemplanError, about_model
from ..exec.meter import AllocatorMeter, MemoryMeter
from ..exec.runtime import BUDGET_TOLERANCE  # a run is over its budget when it measures more than budget x (1 + this)
from ..tracing.optimes import CLOCKS
from ..planners.base import resolve_budget
from .allocators import allocator_report, attach_pool, choose_allocator, install_allocator
from .memory_cap import (RESERVED_TOLERANCE, hold_reserved, lift_cap, over_cap, prepare_device,
                         refuse_what_cannot_fit, release_cache)
from .optimize import optimize
from .step_trace import model_of
from .torch_tools import BASELINES, baseline_installed, check_baseline, is_compiled

log = logging.getLogger(__name__)

__all__ = ["BASELINES", "BUDGET_TOLERANCE", "check_baseline", "measure_steps", "measured_step_s", "run_workload",
           "state_differences"]

OP_TIME_REPEATS = 3  # timed iterations per op when a CPU run traces under a CPU profile


def measured_step_s(records: list[dict], timed: list[float]) -> float:
    """The median of the unmetered `timed` steps; without them, the median metered step
    after the first (warm-up) one, less the meter's own bookkeeping."""
    if timed:
        return statistics.median(timed)
    times = [r["time_s"] - (r.get("meter_s") or 0.0) for r in records]
    return statistics.median(times[1:] if len(times) > 1 else times)


def op_time_source(trace) -> str:
    """"measured" when every op of the trace has a measured duration, "roofline" when none does, else "mixed"."""
    known = sum(op.duration_s is not None for op in trace.ops)
    return "measured" if known == len(trace.ops) else "roofline" if known == 0 else "mixed"


def run_workload(name: str, batch: int, *, planner: str, budget, steps: int, device: str = "cpu",
                 profile: str = "h100", check: bool = False, seed: int = 0, config: dict | None = None,
                 baseline: str | None = None, trace=None, timed_steps: int = 0,
                 planner_params: dict | None = None, clock: str = "wall", memory_cap: int | None = None,
                 fake: bool | None = None, allocator: str = "auto") -> dict:
    """Train `steps` steps of zoo workload `name` under a plan (or a PyTorch baseline) and measure.

    Args:
        name, batch, config: the zoo workload.
        planner, budget, profile: how to plan ("none" when a baseline runs).
        steps: training steps measured (each step's inputs are made right before it).
        device: where to train.
        check: also train plainly from the same seed and report the largest differences.
        seed: workload, planner and training seed.
        baseline: one of `torch_tools.BASELINES` instead of a plan.
        planner_params: the planner's hyper-parameters (e.g. {"time_limit_s": 10}).
        clock: what the timed steps (and the op times of a trace made here) measure: "wall", or
            "cpu", the main thread's CPU time, which other work on a shared host does not inflate
            but which leaves out waiting (for copies, say).
        timed_steps: after the metered steps, this many more steps without the meter (whose
            per-op bookkeeping slows a CPU step), timed only: `measured_step_s` is their median.
        trace: a saved trace of this workload (a Trace or a path) to plan instead of tracing it.
            Without one, a CPU run under a CPU profile (`calibrate --device cpu`) traces with
            measured op times, so the simulator prices every op as this machine ran it.
        memory_cap: emulate a device with this many bytes: on a GPU the allocator may use no
            more (`torch.cuda.set_per_process_memory_fraction`); on the CPU a step measuring more
            fails as running out of memory would.
        fake: trace fake copies (None: on a GPU, where the unplanned step may not fit).
        allocator: the CUDA allocator (`allocators.ALLOCATORS`): "caching", "expandable"
            (segments), "pool" (the plan's layout: a fresh process's first CUDA work must be
            this run), or "auto": the pool for a plan with a layout on CUDA, else expandable
            segments (unless PYTORCH_CUDA_ALLOC_CONF configures the allocator).
    Returns:
        A JSON-ready dict: per step its time and measured peak (`steps`), the largest
        measured peak, the simulated peak of the plan's step program and the budget,
        whether the steps under the final plan stayed within the budget (`within_budget`: 2%
        over in allocated bytes, and on a GPU 5% over in reserved bytes), what keeping it
        took (`margin_bytes`, `replanned`, `final_plan_from_step`), `measured_step_s`
        (median step time after the first step, less the meter's own bookkeeping) beside
        `simulated_step_s` (the simulator's time for the plan), the executor's counters,
        `allocator` and `pool` (a pooled run's pool size and per-step counters,
        `memplan.exec.pooled`) and, with `check`, `max_param_diff` and `max_buffer_diff`
        against plain training.
    Raises:
        MemplanError: the unplanned step (planner none) cannot fit `memory_cap`; the error
            names planners that fit and their budget.
    """
    from ..zoo.registry import get_workload

    config = config or {}
    if clock not in CLOCKS:
        raise MemplanError(f"clock {clock!r}: expected one of {', '.join(CLOCKS)}")
    if baseline:
        check_baseline(baseline)
    mode = choose_allocator(allocator, planner=planner, device=device, baseline=baseline)
    install_allocator(mode)  # before the run's first CUDA allocation
    prepare_device(device, memory_cap, pooled=mode == "pool")
    if memory_cap is not None and budget is None and planner != "none" and not baseline:
        budget = int(memory_cap / (1 + RESERVED_TOLERANCE))  # what the cap leaves a plan, segments included
    w = get_workload(name, batch, device=device, seed=seed, **config)
    op_repeats = OP_TIME_REPEATS if trace is None and str(device) == "cpu" and get_profile(profile).kind == "cpu" else 0
    with about_model(name, config):  # a step that fails while traced is the model's
        step = optimize(w.step, *w.inputs, budget=None if baseline else budget,
                        planner="none" if baseline else planner, device=profile, model=w.model,
                        optimizer=w.optimizer, seed=seed, measure="first", trace=trace, time_repeats=op_repeats,
                        time_clock=clock, fake=fake, **(planner_params or {}))
    pool = attach_pool(step) if mode == "pool" else None
    if pool is not None:
        step.keeper = None  # a pooled run's layout is fixed: its requests are the plan's (memplan.exec.pooled)
    elif step.keeper is not None:  # once the plan keeps its budget, so does the allocator's cache
        step.on_settled = lambda: hold_reserved(device, step.keeper.budget_bytes, memory_cap)
    budget_bytes = resolve_budget(step.trace, budget)
    if memory_cap is not None and not baseline:
        refuse_what_cannot_fit(step, memory_cap, f"{name} at batch {batch}")
    fraction = budget_bytes / max(step.trace.peak_load_bytes, 1)
    model = step.model  # for a user's (step_fn, inputs): the module found in its closure
    if model is None and (baseline or check):
        step.close()
        raise MemplanError(f"{'--baseline' if baseline else '--check'} needs the model, but {name} hides it: "
                           f"return a Workload, or keep the model in the step function's closure")
    make_inputs = lambda i: w.make_inputs(batch, seed=seed + 1 + i)  # noqa: E731
    release_cache(device)
    with baseline_installed(baseline, model, fraction, torch.device(device)) if baseline \
            else contextlib.nullcontext():
        records = measure_steps(step if not baseline else w.step, make_inputs, steps, model, w.optimizer, seed,
                                host=step.runtime.host_buffers(), compiled=is_compiled(baseline),
                                memory_cap=memory_cap)
        timed = time_steps(step if not baseline else w.step, make_inputs, range(steps, steps + timed_steps),
                           model, seed, clock)
    simulated = None if baseline else step.program.predicted.get("peak_load_bytes")
    measured = max(r["measured_peak_bytes"] for r in records)
    stats = step.stats()
    allocation = allocator_report(mode, pool, records)  # a pooled run's reserved bytes are the pool's
    settled = records[stats["final_plan_from_step"]:] or records[-1:]
    out = {"model": name, "batch": batch, "planner": baseline or planner, "baseline": baseline,
           "device": str(device), "budget_bytes": budget_bytes, "trace_peak_bytes": step.trace.peak_load_bytes,
           "simulated_peak_bytes": simulated, "measured_peak_bytes": measured,
           "measured_peak_reserved_bytes": _largest(r.get("measured_peak_reserved_bytes") for r in records),
           "memory_cap_bytes": memory_cap, "within_budget": within_budget(settled, budget_bytes),
           "margin_bytes": stats["margin_bytes"], "replanned": stats["replanned"],
           "final_plan_from_step": stats["final_plan_from_step"],
           "step_time_s": [r["time_s"] for r in records], "steps": records,
           "measured_step_s": measured_step_s(records, timed), "timed_step_s": timed, "clock": clock,
           "simulated_step_s": None if baseline else step.program.predicted.get("time_s"),
           "profile": get_profile(profile).name, "op_times": op_time_source(step.trace),
           "trace_source": "fake" if step.trace.meta.get("fake") else "real",
           "predicted": {} if baseline else step.program.predicted,
           "executor": None if baseline else stats,  # a PyTorch tool runs without memplan's executor
           **allocation}
    step.close()
    if check:
        lift_cap(device)  # plain training needs what the plan saved
        ref = get_workload(name, batch, device=device, seed=seed, **config)
        ref_model = model_of(ref.step, ref.model)
        measure_steps(ref.step, make_inputs, steps + timed_steps, ref_model, ref.optimizer, seed)
        out.update(state_differences(model, ref_model))
    return out


def within_budget(records: list[dict], budget_bytes: int) -> bool:
    """Every step's allocated peak within the budget + 2%, and its reserved peak (GPU) within + 5%."""
    for r in records:
        if r["measured_peak_bytes"] > budget_bytes * (1 + BUDGET_TOLERANCE):
            return False
        reserved = r.get("measured_peak_reserved_bytes")
        if reserved is not None and reserved > budget_bytes * (1 + RESERVED_TOLERANCE):
            return False
    return True


def _largest(values) -> int | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


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
        with contextlib.nullcontext() if meter.cuda else active:  # CUDA: the allocator's counters
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
        step(*x)
        _sync(device)
        times.append(now() - started)
        del x
    return times


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


OVERHEAD_STEPS = 3  # timed steps per side in measure_overhead (after one warm-up step)


def measured_objective(trace, budget=None):
    """AutoSwap's "measured" objective: `plan -> overhead` measured by training on a GPU.

    Raises:
        MemplanError: no CUDA device here.
    """
    if not torch.cuda.is_available():
        raise MemplanError("objective 'measured' needs a CUDA device; use objective 'simulated'")
    return lambda plan: float(measure_overhead(trace, plan, budget))


def measure_overhead(trace, plan, budget=None, *, steps: int = OVERHEAD_STEPS) -> float:
    """Measured overhead of `plan` for a zoo trace: median step time under it / unplanned - 1.

    The workload is rebuilt from `trace.meta` (model, batch, config), on CUDA when present.
    Used by AutoSwap's `objective="measured"`.

    Raises:
        MemplanError: the trace does not name a zoo model.
    """
    import statistics

    from ..zoo.registry import get_workload

    meta = trace.meta
    if not meta.get("model") or not meta.get("batch"):
        raise MemplanError("measure_overhead needs a trace of a zoo model (meta 'model' and 'batch')")
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def median_step(planned) -> float:
        w = get_workload(meta["model"], int(meta["batch"]), device=device, **(meta.get("config") or {}))
        step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=trace, plan=planned,
                        measure=False) if planned is not None else w.step
        records = measure_steps(step, lambda i: w.make_inputs(w.batch, seed=1 + i), steps + 1, w.model,
                                w.optimizer, 0)
        if planned is not None:
            step.close()
        return statistics.median(r["time_s"] for r in records[1:])

    return median_step(plan) / median_step(None) - 1.0
