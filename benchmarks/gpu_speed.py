"""Issues 25 and 34 on a GPU: memplan's planned steps beside plain PyTorch and PyTorch's own tools at
the same memory, and the simulator's step time beside the measured one.

Per model, in a fresh process, uncapped: plain training (no memplan), PyTorch's checkpoint around
every block first (its allocated peak is the budget of what follows), memplan `none`, memplan's
sqrt-n, dtr, capuchin, autoswap:doa and auto at checkpoint's measured peak, then selective
activation checkpointing, save_on_cpu and torch.compile with `activation_memory_budget` at that
memory (`compile-budget`). Every memplan plan comes from one fake trace whose ops were each timed
alone on the device (their simulated step uses those times and the h100 profile's host costs).
Measured: each step's allocated and reserved peaks, the median of the unmetered steps, and the
executor's level and per-step counts (ops through a dispatch mode, regions run again). The
transformer group runs first, so a deadline cannot drop it.

    python benchmarks/gpu_speed.py --out DIR [--deadline-s 140] [--dry-run]

Writes DIR/gpu_speed.jsonl and DIR/gpu_speed.md.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_cases import (device_info, emit, error_of, gib, group_notes, machine, main, read, run_case,  # noqa: E402
                       table_row, trace_once)

NAME = "gpu_speed"
GROUPS = {"transformer": ("transformer-encoder", 32, {}, "50%"),  # the quickest first: a deadline cuts the last
          "resnet50": ("resnet50", 64, {}, "50%"), "gpt2": ("hf:gpt2", 8, {}, "80%")}
DRY = {"resnet50": ("resnet18-cifar", 4, {}), "gpt2": ("hf:gpt2", 1, {"n_layer": 2}),
       "transformer": ("transformer-encoder", 2, {})}
CHECKPOINT = "torch-checkpoint"  # run first: its measured peak is every later row's budget
BASELINES = ("sac-compute", "save-on-cpu", "compile-budget")
PLANNERS = ("sqrt-n", "dtr", "capuchin", "autoswap:doa", "auto")
PLANNER_PARAMS = {"auto": {"time_limit_s": 10.0}}
STEPS, TIMED = 2, 5


def plain_steps(model: str, batch: int, config: dict, device: str) -> dict:
    """Plain PyTorch training of the zoo workload: no memplan in the step."""
    import torch

    from memplan import get_workload

    cuda = device == "cuda"
    w = get_workload(model, batch, device=device, seed=0, **config)
    times, peaks = [], []
    for i in range(STEPS + TIMED):
        x = w.make_inputs(batch, seed=1 + i)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        w.step(*x)
        if cuda:
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
        times.append(time.perf_counter() - started)
    del w
    return {"measured_step_s": statistics.median(times[STEPS:]), "measured_peak_bytes": max(peaks) if peaks else None}


def group_main(group: str, args) -> None:
    import torch

    from memplan import DEFAULT_PROFILE, UNLIMITED

    deadline = time.time() + args.deadline_s
    model, batch, config, budget = GROUPS[group]
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        model, batch, config = DRY[group]
    emit(args.out, NAME, {"group": group, "case": "env", **device_info()})
    emit(args.out, NAME, {"group": group, "case": "plain", "planner": "plain PyTorch",
                          **plain_steps(model, batch, config, device)})
    if device == "cuda":
        torch.cuda.empty_cache()
    t0 = time.time()
    trace = trace_once(model, batch, device, config)
    emit(args.out, NAME, {"group": group, "case": "trace", "trace_s": round(time.time() - t0, 2),
                          "ops": len(trace.ops), "trace_peak_bytes": trace.peak_load_bytes,
                          "op_times": trace.meta.get("op_times"), "math": trace.meta.get("math")})
    common = dict(name=model, batch=batch, config=config, trace=trace, device=device, steps=STEPS,
                  timed_steps=TIMED, seed=0, profile=DEFAULT_PROFILE)
    ckpt = run_case(args.out, NAME, group, {"case": "pytorch", "planner": f"torch:{CHECKPOINT}"}, deadline,
                    planner="none", budget=budget, baseline=CHECKPOINT, **common)
    at = ckpt.get("measured_peak_bytes") or budget  # checkpoint's memory, or the group's budget if it failed
    run_case(args.out, NAME, group, {"case": "memplan", "planner": "none"}, deadline, planner="none", budget=UNLIMITED,
             **common)
    for planner in PLANNERS:
        run_case(args.out, NAME, group, {"case": "memplan", "planner": planner, "budget": at}, deadline,
                 planner=planner, budget=at, planner_params=PLANNER_PARAMS.get(planner), **common)
    for baseline in BASELINES:
        run_case(args.out, NAME, group, {"case": "pytorch", "planner": f"torch:{baseline}", "budget": at}, deadline,
                 planner="none", budget=at, baseline=baseline, **common)


def report(out: str) -> str:
    rows = read(out, NAME)
    plain = {r["group"]: r for r in rows if r.get("case") == "plain"}
    ckpt = {r["group"]: r for r in rows if r.get("planner") == f"torch:{CHECKPOINT}"}
    lines = [f"# GPU speed ({machine(rows)}; measured, simulated where it says so)", "",
             "Command: `python benchmarks/gpu_speed.py --out DIR`. Step: median of the unmetered steps; allocated "
             "and reserved: the largest per-step peak of the metered steps; simulated: the simulator on the "
             "calibrated-free h100 profile with every op's time measured alone on this GPU.", "",
             "| model | run | budget | level | allocated GiB | reserved GiB | step s | x plain | x checkpoint | "
             "simulated s | sim error | ops in mode | regions | re-plans | diverged | error |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        if r.get("case") not in ("plain", "memplan", "pytorch"):
            continue
        base = plain.get(r["group"], {}).get("measured_step_s")
        ref = ckpt.get(r["group"], {}).get("measured_step_s")
        step, sim = r.get("measured_step_s"), r.get("simulated_step_s")
        executor = r.get("executor") or {}
        first = (executor.get("steps_measured") or [{}])[0]
        budget = r.get("budget", "-")
        lines.append(table_row((
            r["group"], r.get("planner"), gib(budget) if isinstance(budget, int) else budget,
            executor.get("level", "-"), gib(r.get("measured_peak_bytes")),
            gib(r.get("measured_peak_reserved_bytes")), "-" if step is None else f"{step:.4f}",
            "-" if not (step and base) else f"{step / base:.2f}", "-" if not (step and ref) else f"{step / ref:.2f}",
            "-" if sim is None else f"{sim:.4f}", "-" if not (sim and step) else f"{sim / step - 1:+.0%}",
            first.get("ops_in_mode", "-"), first.get("regions_recomputed", "-"), r.get("replanned", "-"),
            executor.get("diverged_steps", "-"),
            (error_of(r) or r.get("skipped") or "").replace("|", "/")[:120])))
    return "\n".join(lines + group_notes(rows)) + "\n"


if __name__ == "__main__":
    main(__file__, NAME, __doc__.splitlines()[0], 140, list(GROUPS), group_main, report)
