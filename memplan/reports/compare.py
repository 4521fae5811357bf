"""`memplan compare`: every planner and PyTorch tool on the same models, simulated and measured.

Three kinds of point, each one entry of a resumable cache (`compare.json` in the output
folder, rewritten whole after every point, so an interrupted run loses at most the point
it was on and a rerun skips every finished one):

- simulated: a fake-tensor trace at `sim_batch`, planned by each planner at each budget
  share and scored by the simulator on `profile` ("simulated (<profile>)");
- measured: real training on `device` (the CPU, or a CUDA GPU) at `run_batch` through the
  run workflow (`memplan run`), under each measured planner at each budget share, and under
  each PyTorch tool; peak by the memory meter over two metered steps (on a GPU, the
  allocator's counters), time the median of `steps - 1` unmetered steps after them
  ("measured (CPU)", "measured (<GPU name>)"); overhead against the measured `none` run. The
  plans of measured points are made for the machine they run on: priced by `run_profile`
  (default: this CPU, calibrated once per output folder into `cpu_profile.json`, and traced
  with measured op times; with `device` cuda, this GPU, calibrated into `gpu_profile.json`),
  not by the simulated points' profile. Points measured on a GPU are other points than those
  measured on the CPU (their cache keys name the device);
- maxbatch: the largest batch each planner reaches under one fixed memory cap (by
  default the unplanned peak at `sim_batch`), by planning and simulating fake traces
  (`memplan.workflows.maxbatch`; measuring it needs a GPU).

A planner that cannot meet a budget gives a point with its error (it is finished too).
The report (Markdown and one PNG per model) is `memplan.reports.compare_report`.
"""

from __future__ import annotations

import gc
import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .. import RunOptions, calibrate, get_profile, max_batch, plan, run_workload, trace_workload
from ..services import (calibrate_cpu, check_baseline, check_model_name, get_planner, profile_to_json,
                        with_executor_costs)
from ..budget import UNLIMITED, parse_budget
from ..errors import MemplanError
from ..fileio import atomic_write_text, make_output_folder, read_text
from ..progress import progress_bar
from .compare_settings import (CPU_PROFILE, CPU_PROFILE_FILE, GPU_PROFILE, GPU_PROFILE_FILE, METERED_STEPS, NO_BUDGET,
                               PLANNER_PARAMS, TOOL_PREFIX, CompareSettings)

log = logging.getLogger(__name__)

CACHE_NAME = "compare.json"
CACHE_SCHEMA = "memplan.compare"


@dataclass(frozen=True)
class Task:
    """One point to compute: its cache key and the arguments of its kind."""

    key: str
    kind: str  # "simulated", "measured" or "maxbatch"
    model: str
    method: str  # planner or PyTorch tool
    budget: str  # a share of the peak, NO_BUDGET, or bytes (maxbatch)
    batch: int


@dataclass
class Cache:
    """Finished points by key, kept in `path` (JSON)."""

    path: Path
    points: dict = field(default_factory=dict)

    @classmethod
    def open(cls, folder: Path) -> "Cache":
        """The cache in `folder` (empty when there is none yet).

        Raises:
            MemplanError: the file exists but is not a memplan comparison cache.
        """
        path = folder / CACHE_NAME
        if not path.exists():
            return cls(path)
        try:
            data = json.loads(read_text(path, "a comparison cache"))
        except json.JSONDecodeError as exc:
            raise MemplanError(f"{path}: not a comparison cache ({exc}); remove it to start afresh") from None
        if not isinstance(data, dict) or data.get("schema") != CACHE_SCHEMA or not isinstance(data.get("points"), dict):
            raise MemplanError(f"{path}: not a memplan comparison cache; remove it to start afresh")
        return cls(path, data["points"])

    def add(self, key: str, point: dict) -> None:
        """Record a finished point and rewrite the file whole."""
        self.points[key] = point
        atomic_write_text(self.path, json.dumps({"schema": CACHE_SCHEMA, "version": 1, "points": self.points},
                                                indent=1, sort_keys=True))


def tasks(settings: CompareSettings) -> list[Task]:
    """Every point the settings ask for, in the order they run (cheap simulated ones first)."""
    s, out = settings, []
    for model in s.models:
        for planner in s.sim_planners:  # `none` keeps everything: its one point is the unconstrained run
            budgets = (NO_BUDGET,) if planner == "none" else s.budgets
            out += [_task("simulated", model, planner, b, s.sim_batch) for b in budgets]
        run_planners = ("none",) + tuple(p for p in s.run_planners if p != "none")
        run = f"{s.steps}|plan={Path(s.run_profile).stem}"  # a point planned on another profile is another point
        run += "" if s.device == "cpu" else f"|device={s.device}"  # and so is one measured elsewhere
        run += "" if s.memory_cap is None else f"|cap={s.memory_cap}"  # or under another memory cap
        out.append(_task("measured", model, "none", NO_BUDGET, s.run_batch, run))
        for planner in run_planners[1:]:
            out += [_task("measured", model, planner, b, s.run_batch, run) for b in s.budgets]
        for tool in s.baselines:  # "torch:": `save-on-cpu` is also the name of a memplan planner
            budgets = s.budgets if tool == "compile-budget" else (NO_BUDGET,)
            out += [_task("measured", model, TOOL_PREFIX + tool, b, s.run_batch, run) for b in budgets]
        memory = str(s.maxbatch_memory) if s.maxbatch_memory else f"peak@{s.sim_batch}"
        out += [_task("maxbatch", model, p, memory, s.maxbatch_limit) for p in s.maxbatch_planners]
    return out


def _task(kind, model, method, budget, batch, steps=None) -> Task:
    extra = f"|steps={steps}" if steps else ""
    return Task(f"{kind}|{model}|{method}|{budget}|{batch}{extra}", kind, model, method, budget, batch)


def compare(settings: CompareSettings, out_dir: str | Path, *, progress: bool = True) -> dict:
    """Compute every point not in the cache of `out_dir`, then return all of them.

    Returns:
        {"points": [point dicts in task order], "computed": n new, "cached": n reused}.
    """
    check_settings(settings)
    folder = make_output_folder(out_dir)
    cache = Cache.open(folder)
    settings = _with_run_profile(settings, folder)
    todo = tasks(settings)
    pending = [t for t in todo if t.key not in cache.points]
    with progress_bar("compare", total=len(pending), unit=" points", enabled=progress) as bar:
        for task in pending:
            bar.set_postfix_str(f"{task.kind} {task.model} {task.method} {task.budget}")
            cache.add(task.key, {"kind": task.kind, "model": task.model, "method": task.method,
                                 "budget": task.budget, "batch": task.batch, "source": _source(task, settings),
                                 **compute_point(task, settings)})
            bar.update()
    return {"points": [cache.points[t.key] for t in todo], "computed": len(pending),
            "cached": len(todo) - len(pending)}


def check_settings(s: CompareSettings) -> None:
    """Every option checked before any work: model, planner, tool and profile names, budgets.

    Raises:
        MemplanError: the first option that is wrong, naming it.
    """
    for option, values in (("--models", s.models), ("--budgets", s.budgets)):
        if not values:
            raise MemplanError(f"{option}: give at least one")
    for model in s.models:
        check_model_name(model)
    for budget in s.budgets:
        parse_budget(budget)
    for tool in s.baselines:
        check_baseline(tool)
    for name in {*s.sim_planners, *s.run_planners, *s.maxbatch_planners}:
        get_planner(name)
    for profile in {s.profile, s.run_profile} - {CPU_PROFILE, GPU_PROFILE}:
        get_profile(profile)
    check_device(s)


def check_device(s: CompareSettings) -> None:
    """Raise MemplanError when the measured points cannot run where `s` says."""
    try:
        device = torch.device(s.device)
    except (RuntimeError, ValueError):
        raise MemplanError(f"unknown device {s.device!r} (cpu or cuda)") from None
    if device.type not in ("cpu", "cuda"):
        raise MemplanError(f"compare measures on cpu or cuda, not {s.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MemplanError(f"compare --device {s.device}: no CUDA device on this host")
    if s.run_profile == GPU_PROFILE and device.type != "cuda":
        raise MemplanError(f"run profile {GPU_PROFILE!r} calibrates the GPU the points are measured on: "
                           f"it needs --device cuda")


def _with_run_profile(s: CompareSettings, folder: Path) -> CompareSettings:
    """`s` with `run_profile` a file: this CPU's (or GPU's) calibration, made once per output
    folder (a resumed comparison plans its remaining measured points on the same profile)."""
    if s.run_profile not in (CPU_PROFILE, GPU_PROFILE):
        return s
    path = folder / (CPU_PROFILE_FILE if s.run_profile == CPU_PROFILE else GPU_PROFILE_FILE)
    if not path.exists():
        atomic_write_text(path, json.dumps(profile_to_json(_calibrated(s)), indent=1) + "\n")
    return replace(s, run_profile=str(path))


def _calibrated(s: CompareSettings):
    """The calibration `s.run_profile` names: this CPU's, or that of the GPU in `s.device`."""
    if s.run_profile == CPU_PROFILE:
        return with_executor_costs(calibrate_cpu(), "cpu")
    return with_executor_costs(calibrate(torch.device(s.device).index or 0), s.device)


def _source(task: Task, s: CompareSettings) -> str:
    """How the point's figures were obtained, as every figure must say."""
    return f"measured ({device_name(s.device)})" if task.kind == "measured" else f"simulated ({s.profile})"


def device_name(device: str) -> str:
    """"CPU", or the GPU's name ("NVIDIA H100 80GB HBM3")."""
    device_ = torch.device(device)
    return "CPU" if device_.type == "cpu" else torch.cuda.get_device_name(device_)


def compute_point(task: Task, settings: CompareSettings) -> dict:
    """The measurements of one point; {"error": ...} when its planner or tool cannot give one."""
    compute = {"simulated": _simulated, "measured": _measured, "maxbatch": _maxbatch}[task.kind]
    try:
        return compute(task, settings)
    except MemplanError as exc:
        log.info("%s: %s", task.key, exc)
        return {"error": str(exc).splitlines()[0]}


def _simulated(task: Task, s: CompareSettings) -> dict:
    trace = trace_workload(task.model, task.batch, fake=True)
    budget = UNLIMITED if task.budget == NO_BUDGET else task.budget
    result = plan(trace, budget, planner=task.method, profile=s.profile, seed=s.seed,
                  **PLANNER_PARAMS.get(task.method, {}))
    p = result.predicted
    return {"peak_bytes": p["peak_load_bytes"], "overhead": p["overhead"], "time_s": p["time_s"],
            "trace_peak_bytes": trace.peak_load_bytes, "planning_s": result.planning_s}


def _measured(task: Task, s: CompareSettings) -> dict:
    baseline = task.method.removeprefix(TOOL_PREFIX) if task.method.startswith(TOOL_PREFIX) else None
    budget = UNLIMITED if task.budget == NO_BUDGET else task.budget
    # Peaks from metered steps; times from unmetered ones (the CPU meter's bookkeeping on every
    # op would weigh more on plans that run more ops).
    options = RunOptions(steps=min(s.steps, METERED_STEPS), timed_steps=max(s.steps - 1, 1), device=s.device,
                         profile=s.run_profile, seed=s.seed, baseline=baseline, memory_cap=s.memory_cap)
    try:
        out = run_workload(task.model, task.batch, planner="none" if baseline else task.method, budget=budget,
                           options=options)
    finally:
        _release_cached_memory(s.device)
    return {"peak_bytes": out["measured_peak_bytes"], "step_s": out["measured_step_s"],
            "simulated_peak_bytes": out["simulated_peak_bytes"], "trace_peak_bytes": out["trace_peak_bytes"],
            "budget_bytes": out["budget_bytes"]}


def _release_cached_memory(device: str) -> None:
    """On a GPU, hand back what the point's run left in the caching allocator, so the next
    point's peak counts its own memory only (the counters are per process)."""
    if torch.device(device).type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def _maxbatch(task: Task, s: CompareSettings) -> dict:
    memory = s.maxbatch_memory or trace_workload(task.model, s.sim_batch, fake=True).peak_load_bytes
    out = max_batch(task.model, memory, planner=task.method, device="cpu", profile=s.profile, limit=task.batch)
    return {"max_batch": out["max_batch"], "memory_bytes": int(memory)}
