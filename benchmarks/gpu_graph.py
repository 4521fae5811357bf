"""Issue 35 on a GPU: the planned step captured as one CUDA graph, beside plain eager PyTorch, memplan's
eager executor and torch.compile(mode="reduce-overhead") with activation_memory_budget at the same memory.

Per group, in a fresh process (gpu_cases): plain PyTorch training (no memplan); the group's plan at its
budget run eagerly (`cuda_graph="off"`) and captured (`cuda_graph="on"`: warm-up steps, the capture, then
one replay a step); the model's forward compiled with mode="reduce-overhead" (CUDA graphs) under
`activation_memory_budget` = the budget's share of the unplanned peak, each step marked with
`torch.compiler.cudagraph_mark_step_begin()`. The pool group captures an X+smartpool plan under the pool
allocator (its first CUDA work: the allocator replaces PyTorch's before any allocation), to set its
reserved memory beside the layout's footprint. Sequence models train with `adam-capturable` (Adam with
its state on the device) in every run of their group, so the captured one is comparable.

Targets (issue 35): hf:gpt2@8 at 80% and transformer-encoder@32 at 70% captured no slower than plain
eager; resnet50@64 at 50% at most 1.10x plain eager; allocated within the budget + 2% and reserved
within + 5%; the pooled capture's reserved memory within 2% of the layout's footprint.

    python benchmarks/gpu_graph.py --out DIR [--deadline-s 220] [--dry-run]

Writes DIR/gpu_graph.jsonl and DIR/gpu_graph.md. `--dry-run` runs small models on the CPU: memplan
cannot capture there (its rows say why), torch.compile is not run, and the pool group runs PyTorch's
allocator; it proves the plumbing, not a figure.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_cases import (device_info, emit, error_of, failed_at, failure, gib, group_notes, machine, main,  # noqa: E402
                       read, run_case, table_row)

NAME = "gpu_graph"
CAPTURABLE = {"optimizer": "adam-capturable"}
# group: (model, batch, config, budget, planner, target step / plain eager step)
GROUPS = {"transformer": ("transformer-encoder", 32, CAPTURABLE, "70%", "auto", 1.0),
          "gpt2": ("hf:gpt2", 8, CAPTURABLE, "80%", "auto", 1.0),
          "resnet50": ("resnet50", 64, {}, "50%", "auto", 1.10),
          "pool": ("transformer-encoder", 32, CAPTURABLE, "70%", "dtr+smartpool", None)}
# dry run: small models, budgets they reach, one timed step
DRY = {"transformer": ("transformer-encoder", 2, {"seq_len": 8}, "95%"),
       "gpt2": ("hf:gpt2", 1, {"n_layer": 1, "n_embd": 64, "n_head": 2, "vocab_size": 256, "seq_len": 32}, "100%"),
       "resnet50": ("resnet18-cifar", 2, {}, "80%"), "pool": ("transformer-encoder", 2, {"seq_len": 8}, "100%")}
STEPS, TIMED = 4, 6  # metered steps (the warm-up steps and the capture), then timed ones (replays)
DRY_STEPS, DRY_TIMED = 2, 1
PLANNER_PARAMS = {"auto": {"time_limit_s": 5.0}, "dtr+smartpool": {"pool_time_limit_s": 2.0}}
DRY_PARAMS = {"auto": {"time_limit_s": 1.0}, "dtr+smartpool": {"pool_time_limit_s": 0.5}}
RESERVED_TOLERANCE, ALLOCATED_TOLERANCE, LAYOUT_TOLERANCE = 0.05, 0.02, 0.02


def timed(train, make_inputs, cuda: bool) -> dict:
    """STEPS + TIMED steps of `train`: the median time and the largest peaks of the last TIMED."""
    import torch

    times, allocated, reserved = [], [], []
    steps = STEPS if cuda else DRY_STEPS
    for i in range(steps + (TIMED if cuda else DRY_TIMED)):
        x = make_inputs(i)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            train(*x)
        except BaseException as exc:
            exc.memplan_step = i  # a failing row says which step (gpu_cases.failure)
            raise
        if cuda:
            torch.cuda.synchronize()
            allocated.append(torch.cuda.max_memory_allocated())
            reserved.append(torch.cuda.max_memory_reserved())
        times.append(time.perf_counter() - started)
    return {"measured_step_s": statistics.median(times[steps:]), "measured_peak_bytes": max(allocated[steps:], default=None),
            "measured_peak_reserved_bytes": max(reserved[steps:], default=None)}


def plain_case(out: str, group: str, model: str, batch: int, config: dict, device: str) -> None:
    from memplan import get_workload

    w = get_workload(model, batch, device=device, seed=0, **config)
    emit(out, NAME, {"group": group, "case": "plain", "planner": "plain PyTorch",
                     **timed(w.step, lambda i: w.make_inputs(batch, seed=1 + i), device == "cuda")})


def compiled_case(out: str, group: str, model: str, batch: int, config: dict, fraction: float, device: str) -> None:
    """The forward through torch.compile(mode="reduce-overhead") under activation_memory_budget=`fraction`."""
    import torch

    from memplan import get_workload

    rec = {"group": group, "case": "pytorch", "planner": "torch.compile reduce-overhead", "fraction": fraction}
    if device != "cuda":
        rec["skipped"] = "dry run: reduce-overhead's CUDA graphs need a GPU"
        emit(out, NAME, rec)
        return
    try:
        import torch._functorch.config as functorch_config

        w = get_workload(model, batch, device=device, seed=0, **config)
        w.model.forward = torch.compile(w.model.forward, mode="reduce-overhead")

        def train(*x):
            torch.compiler.cudagraph_mark_step_begin()  # a training step: the graphs' outputs are not kept
            w.step(*x)

        with functorch_config.patch(activation_memory_budget=fraction):
            rec.update(timed(train, lambda i: w.make_inputs(batch, seed=1 + i), True))
    except Exception as exc:  # noqa: BLE001 - where it does not run, the row says why
        rec["failed_at"], rec["error"] = failed_at(exc), failure(exc)[:400]
        rec["traceback"] = traceback.format_exc()[-3000:]  # inductor's cause is lines below its first
    emit(out, NAME, rec)
    torch.cuda.empty_cache()


def group_main(group: str, args) -> None:
    from memplan import DEFAULT_PROFILE

    deadline = time.time() + args.deadline_s
    model, batch, config, budget, planner, _ = GROUPS[group]
    device = "cpu" if args.dry_run else "cuda"
    if args.dry_run:
        model, batch, config, budget = DRY[group]
    common = dict(name=model, batch=batch, config=config, device=device, seed=0, profile=DEFAULT_PROFILE, planner=planner,
                  budget=budget, steps=DRY_STEPS if args.dry_run else STEPS,
                  timed_steps=DRY_TIMED if args.dry_run else TIMED,
                  planner_params=(DRY_PARAMS if args.dry_run else PLANNER_PARAMS).get(planner))
    graph = "on" if device == "cuda" else "auto"  # on the CPU "on" is an error: auto says why it is not captured
    if group == "pool":  # the pool allocator first, before any CUDA allocation of this process
        run_case(args.out, NAME, group, {"case": "memplan", "planner": planner, "run": "captured, pool allocator"}, deadline,
                 allocator="pool" if device == "cuda" else "caching", cuda_graph=graph, **common)
        emit(args.out, NAME, {"group": group, "case": "env", **device_info()})
        return
    emit(args.out, NAME, {"group": group, "case": "env", **device_info()})
    plain_case(args.out, group, model, batch, config, device)
    run_case(args.out, NAME, group, {"case": "memplan", "planner": planner, "run": "eager"}, deadline, cuda_graph="off", **common)
    run_case(args.out, NAME, group, {"case": "memplan", "planner": planner, "run": "captured"}, deadline, cuda_graph=graph, **common)
    compiled_case(args.out, group, model, batch, config, float(budget.rstrip("%")) / 100, device)


def _row(r: dict, base: float | None) -> str:
    graph = r.get("cuda_graph") or {}
    memory = (graph.get("memory") or {}).get("capture") or {}
    step = r.get("measured_step_s")
    run = r.get("planner") if r.get("case") != "memplan" else f"memplan {r.get('planner', '')} {r.get('run')}"
    note = error_of(r) or r.get("skipped") or ("" if graph.get("captured", True) else graph.get("reason", ""))
    return table_row((
        r["group"], run, gib(r.get("budget_bytes")), gib(r.get("measured_peak_bytes")),
        gib(r.get("measured_peak_reserved_bytes")), gib(memory.get("allocated_bytes")),
        "-" if step is None else f"{step:.4f}", "-" if not (step and base) else f"{step / base:.2f}",
        "yes" if graph.get("captured") else "-", graph.get("replays", "-"), str(note).replace("|", "/")[:140]))


def targets(rows: list[dict]) -> list[str]:
    """One line per target of issue 35: met, or missed and by how much."""
    plain = {r["group"]: r.get("measured_step_s") for r in rows if r.get("case") == "plain"}
    out = []
    for r in rows:
        if r.get("case") != "memplan" or not (r.get("cuda_graph") or {}).get("captured"):
            continue
        group, limit = r["group"], GROUPS[r["group"]][5]
        step, base, budget = r.get("measured_step_s"), plain.get(group), r.get("budget_bytes")
        if limit is not None and step and base:
            out.append(_verdict(f"{group}: captured step / plain eager step", step / base, limit))
        if budget and r.get("measured_peak_reserved_bytes"):
            out.append(_verdict(f"{group}: reserved / budget", r["measured_peak_reserved_bytes"] / budget,
                                1 + RESERVED_TOLERANCE))
        held = ((r["cuda_graph"].get("memory") or {}).get("capture") or {}).get("allocated_bytes")
        if budget and held:
            held -= r["cuda_graph"]["schedule"]["static_input_bytes"]  # the caller's batch lives beside its copy
            out.append(_verdict(f"{group}: allocated at the capture / budget", held / budget, 1 + ALLOCATED_TOLERANCE))
        layout = r["cuda_graph"]["schedule"]
        if layout["pool"] == "layout" and r.get("measured_peak_reserved_bytes"):
            out.append(_verdict(f"{group}: reserved / layout footprint", r["measured_peak_reserved_bytes"] /
                                layout["pool_bytes"], 1 + LAYOUT_TOLERANCE))
    return out


def _verdict(what: str, ratio: float, limit: float) -> str:
    return f"- {what}: {ratio:.3f} (target <= {limit:.2f}): " + ("met" if ratio <= limit else
                                                                  f"missed by {ratio / limit - 1:.1%}")


def report(out: str) -> str:
    rows = read(out, NAME)
    plain = {r["group"]: r.get("measured_step_s") for r in rows if r.get("case") == "plain"}
    lines = [f"# The planned step as a CUDA graph ({machine(rows)}; measured)", "",
             "Command: `python benchmarks/gpu_graph.py --out DIR`. Step: median of the timed steps (replays, for a "
             "captured run); allocated and reserved: the largest per-step peaks (memplan runs: of the metered steps, "
             "the warm-up and the capture; the others: of the timed steps); at capture: the allocator's peak over "
             "the capture.", "",
             "| model | run | budget GiB | allocated GiB | reserved GiB | at capture GiB | step s | x plain | "
             "captured | replays | note |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    lines += [_row(r, plain.get(r["group"])) for r in rows if r.get("case") in ("plain", "memplan", "pytorch")]
    found = targets(rows)
    lines += ["", "Targets:", *(found or ["- none measured (no captured run)"])]
    return "\n".join(lines + group_notes(rows)) + "\n"


if __name__ == "__main__":
    main(__file__, NAME, __doc__.splitlines()[0], 220, list(GROUPS), group_main, report)
