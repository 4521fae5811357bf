"""Issue 24 on a GPU: train models that do not fit an (emulated) smaller GPU, inside their budget.

Per model, in a fresh process: the fake trace (nothing allocated; each op run alone on the
device for its time and inner memory), then `memplan run` cases under a memory cap
(`--memory-cap`: the allocator's own limit), each with `--check` (parameters against plain
training on the same device, with the cap lifted for it):

- resnet50@64 capped to 4 GiB: plain training (must be refused, naming planners that fit),
  then autoswap:doa, capuchin, sqrt-n, dtr and home:fast at a 3 GiB budget;
- hf:gpt2@8 capped to 2.75 GiB at 2.5 GiB; transformer-encoder@32 capped to 0.3 GiB at 0.25 GiB;
- the strict form: a plan at budget B with the cap at B + 5%.

    python benchmarks/gpu_budget.py --out DIR [--deadline-s 150] [--dry-run]

Writes DIR/gpu_budget.jsonl and DIR/gpu_budget.md (allocated and reserved peaks per step
against budget and cap, margins, re-plans, divergences, parameter differences).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_cases import GIB, GROUP, device_info, emit, gib, group_notes, main, read, run_case, trace_once  # noqa: E402

NAME = "gpu_budget"
STRICT = 1.05  # the strict form's cap: the budget + 5%
# group -> (model, batch, config, cap, budget, planners, strict planner)
GROUPS = {  # the quickest group first: a deadline cuts the last ones
    "transformer": ("transformer-encoder", 32, {}, int(0.3 * GIB), int(0.25 * GIB), ["capuchin", "dtr"], "capuchin"),
    "resnet50": ("resnet50", 64, {}, 4 * GIB, 3 * GIB, ["autoswap:doa", "capuchin", "sqrt-n", "dtr", "home:fast"],
                 "capuchin"),
    "gpt2": ("hf:gpt2", 8, {}, int(2.75 * GIB), int(2.5 * GIB), ["autoswap:doa", "capuchin"], "autoswap:doa"),
}
# the same on the CPU, with the cap and budget as shares of the trace's peak
DRY = {"resnet50": ("resnet18-cifar", 4, {}), "gpt2": ("hf:gpt2", 1, {"n_layer": 2}),
       "transformer": ("transformer-encoder", 2, {})}
DRY_CAP, DRY_BUDGET = 0.95, 0.85
PARAMS = {"home:fast": {"time_limit_s": 5}}
STEPS = 3


def group_main(group: str, args) -> None:
    import torch

    deadline = time.time() + args.deadline_s
    model, batch, config, cap, budget, planners, strict = GROUPS[group]
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        model, batch, config = DRY[group]
    emit(args.out, NAME, {"group": group, "case": "env", **device_info()})
    trace = trace_once(model, batch, device, config)
    if args.dry_run:
        cap, budget = int(trace.peak_load_bytes * DRY_CAP), int(trace.peak_load_bytes * DRY_BUDGET)
    common = dict(name=model, batch=batch, config=config, trace=trace, device=device, steps=STEPS, seed=0,
                  profile="h100")
    if group == "resnet50":
        run_case(args.out, NAME, group, {"case": "plain under the cap", "planner": "none", "cap": cap}, deadline,
                 planner="none", budget=None, memory_cap=cap, **common)
    for planner in planners:
        run_case(args.out, NAME, group, {"case": "capped", "planner": planner, "cap": cap, "budget": budget},
                 deadline, planner=planner, budget=budget, memory_cap=cap, check=True,
                 planner_params=PARAMS.get(planner), **common)
    strict_cap = int(budget * STRICT)
    run_case(args.out, NAME, group, {"case": "strict", "planner": strict, "cap": strict_cap, "budget": budget},
             deadline, planner=strict, budget=budget, memory_cap=strict_cap, check=True, **common)
    del trace
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def report(out: str) -> str:
    rows = [r for r in read(out, NAME) if r.get("case") not in (None, "env", GROUP)]
    env = next((r for r in read(out, NAME) if r.get("case") == "env"), {})
    lines = [f"# GPU budget ({env.get('gpu', env.get('device', '?'))}, torch {env.get('torch', '?')}; measured)", "",
             "Command: `python benchmarks/gpu_budget.py --out DIR`. Allocated and reserved are the CUDA allocator's "
             "peaks per step (`max_memory_allocated`, `max_memory_reserved`); the budget is judged on the steps "
             "under the final plan (after any re-plan).", "",
             "| model | case | planner | cap GiB | budget GiB | simulated GiB | allocated GiB per step | reserved GiB "
             "per step | within | margin MiB | re-plans | diverged | max param diff | step s | error |",
             "| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        steps = r.get("steps") or []
        lines.append("| " + " | ".join(str(x) for x in (
            r["group"], r["case"], r.get("planner"), gib(r.get("cap")), gib(r.get("budget_bytes")),
            gib(r.get("simulated_peak_bytes")), ", ".join(gib(s["measured_peak_bytes"]) for s in steps) or "-",
            ", ".join(gib(s["measured_peak_reserved_bytes"]) for s in steps) or "-",
            {True: "yes", False: "NO"}.get(r.get("within_budget"), "-"),
            "-" if r.get("margin_bytes") is None else f"{r['margin_bytes'] / 2**20:.1f}", r.get("replanned", "-"),
            (r.get("executor") or {}).get("diverged_steps", "-"),
            "-" if r.get("max_param_diff") is None else f"{r['max_param_diff']:.3g}",
            "-" if r.get("measured_step_s") is None else f"{r['measured_step_s']:.4f}",
            (r.get("error") or r.get("skipped") or "").replace("|", "/")[:160])) + " |")
    return "\n".join(lines + group_notes(read(out, NAME))) + "\n"


if __name__ == "__main__":
    main(__file__, NAME, __doc__.splitlines()[0], 150, list(GROUPS), group_main, report)
