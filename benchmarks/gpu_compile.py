"""Issue 47 on a GPU: plans lowered onto torch.compile's partitioner under a memory cap, beside
torch.compile's `activation_memory_budget`.

Per model, in a fresh process: memplan `auto` compiled at the group's budget under a 4 GiB cap
(allocated within the budget + 2%, reserved within + 5%, parameters against plain compiled
training: `--check`); the same with `mode="reduce-overhead"` (the planned step captured as CUDA
graphs by the compiler, which eager checkpointing cannot be: pytorch#154306); `compile-budget`
(torch.compile with activation_memory_budget) at fractions around the same memory, uncapped.
Where this PyTorch has compile-time activation offload, memplan's plan may swap: the compiled
rows say how many decisions were lowered as offloads.

    python benchmarks/gpu_compile.py --out DIR [--deadline-s 150] [--dry-run]

Writes DIR/gpu_compile.jsonl and DIR/gpu_compile.md.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_cases import device_info, emit, gib, group_notes, machine, main, read, run_case, table_row  # noqa: E402

NAME = "gpu_compile"
GIB = 2**30
CAP, BUDGET = 4 * GIB, 3 * GIB
GROUPS = {"gpt2": ("hf:gpt2", 8, {}), "resnet50": ("resnet50", 64, {})}
DRY = {"gpt2": ("hf:gpt2", 1, {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 256, "seq_len": 64})}
DRY_FRACTIONS = (0.5,)  # the dry run proves the plumbing: one model, one compile-budget row
DRY_CAP, DRY_BUDGET = None, "97%"  # a tiny GPT-2 peaks at its optimizer step from 96%
FRACTIONS = (0.5, 0.2)  # compile-budget's rows
PLANNER_PARAMS = {"time_limit_s": 10.0}
STEPS, TIMED = 3, 5


def group_main(group: str, args) -> None:
    deadline = time.time() + args.deadline_s
    if args.dry_run and group not in DRY:
        return
    model, batch, config = DRY[group] if args.dry_run else GROUPS[group]
    cap, budget = (DRY_CAP, DRY_BUDGET) if args.dry_run else (CAP, BUDGET)
    device = "cpu" if args.dry_run else "cuda"
    emit(args.out, NAME, {"group": group, "case": "env", **device_info()})
    common = dict(name=model, batch=batch, config=config, device=device, steps=STEPS, timed_steps=TIMED, seed=0)
    for mode in ("default", "reduce-overhead"):
        if mode == "reduce-overhead" and args.dry_run:
            continue  # CUDA graphs need CUDA
        run_case(args.out, NAME, group, {"case": "memplan", "planner": "auto", "mode": mode}, deadline,
                 planner="auto", budget=budget, memory_cap=cap, check=mode == "default",
                 planner_params=PLANNER_PARAMS, compile={"mode": mode}, **common)
    for fraction in DRY_FRACTIONS if args.dry_run else FRACTIONS:
        run_case(args.out, NAME, group, {"case": "pytorch", "planner": f"torch:compile-budget:{fraction}"}, deadline,
                 planner="none", budget=None, baseline=f"compile-budget:{fraction}", **common)


def report(out: str) -> str:
    rows = read(out, NAME)
    lines = [f"# Compiled plans on a GPU ({machine(rows)}; measured)", "",
             "Command: `python benchmarks/gpu_compile.py --out DIR`. memplan rows under a memory cap; allocated and "
             "reserved: the largest per-step peak of the metered steps; step: median of the unmetered steps.", "",
             "| model | run | mode | budget GiB | allocated GiB | reserved GiB | within | step s | max param diff | "
             "error |", "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in rows:
        if r.get("case") not in ("memplan", "pytorch"):
            continue
        step = r.get("measured_step_s")
        lines.append(table_row((
            r["group"], r.get("planner"), r.get("mode", "-"), gib(r.get("budget_bytes")),
            gib(r.get("measured_peak_bytes")), gib(r.get("measured_peak_reserved_bytes")),
            {True: "yes", False: "NO"}.get(r.get("within_budget"), "-"), "-" if step is None else f"{step:.4f}",
            "-" if r.get("max_param_diff") is None else f"{r['max_param_diff']:.2e}",
            (r.get("error") or r.get("skipped") or "").replace("|", "/")[:120])))
    return "\n".join(lines + group_notes(rows)) + "\n"


if __name__ == "__main__":
    main(__file__, NAME, __doc__.splitlines()[0], 150, list(GROUPS), group_main, report)
