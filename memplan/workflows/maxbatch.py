"""The largest batch that fits a memory cap under a planner (HOME's Table 2).

On a GPU the cap is real: `torch.cuda.set_per_process_memory_fraction(cap / total)` and a
batch fits when a few training steps under the plan run without running out of memory.
Elsewhere the answer comes from tracing with fake tensors (nothing allocated) and
planning under the cap; the plan must also simulate within the cap ("source": "simulated").
Batches are probed by doubling from 1, then binary search between the last fit and the
first failure.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from ..cost.profiles import get_profile
from ..errors import InfeasibleBudgetError, MemplanError
from ..planners.base import get_planner
from ..planners.base import plan as make_plan
from ..problem import DEFAULT_PROFILE
from ..progress import progress_bar
from ..run_options import RunOptions
from ..zoo.registry import check_model_name
from .run import run_workload
from .workloads import trace_workload

log = logging.getLogger(__name__)

MAX_BATCH = 1 << 16  # probing stops here
GPU_STEPS = 2  # steps run per probed batch on a GPU


def max_batch(name: str, memory_bytes: int, *, planner: str, device: str = "cpu", profile: str = DEFAULT_PROFILE,
              config: dict | None = None, limit: int = MAX_BATCH) -> dict:
    """Find the largest batch of zoo workload `name` that fits `memory_bytes` under `planner`.

    Args:
        name: zoo model name.
        memory_bytes: the memory cap.
        planner: planner name.
        device: "cuda" measures on the GPU; anything else answers by planning (and simulating).
        profile: cost-model profile for planning.
        config: model options.
        limit: largest batch tried.
    Returns:
        {"model", "planner", "memory_bytes", "max_batch" (0: not even batch 1), "limit",
        "at_limit" (max_batch is the limit: larger batches were not tried), "source",
        "probes": [{"batch", "fits", ...}]}.
    """
    check_model_name(name)  # every option before the first probe
    get_planner(planner)
    get_profile(profile)
    config = config or {}
    if device.startswith("cuda"):
        fits, source = _gpu_probe(name, memory_bytes, planner, device, profile, config), "measured"
    else:
        fits, source = _planned_probe(name, memory_bytes, planner, profile, config), "simulated"
    probes: list[dict] = []
    try:
        with progress_bar(f"maxbatch {name}", unit=" batches") as bar:
            best = search(lambda b: _record(probes, b, fits(b), bar), limit)
    finally:
        if source == "measured":
            torch.cuda.set_per_process_memory_fraction(1.0, torch.device(device))
    return {"model": name, "planner": planner, "memory_bytes": int(memory_bytes), "max_batch": best, "limit": limit,
            "at_limit": best == limit, "source": source, "probes": probes}


def search(fits: Callable[[int], bool], limit: int = MAX_BATCH) -> int:
    """Largest b in [1, limit] with fits(b), assuming fits is monotone (0 if none)."""
    lo, hi = 0, 1
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _record(probes: list, batch: int, result: tuple[bool, dict], bar) -> bool:
    fits, info = result
    probes.append({"batch": batch, "fits": fits, **info})
    log.info("batch %d: %s", batch, "fits" if fits else "does not fit")
    bar.update()
    bar.set_postfix_str(f"largest fitting so far {max((p['batch'] for p in probes if p['fits']), default=0)}")
    return fits


def _planned_probe(name, memory_bytes, planner, profile, config):
    def fits(batch: int) -> tuple[bool, dict]:
        trace = trace_workload(name, batch, fake=True, **config)
        try:
            p = make_plan(trace, int(memory_bytes), planner=planner, profile=profile)
        except InfeasibleBudgetError as exc:
            return False, {"reason": str(exc)}
        peak = p.predicted["peak_load_bytes"]
        ok = p.predicted["feasible"] and peak <= memory_bytes
        return ok, {"trace_peak_bytes": trace.peak_load_bytes, **({"predicted_peak_bytes": peak} if peak else {})}

    return fits


def _gpu_probe(name, memory_bytes, planner, device, profile, config):
    dev = torch.device(device)
    total = torch.cuda.get_device_properties(dev).total_memory
    if memory_bytes > total:
        raise MemplanError(f"--memory {memory_bytes} bytes is more than the GPU's {total}")
    torch.cuda.set_per_process_memory_fraction(memory_bytes / total, dev)
    options = RunOptions(steps=GPU_STEPS, device=device, profile=profile)

    def fits(batch: int) -> tuple[bool, dict]:
        try:
            out = run_workload(name, batch, planner=planner, budget=int(memory_bytes), options=options, config=config)
        except (torch.cuda.OutOfMemoryError, InfeasibleBudgetError) as exc:
            return False, {"reason": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        finally:
            torch.cuda.empty_cache()
        return True, {"peak_reserved_bytes": out["measured_peak_reserved_bytes"], "step_time_s": out["step_time_s"][-1]}

    return fits
