"""`memplan demo`: the main job on embedded defaults, no GPU needed.

Traces a few zoo models with fake tensors, plans each with `auto` (the planner to start
with) and every other registered planner that is quick at a budget below its unconstrained
peak, simulates every plan on a GPU profile, prints a table and writes the memory-load plots.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import InfeasibleBudgetError, MemplanError
from ..fileio import make_output_folder
from ..problem import DEFAULT_PROFILE
from ..units import format_bytes
from .base import command
from .options import add_json_flag, budget_option, output_folder
from .output import emit_json, print_table

log = logging.getLogger(__name__)

DEMO_MODELS = (("resnet50", 64), ("vgg16-cifar", 100), ("hf:gpt2", 8))
DEMO_BUDGET = "70%"
DEMO_OUT = "memplan-demo"
# Left out: searches that take minutes with their defaults (home:fast runs home's search under a time
# limit; dqn:pretrained runs the shipped policy that dqn would fine-tune for a minute per model), their
# refined forms (20 s each; auto runs them when it has the time) and milp, a reference whose solves
# take a minute each (its time limit) on these models.
LEFT_OUT = ("home", "dqn", "milp", "home:seeded", "dqn:refined")
LEAD = "auto"  # the demo leads with the planner to start with
LEAD_PARAMS = {"time_limit_s": 10.0}  # auto's search per model in the demo (its default is 20 s)


@command("demo")
def add_demo(sub) -> None:
    """Register `memplan demo`."""
    p = sub.add_parser("demo", help="trace, plan and simulate a few zoo models (no GPU needed)")
    p.add_argument("--out", type=output_folder, default=DEMO_OUT,
                   help=f"folder for the traces and plots (made if missing; its parent must exist; default {DEMO_OUT})")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="the GPU profile to simulate on")
    p.add_argument("--budget", type=budget_option, default=DEMO_BUDGET,
                   help="memory budget, bytes or share of the peak")
    p.add_argument("--models", default=",".join(f"{m}@{b}" for m, b in DEMO_MODELS),
                   help="comma-separated MODEL@BATCH list")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Trace, plan and simulate every demo model; print and plot the results."""
    from .. import known_planners

    models = _parse_models(args.models)
    _check_options(models, args)
    out = make_output_folder(args.out)
    # The demo compares what moves tensors (pool layouts and convolution micro-batches matter on a GPU).
    planners = [name for name, spec in known_planners().items() if spec.decides <= {"swap", "recompute"}
                and name not in LEFT_OUT]
    planners.sort(key=lambda name: name != LEAD)
    rows = []
    for model, batch in models:
        rows += _demo_model(model, batch, planners, args, out)
    if args.json:
        emit_json({"profile": args.profile, "budget": str(args.budget), "rows": rows})
    else:
        _print_table(rows, args)
    return 0


def _parse_models(text: str) -> list[tuple[str, int]]:
    models = []
    for item in text.split(","):
        name, _, batch = item.strip().partition("@")
        if not batch.isdigit() or int(batch) < 1:
            raise MemplanError(f"--models: expected MODEL@BATCH with a batch of at least 1, got {item!r}")
        models.append((name, int(batch)))
    return models


def _check_options(models: list[tuple[str, int]], args) -> None:
    """Every option checked before the first model is traced (the budget, when it was parsed)."""
    from .. import get_profile  # torch takes a second to import: only commands with models pay
    from ..services import check_model_name

    get_profile(args.profile)
    for model, _ in models:
        check_model_name(model)


def _demo_model(model: str, batch: int, planners: list[str], args, out: Path) -> list[dict]:
    from .. import plan, simulate, trace_workload, write_trace  # trace_workload: torch (see _check_options)
    from ..plots import plot_load_curves
    from ..problem import Problem

    log.info("tracing %s at batch %d with fake tensors", model, batch)
    trace = trace_workload(model, batch, fake=True)
    stem = model.replace(":", "_")
    write_trace(trace, out / f"{stem}.jsonl")
    cost = Problem.of(trace, profile=args.profile).cost
    rows, results = [], {}
    for name in planners:
        row = {"model": model, "batch": batch, "planner": name, "peak_bytes": trace.peak_load_bytes}
        try:
            result_plan = plan(trace, args.budget, planner=name, cost=cost, simulate_result=False,
                               **(LEAD_PARAMS if name == LEAD else {}))
        except InfeasibleBudgetError as exc:
            rows.append({**row, "feasible": False, "min_feasible_bytes": exc.min_feasible_bytes})
            continue
        sim = simulate(trace, result_plan, cost=cost, budget=result_plan.budget_bytes, timeline=True)
        results[name] = sim
        rows.append({**row, "feasible": sim.feasible, "budget_bytes": result_plan.budget_bytes,
                     "plan_peak_bytes": sim.peak_load_bytes, "overhead": sim.overhead if sim.feasible else None,
                     "planning_s": result_plan.planning_s})
    plot_load_curves(f"{model} batch {batch}: memory load under each plan ({args.profile}, simulated)",
                     trace, cost, results, out / f"{stem}_load.png")
    return rows


def _print_table(rows: list[dict], args) -> None:
    print(f"profile {args.profile}, budget {args.budget} of each model's unconstrained peak (simulated)")
    table = []
    for r in rows:
        if r["feasible"]:
            cells = (format_bytes(r["plan_peak_bytes"]), f"{r['overhead']:.1%}", f"{r['planning_s']:.2f}")
        else:
            need = format_bytes(r["min_feasible_bytes"]) if "min_feasible_bytes" in r else "?"
            cells = (f"infeasible (needs {need})", "", "")
        table.append((r["model"], r["planner"], format_bytes(r["peak_bytes"]), *cells))
    print_table(("model", "planner", "peak", "plan peak", "overhead", "plan s"), table, left=2)
    print(f"plots and traces in {args.out}/")
