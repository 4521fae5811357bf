"""Measure training under a plan: step time, peak memory, host bytes, and the check run.

Used by `memplan run`. On a GPU, peak allocated/reserved memory come from
torch.cuda.max_memory_allocated/reserved; on CPU they are reported as None.
"""

from __future__ import annotations

import logging
import time

import torch

from ..errors import MemplanError
from .api import optimize

log = logging.getLogger(__name__)

BASELINES = ("torch-checkpoint", "save-on-cpu", "compile-budget")


def run_workload(name: str, batch: int, *, planner: str, budget, steps: int, device: str = "cpu",
                 profile: str = "h100", check: bool = False, seed: int = 0, config: dict | None = None) -> dict:
    """Train `steps` steps of zoo workload `name` under a plan and report measurements.

    Returns:
        A JSON-ready dict: measured step times and memory, the executor's counters, the
        simulator's prediction (when available) and, with `check`, `max_param_diff`
        against plain training from the same seed.
    """
    from ..zoo.registry import get_workload

    config = config or {}
    w = get_workload(name, batch, device=device, seed=seed, **config)
    inputs = [w.make_inputs(batch, seed=seed + 1 + i) for i in range(steps)]
    step = optimize(w.step, *w.inputs, budget=budget, planner=planner, device=profile, model=w.model,
                    optimizer=w.optimizer, seed=seed)
    times, peak = _timed(step, inputs, w.model)
    out = {"model": name, "batch": batch, "planner": planner, "budget_bytes": step.plan.budget_bytes,
           "steps": steps, "device": str(device), "step_time_s": times, **peak,
           "trace_peak_bytes": step.trace.peak_load_bytes, "predicted": step.plan.predicted,
           "executor": step.stats()}
    out["pinned_host_bytes"] = out["executor"]["pinned_host_bytes"] or out["executor"]["slab_bytes"]
    step.close()
    if check:
        ref = get_workload(name, batch, device=device, seed=seed, **config)
        torch.manual_seed(seed)
        for x in inputs:
            ref.step(*x)
        out["max_param_diff"] = max(float((a.detach() - b.detach()).abs().max())
                                    for a, b in zip(w.model.parameters(), ref.model.parameters()))
    return out


def _timed(step, inputs, model) -> tuple[list, dict]:
    cuda = next(model.parameters()).is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
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


def check_baseline(name: str) -> None:
    """Raise for a baseline name this build cannot run."""
    if name not in BASELINES:
        raise MemplanError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")
    raise MemplanError(f"--baseline {name} is not implemented yet")
