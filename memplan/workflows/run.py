"""Measure training under a plan: step time and peak memory of every step, and the check run.

Used by `memplan run`. Every step's peak memory is measured by the independent meter
(memplan.workflows.measure), for plans and PyTorch's own tools alike, beside the peak the
simulator predicted for the plan's step program and the budget.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
from dataclasses import dataclass, replace

import torch

from ..budget import UNLIMITED, Budget, limited, parse_budget
from ..cost.profiles import get_profile
from ..errors import MemplanError, about_model
from ..exec.runtime import BUDGET_TOLERANCE  # a run is over its budget when it measures more than budget x (1 + this)
from ..run_options import AllocatorMode, Executor, GraphMode, RunOptions
from ..units import format_bytes
from ..zoo.registry import get_workload
from .allocators import allocator_report, attach_pool, choose_allocator, install_allocator
from .memory_cap import (RESERVED_TOLERANCE, hold_reserved, lift_cap, prepare_device, refuse_what_cannot_fit,
                         release_cache)
from .measure import Metering, measure_steps, measured_step_s, state_differences, time_steps
from .optimize import optimize
from .step_trace import model_of
from .torch_tools import BASELINES, baseline_installed, check_baseline, is_compiled

log = logging.getLogger(__name__)

__all__ = ["BASELINES", "BUDGET_TOLERANCE", "check_baseline", "measure_steps", "measured_objective", "measured_step_s",
           "run_workload", "state_differences", "time_steps"]

OP_TIME_REPEATS = 3  # timed iterations per op when a CPU run traces under a CPU profile


def op_time_source(trace) -> str:
    """"measured" when every op of the trace has a measured duration, "roofline" when none does, else "mixed"."""
    known = sum(op.duration_s is not None for op in trace.ops)
    return "measured" if known == len(trace.ops) else "roofline" if known == 0 else "mixed"


def run_workload(name: str, batch: int, *, planner: str = "none", budget: Budget | str | int | float | None = None,
                 options: RunOptions | None = None, config: dict | None = None, trace=None,
                 planner_params: dict | None = None, **keywords) -> dict:
    """Train `options.steps` steps of zoo workload `name` under a plan (or a PyTorch baseline) and measure.

    Args:
        name, batch, config: the zoo workload.
        planner, budget: how to plan ("none" when a baseline runs); a budget as `memplan.plan`
            takes it (None: no limit, and the run is checked against the unplanned peak).
        options: how the run goes (memplan.RunOptions); any of its fields may be given by name
            instead, among `keywords`. Those a run reads:
            steps: training steps measured (each step's inputs are made right before it).
            timed_steps: this many more steps after the metered ones, timed without the meter.
            device: where to train. profile: the cost model's profile the planner plans for.
            seed: workload, planner and training seed.
            clock: what timed steps and a trace's op times measure: "wall", or "cpu" (this thread's CPU time).
            check: also train plainly from the same seed and report the largest differences.
            baseline: one of `torch_tools.BASELINES` instead of a plan.
            memory_cap: emulate a device with this many bytes: on a GPU the allocator may use no
                more (`torch.cuda.set_per_process_memory_fraction`); on the CPU a step measuring more
                fails as running out of memory would.
            fake: trace fake copies (None: on a GPU, where the unplanned step may not fit).
            allocator: the CUDA allocator: "caching", "expandable" (segments), "pool" (the plan's
                layout; the process's first CUDA work), or "auto": the pool for a plan with a layout,
                else expandable segments (unless PYTORCH_CUDA_ALLOC_CONF sets the allocator).
            executor: "auto" (at autograd's hooks where the plan can run there) or "interpreted" (the
                dispatch-mode runner; always so under the pool allocator, which needs its op clock).
            cuda_graph: "auto", "on" or "off" (the default): capture the planned step as a CUDA graph after
                warm-up steps (memplan.workflows.cuda_graph; never under a baseline).
            compile: the model's forward through torch.compile with the plan lowered onto its partitioner
                (`memplan.optimize`'s compile: True, or torch.compile's keyword arguments; not with a baseline).
        trace: a saved trace (a Trace or a path) to plan instead of tracing; a CPU run under a
            CPU profile traces with measured op times.
        planner_params: the planner's hyper-parameters (e.g. {"time_limit_s": 10}).
    Returns:
        A JSON-ready dict: per step its time and measured peak (`steps`), the largest
        measured peak, the simulated peak of the plan's step program and the budget,
        whether the steps under the final plan stayed within the budget (`within_budget`: 2%
        over in allocated bytes, and on a GPU 5% over in reserved bytes), what keeping it
        took (`margin_bytes`, `replanned`, `final_plan_from_step`), `measured_step_s`
        (median step time after the first step, less the meter's own bookkeeping; with
        `timed_steps`, the median timed step on `clock`, and `timed_step_s_by_clock` both clocks) beside
        `simulated_step_s`, the executor's counters, `allocator` and `pool` (memplan.exec.pooled),
        `cuda_graph` (whether the step was captured and why not, its capture schedule, memory)
        and, with `check`, `max_param_diff` and `max_buffer_diff` against plain training.
    Raises:
        MemplanError: the unplanned step (planner none) cannot fit `memory_cap`; the error
            names planners that fit and their budget.
    """
    options = RunOptions.of(options, **keywords)
    if options.baseline:
        options = replace(options, cuda_graph=GraphMode.OFF)  # a PyTorch tool runs, never captured
    run = _Run(name=name, batch=batch, planner=planner, config=config or {}, options=options,
               budget=_run_budget(parse_budget(budget), planner, options))  # parsed here, the Python edge
    run, mode = _prepare(run)
    w = get_workload(name, batch, device=run.options.device, seed=run.options.seed, **run.config)
    step = _planned_step(run, w, trace, planner_params or {})
    return _trained(run, w, step, mode)


def _trained(run: _Run, w, step, mode: AllocatorMode) -> dict:
    """`run_workload`'s steps of workload `w` under `step` (an OptimizedStep), measured and reported."""
    o = run.options
    pool = _serve_allocator(run, step, mode)
    budget_bytes = _measured_against(run, step)
    model = _model_for(run, step)
    make_inputs = lambda i: w.make_inputs(run.batch, seed=o.seed + 1 + i)  # noqa: E731
    release_cache(o.device)
    records, timed = _measure(run, w, step, model, make_inputs, budget_bytes)
    out = _report(run, step, records, timed, budget_bytes, allocator_report(mode, pool, records))
    step.close()
    if o.check:
        out.update(_against_plain_training(run, model, make_inputs, o.steps + o.timed_steps))
    return out


@dataclass(frozen=True, kw_only=True)
class _Run:
    """What `run_workload` was asked to run."""

    name: str  # zoo workload
    batch: int  # its batch
    config: dict  # the workload's options
    planner: str  # the planner ("none" under a baseline)
    budget: Budget  # the budget the plan keeps (UNLIMITED: none)
    options: RunOptions  # how it runs


def _run_budget(budget: Budget, planner: str, options: RunOptions) -> Budget:
    """The run's budget: as given; without one, under a memory cap, what the cap leaves a plan
    (segments included)."""
    memory_cap = options.memory_cap
    if memory_cap is not None and budget.unlimited and planner != "none" and not options.baseline:
        return Budget.of_bytes(int(memory_cap / (1 + RESERVED_TOLERANCE)))
    if memory_cap is not None and budget.nbytes is not None and budget.nbytes > memory_cap:
        # A share of the peak is known only once traced: its plan must then simulate within the cap.
        raise MemplanError(f"--budget {format_bytes(budget.nbytes)} is more than --memory-cap "
                           f"{format_bytes(memory_cap)}: a plan may not keep more than the device holds; give a "
                           f"budget of at most the cap (or leave it out: a plan then gets the cap less "
                           f"{RESERVED_TOLERANCE:.0%})")
    return budget


def _measured_against(run: _Run, step) -> int:
    """The bytes a run is checked against: its budget in bytes (the plan's problem resolved it; a
    baseline's plan is unlimited, so its budget is resolved here), or without one the unplanned peak
    (what plain training holds)."""
    peak = step.trace.peak_load_bytes
    budget_bytes = run.budget.bytes_for(peak) if run.options.baseline else step.problem.budget_bytes
    return budget_bytes if limited(budget_bytes) else peak


def _prepare(run: _Run) -> tuple[_Run, AllocatorMode]:
    """Options checked, the CUDA allocator chosen and installed (before the run's first CUDA
    allocation) and the memory cap in force; the run as it goes on under that allocator."""
    o = run.options
    if o.baseline:
        check_baseline(o.baseline)
    mode = choose_allocator(o.allocator, planner=run.planner, device=o.device, baseline=o.baseline)
    install_allocator(mode)
    prepare_device(o.device, o.memory_cap, pooled=mode == AllocatorMode.POOL)
    if mode == AllocatorMode.POOL and o.compiled:
        raise MemplanError("the pool allocator serves memplan's own executor (its op clock): a compiled step "
                           "cannot use it; leave out --compile or --allocator pool")
    if mode == AllocatorMode.POOL:  # the pool matches requests by the op clock only it publishes
        run = replace(run, options=replace(o, executor=Executor.INTERPRETED))
    return run, mode


def _planned_step(run: _Run, w, trace, planner_params: dict):
    """The workload's step traced and planned (under a baseline: planned by none, unlimited)."""
    o = run.options
    cpu_profile = trace is None and str(o.device) == "cpu" and get_profile(o.profile).kind == "cpu"
    options = replace(o, measure="first", time_repeats=OP_TIME_REPEATS if cpu_profile else 0)
    with about_model(run.name, run.config):  # a step that fails while traced is the model's
        return optimize(w.step, *w.inputs, budget=UNLIMITED if o.baseline else run.budget,
                        planner="none" if o.baseline else run.planner, model=w.model, optimizer=w.optimizer,
                        trace=trace, options=options, **planner_params)


def _serve_allocator(run: _Run, step, mode: AllocatorMode):
    """The pool session of a pooled run (None otherwise); once an unpooled plan keeps its
    budget, so does the allocator's cache. Refuses a plan that cannot fit the memory cap."""
    o = run.options
    pool = attach_pool(step) if mode == AllocatorMode.POOL else None
    if pool is not None:
        step.keeper = None  # a pooled run's layout is fixed: its requests are the plan's (memplan.exec.pooled)
    elif step.keeper is not None:
        step.on_settled = lambda: hold_reserved(o.device, step.keeper.budget_bytes, o.memory_cap,
                                                step.last_step().get("measured_peak_reserved_bytes") or 0)
    if o.memory_cap is not None and not o.baseline:
        refuse_what_cannot_fit(step, o.memory_cap, f"{run.name} at batch {run.batch}")
    return pool


def _model_for(run: _Run, step):
    """The model trained (for a user's (step_fn, inputs): the module found in its closure).

    Raises:
        MemplanError: a baseline or a check needs the model, and the workload hides it.
    """
    model, o = step.model, run.options
    if model is None and (o.baseline or o.check):
        step.close()
        raise MemplanError(f"{'--baseline' if o.baseline else '--check'} needs the model, but {run.name} hides "
                           f"it: return a Workload, or keep the model in the step function's closure")
    return model


def _measure(run: _Run, w, step, model, make_inputs, budget_bytes: int) -> tuple[list[dict], dict]:
    """The metered steps' records and the timed steps' seconds on each clock, under the plan or the baseline tool."""
    o = run.options
    fraction = budget_bytes / max(step.trace.peak_load_bytes, 1)
    train = w.step if o.baseline else step
    metering = Metering(host=step.host_buffers(), compiled=is_compiled(o.baseline) or o.compiled,
                        memory_cap=o.memory_cap)
    with baseline_installed(o.baseline, model, fraction, torch.device(o.device)) if o.baseline \
            else contextlib.nullcontext():
        records = measure_steps(train, make_inputs, o.steps, model, w.optimizer, o.seed, metering)
        timed = time_steps(train, make_inputs, range(o.steps, o.steps + o.timed_steps), model, o.seed)
    return records, timed


def _report(run: _Run, step, records: list[dict], timed: dict, budget_bytes: int, allocation: dict) -> dict:
    """`run_workload`'s JSON-ready result (see its docstring)."""
    predicted = None if run.options.baseline else step.predicted
    stats = step.stats()
    graph = stats.pop("cuda_graph", None)  # a key of its own in the report
    settled = records[stats["final_plan_from_step"]:] or records[-1:]
    o = run.options
    return {"model": run.name, "batch": run.batch, "planner": o.baseline or run.planner, "baseline": o.baseline,
            "device": str(o.device), "budget_bytes": budget_bytes, "trace_peak_bytes": step.trace.peak_load_bytes,
            "trace_ops": len(step.trace.ops), "simulated_peak_bytes": None if predicted is None else predicted.peak_load_bytes,
            "measured_peak_bytes": max(r["measured_peak_bytes"] for r in records),
            "measured_peak_reserved_bytes": _largest(r.get("measured_peak_reserved_bytes") for r in records),
            "memory_cap_bytes": o.memory_cap, "within_budget": within_budget(settled, budget_bytes),
            "margin_bytes": stats["margin_bytes"], "replanned": stats["replanned"],
            "final_plan_from_step": stats["final_plan_from_step"],
            "step_time_s": [r["time_s"] for r in records], "steps": records,
            "measured_step_s": measured_step_s(records, timed[o.clock]), "timed_step_s": timed[o.clock], "clock": o.clock,
            "timed_step_s_by_clock": timed,
            "simulated_step_s": None if predicted is None else predicted.time_s,
            "profile": get_profile(o.profile).name, "op_times": op_time_source(step.trace),
            "trace_source": "fake" if step.trace.meta.get("fake") else "real",
            "predicted": {} if predicted is None else predicted.to_json(),
            "executor": None if o.baseline else stats,  # a PyTorch tool runs without memplan's executor
            "cuda_graph": None if o.baseline else graph,
            **allocation}


def _against_plain_training(run: _Run, model, make_inputs, steps: int) -> dict:
    """The largest differences from training the same workload plainly from the same seed (a
    compiled run: plainly compiled, with the same torch.compile options)."""
    o = run.options
    lift_cap(o.device)  # plain training needs what the plan saved
    ref = get_workload(run.name, run.batch, device=o.device, seed=o.seed, **run.config)
    ref_model = model_of(ref.step, ref.model)
    if o.compiled:
        ref_model.forward = torch.compile(ref_model.forward, **o.compile)
    measure_steps(ref.step, make_inputs, steps, ref_model, ref.optimizer, o.seed, Metering(compiled=o.compiled))
    return state_differences(model, ref_model)


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
