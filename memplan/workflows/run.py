"""Measure training under a plan: step time, peak memory, host bytes, and the check run.

Used by `memplan run`. On a GPU, peak allocated/reserved memory come from
torch.cuda.max_memory_allocated/reserved; on CPU they are reported as None.
"""

from __future__ import annotations

import contextlib
import logging
import time

import torch
from torch.utils._pytree import tree_leaves

from ..errors import MemplanError
from ..planners.base import resolve_budget
from .optimize import model_of, optimize
from .torch_tools import BASELINES, baseline_installed, check_baseline

log = logging.getLogger(__name__)

__all__ = ["BASELINES", "check_baseline", "run_workload", "state_differences"]


def run_workload(name: str, batch: int, *, planner: str, budget, steps: int, device: str = "cpu",
                 profile: str = "h100", check: bool = False, seed: int = 0, config: dict | None = None,
                 baseline: str | None = None) -> dict:
    """Train `steps` steps of zoo workload `name` under a plan (or a PyTorch baseline) and measure.

    Args:
        name, batch, config: the zoo workload.
        planner, budget, profile: how to plan ("none" when a baseline runs).
        steps: training steps timed.
        device: where to train.
        check: also train plainly from the same seed and report the largest differences.
        seed: workload, planner and training seed.
        baseline: one of `baselines.BASELINES` instead of a plan.
    Returns:
        A JSON-ready dict: measured step times and memory, the executor's counters, the
        simulator's prediction (`predicted`, empty until memplan.sim.simulate exists) and,
        with `check`, `max_param_diff` and `max_buffer_diff` against plain training.
    """
    from ..zoo.registry import get_workload

    config = config or {}
    if baseline:
        check_baseline(baseline)
    w = get_workload(name, batch, device=device, seed=seed, **config)
    inputs = [w.make_inputs(batch, seed=seed + 1 + i) for i in range(steps)]
    step = optimize(w.step, *w.inputs, budget=None if baseline else budget, planner="none" if baseline else planner,
                    device=profile, model=w.model, optimizer=w.optimizer, seed=seed)
    budget_bytes = resolve_budget(step.trace, budget)
    fraction = budget_bytes / max(step.trace.peak_load_bytes, 1)
    model = step.model  # for a user's (step_fn, inputs): the module found in its closure
    if model is None and (baseline or check):
        step.close()
        raise MemplanError(f"{'--baseline' if baseline else '--check'} needs the model, but {name} hides it: "
                           f"return a Workload, or keep the model in the step function's closure")
    with baseline_installed(baseline, model, fraction, torch.device(device)) if baseline \
            else contextlib.nullcontext():
        times, peak = _timed(step if not baseline else w.step, inputs, model, seed)
    out = {"model": name, "batch": batch, "planner": baseline or planner, "baseline": baseline,
           "budget_bytes": budget_bytes, "steps": steps, "device": str(device), "step_time_s": times,
           **peak, "trace_peak_bytes": step.trace.peak_load_bytes,
           "predicted": {} if baseline else step.plan.predicted or {},
           "executor": step.stats()}
    ex = out["executor"]
    out["pinned_host_bytes"] = ex["pinned_host_bytes"] or ex["slab_bytes"] + ex["storage_slab_bytes"]
    step.close()
    if check:
        ref = get_workload(name, batch, device=device, seed=seed, **config)
        ref_model = model_of(ref.step, ref.model)
        _timed(ref.step, inputs, ref_model, seed)
        out.update(state_differences(model, ref_model))
    return out


def state_differences(model: torch.nn.Module, reference: torch.nn.Module) -> dict:
    """{"max_param_diff": .., "max_buffer_diff": ..}: largest absolute differences."""
    def worst(pairs) -> float:
        return max((float((a.detach().double() - b.detach().double()).abs().max()) for a, b in pairs
                    if a.numel()), default=0.0)

    return {"max_param_diff": worst(zip(model.parameters(), reference.parameters())),
            "max_buffer_diff": worst(zip(model.buffers(), reference.buffers()))}


def _timed(step, inputs, model, seed: int) -> tuple[list, dict]:
    tensors = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    cuda = any(t.is_cuda for t in tensors + list(model.parameters() if model is not None else ()))
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(seed)
    times = []
    for x in inputs:
        started = time.perf_counter()
        step(*x)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    peak = {"peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None}
    return times, peak


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
        inputs = [w.make_inputs(w.batch, seed=1 + i) for i in range(steps + 1)]
        step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=trace, plan=planned) \
            if planned is not None else w.step
        times = _timed(step, inputs, w.model, 0)[0][1:]
        if planned is not None:
            step.close()
        return statistics.median(times)

    return median_step(plan) / median_step(None) - 1.0
