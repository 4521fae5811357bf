"""Real training on CPU under every planner's step program: measured peak against budget and simulation.

For each model, every registered planner is planned at 70% and 50% of the traced peak and
at its smallest feasible budget, compiled into its step program (h100 cost model), and run
for real on this CPU (one thread) for a few steps. Every step's peak is measured by the
independent meter (memplan.exec.meter) and compared with the budget and with the program's
simulated peak; the parameters after the steps are compared with plain training from the
same seed. Also reported: what executability costs in simulation (the op-level plan's
simulated overhead against the compiled program's) and the run-time cost of the executor's
dispatch-level points (a step under the `none` program against a plain step).

    .venv/bin/python benchmarks/exec_memory.py [--models vgg11-cifar@32,...] [--planners sqrt-n,...]

Writes benchmarks/results/exec_memory.{json,md}. Memory figures are measured; overheads
are simulated (the h100 profile), step times measured on this CPU.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

import memplan
from memplan import DEFAULT_PROFILE, InfeasibleBudgetError, Problem, get_workload, known_planners, optimize
from memplan.services import BUDGET_TOLERANCE, Metering, measure_steps, plan_problem
from memplan.fileio import atomic_write_text

RESULTS = Path(__file__).parent / "results"
MODELS = ("resnet18-cifar@32", "vgg11-cifar@32", "hf:gpt2@4", "transformer-encoder@8")
CONFIGS = {"hf:gpt2": {"n_layer": 4}}
SHARES = (0.7, 0.5)
STEPS = 3
SEED = 0
MIB = 2**20
log = logging.getLogger("exec_memory")


def model_rows(spec: str, planners: list[str], steps: int, save=lambda rows: None) -> list[dict]:
    """Every (planner, budget) run of one model; `save(rows)` after each planner."""
    name, batch = spec.rsplit("@", 1)
    batch, config = int(batch), CONFIGS.get(name, {})
    reference, plain_s = _plain(name, batch, config, steps)
    w = get_workload(name, batch, seed=SEED, **config)
    trace = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, measure=False).trace
    problem = Problem.of(trace, profile=DEFAULT_PROFILE, seed=SEED)
    rows, done = [], {}
    for planner in planners:
        for budget, made in _plans(problem, planner):
            key = made.decisions
            if key in done:  # same decisions as another planner (X+smartpool, pool-only planners): same run
                rows.append({**done[key], "planner": planner, "budget": budget, "same_run_as": done[key]["planner"]})
                continue
            row = _run(name, batch, config, trace, made, reference, steps)
            row.update(model=spec, planner=planner, budget=budget, plain_step_s=plain_s)
            done[key] = row
            rows.append(row)
            log.info("%s %s %s: measured %.1f MiB, simulated %.1f MiB, budget %.1f MiB", spec, planner, budget,
                     row["measured_peak_bytes"] / MIB, row["simulated_peak_bytes"] / MIB, row["budget_bytes"] / MIB)
        save(rows)
    return rows


def _plans(problem: Problem, planner: str):
    """(budget label, plan) at 70%, 50% and the smallest feasible budget, where the planner can."""
    out, seen = [], set()
    labels = [(f"{s:.0%}", int(s * problem.trace.peak_load_bytes)) for s in SHARES] + [("min", 1)]
    while labels:
        label, budget = labels.pop(0)
        try:
            made = plan_problem(problem.at(budget), planner)
        except InfeasibleBudgetError as exc:
            if label == "min":
                labels.append(("min", exc.min_feasible_bytes))
            continue
        if made.budget_bytes not in seen:
            seen.add(made.budget_bytes)
            out.append((label, made))
    return out


def _run(name, batch, config, trace, made, reference, steps) -> dict:
    program = memplan.compile(trace, made, DEFAULT_PROFILE)
    w = get_workload(name, batch, seed=SEED, **config)
    step = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, trace=trace, plan=made, measure=False)
    records = measure_steps(step, lambda i: w.make_inputs(batch, seed=SEED + 1 + i), steps, w.model, w.optimizer,
                            SEED, Metering(host=step.runtime.host_buffers()))
    stats = step.stats()
    step.close()
    measured = [r["measured_peak_bytes"] for r in records]
    simulated = program.predicted.peak_load_bytes
    return {"budget_bytes": made.budget_bytes, "simulated_peak_bytes": simulated, "measured_peak_bytes": max(measured),
            "measured_per_step": measured, "within_budget": max(measured) <= made.budget_bytes * (1 + BUDGET_TOLERANCE),
            "within_2pct_of_simulated": all(abs(m - simulated) <= BUDGET_TOLERANCE * simulated for m in measured),
            "max_param_diff": _diff(w.model, reference), "decisions": len(made.decisions),
            "plan_overhead": made.predicted.get("overhead"), "program_overhead": program.predicted.overhead,
            "planning_s": made.planning_s, "step_s": statistics.median(r["time_s"] for r in records),
            "diverged_steps": stats["diverged_steps"], "unresolved": stats["unresolved"],
            "recomputed": stats["recomputed"], "swapped_out": stats["swapped_out"]}


def _plain(name, batch, config, steps) -> tuple[list, float]:
    """Parameters after plain training from the same seed, and its median step time."""
    w = get_workload(name, batch, seed=SEED, **config)
    records = measure_steps(w.step, lambda i: w.make_inputs(batch, seed=SEED + 1 + i), steps, w.model, w.optimizer,
                            SEED)
    return [p.detach().clone() for p in w.model.parameters()], statistics.median(r["time_s"] for r in records)


def dispatch_cost(spec: str, rounds: int = 9) -> dict:
    """Median step time of plain training and of the same steps under the `none` program (the
    executor's dispatch-level points with nothing to do), neither with a memory meter; the two
    alternate step by step so that a busy host slows both alike."""
    name, batch = spec.rsplit("@", 1)
    batch, config = int(batch), CONFIGS.get(name, {})
    plain, w = get_workload(name, batch, seed=SEED, **config), get_workload(name, batch, seed=SEED, **config)
    planned = optimize(w.step, *w.inputs, model=w.model, optimizer=w.optimizer, measure=False)
    x = plain.make_inputs(batch, seed=SEED + 1)
    samples = {"plain_s": [], "planned_s": []}
    for k in range(rounds + 1):
        for key, step in (("plain_s", plain.step), ("planned_s", planned)):
            started = time.perf_counter()
            step(*x)
            if k:  # the first round warms up
                samples[key].append(time.perf_counter() - started)
    ops = len(planned.trace.ops)
    planned.close()
    times = {key: statistics.median(v) for key, v in samples.items()}
    return {"model": spec, "ops": ops, **times, "per_op_us": (times["planned_s"] - times["plain_s"]) / ops * 1e6,
            "ratio": times["planned_s"] / times["plain_s"], "load_avg": os.getloadavg()[0]}


def _diff(model, reference) -> float:
    return max(float((p.detach().double() - r.double()).abs().max()) for p, r in zip(model.parameters(), reference))


def summary(rows: list[dict]) -> str:
    """One line per model: runs kept within budget and at the simulated peak, parameter
    agreement, and what executability costs (program overhead minus the op-level plan's)."""
    lines = ["| model | distinct runs | within budget + 2%, every step | measured = simulated (every step) | "
             "largest measured / budget | bit-identical (others: max param diff) | "
             "executability cost (sim. overhead, program - plan): max |",
             "|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        fresh = [r for r in rows if r["model"] == model and "same_run_as" not in r and "error" not in r]
        exact = [r for r in fresh if r["max_param_diff"] == 0.0]
        others = max((r["max_param_diff"] for r in fresh if r not in exact), default=None)
        same = sum(all(m == r["simulated_peak_bytes"] for m in r["measured_per_step"]) for r in fresh)
        cost = max((r["program_overhead"] - r["plan_overhead"] for r in fresh
                    if r["program_overhead"] is not None and r["plan_overhead"] is not None), default=0.0)
        lines.append(f"| {model} | {len(fresh)} | {sum(r['within_budget'] for r in fresh)} | {same} | "
                     f"{max(r['measured_peak_bytes'] / r['budget_bytes'] for r in fresh):.4f} | {len(exact)}"
                     f"{'' if others is None else f' ({others:.2g})'} | {cost:+.2%} |")
    return "\n".join(lines) + "\n"


def to_markdown(rows: list[dict], costs: list[dict]) -> str:
    """The summary, the executor's dispatch cost per model, and the full table."""
    fresh = [r for r in rows if "same_run_as" not in r and "error" not in r]
    ok = sum(r["within_budget"] and r["within_2pct_of_simulated"] for r in fresh)
    worst = max((r["measured_peak_bytes"] / r["budget_bytes"] - 1 for r in fresh), default=0.0)
    exact = sum(r["max_param_diff"] == 0.0 for r in fresh)
    lines = [f"{len(fresh)} distinct runs ({len(rows)} planner x budget cells): {ok} within budget + 2% in every step "
             f"and within 2% of the simulated peak; largest measured/budget - 1: {worst:+.2%}; "
             f"{exact} bit-identical to plain training.\n",
             "| model | planner | budget | budget MiB | simulated MiB | measured MiB (per step) | within | "
             "max param diff | overhead plan / program (sim.) | step s (plain s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    head = ["| model | ops per step | plain step s | under the `none` program s | ratio | cost per op (us) | "
            "load avg |", "|---|---|---|---|---|---|---|"]
    head += [f"| {c['model']} | {c['ops']} | {c['plain_s']:.3f} | {c['planned_s']:.3f} | {c.get('ratio', 0):.3f} | "
             f"{c['per_op_us']:.1f} | {c.get('load_avg', 0):.1f} |" for c in costs]
    lines = lines[:1] + [summary(rows), "Run-time cost of the executor's dispatch-level points (median of 9 steps "
                         "each, plain and planned alternating, no meter; one thread):\n"] + head + [""] + lines[1:]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['planner']} | {r['budget']} | error: {r['error']} |||||||")
            continue
        same = f" (= {r['same_run_as']})" if "same_run_as" in r else ""
        per_step = ", ".join(f"{m / MIB:.2f}" for m in r["measured_per_step"])
        lines.append(f"| {r['model']} | {r['planner']}{same} | {r['budget']} | {r['budget_bytes'] / MIB:.2f} | "
                     f"{r['simulated_peak_bytes'] / MIB:.2f} | {per_step} | "
                     f"{'yes' if r['within_budget'] and r['within_2pct_of_simulated'] else 'NO'} | "
                     f"{r['max_param_diff']:.3g} | {_pct(r['plan_overhead'])} / {_pct(r['program_overhead'])} | "
                     f"{r['step_s']:.2f} ({r['plain_step_s']:.2f}) |")
    return "\n".join(lines) + "\n"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1%}"


def main() -> None:
    """Run every model and planner; write the JSON and the Markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--planners", default="")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--out", default=str(RESULTS / "exec_memory"))
    ap.add_argument("--dispatch-only", action="store_true",
                    help="re-measure only the dispatch cost, keeping the rows in the output JSON")
    ap.add_argument("--resume", action="store_true",
                    help="keep the (model, planner) rows already in the output JSON; run the rest")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    planners = args.planners.split(",") if args.planners else sorted(known_planners())
    rows, costs, started = [], [], time.perf_counter()
    if (args.resume or args.dispatch_only) and Path(args.out + ".json").exists():
        saved = json.loads(Path(args.out + ".json").read_text())
        costs, rows = saved["dispatch_cost"], saved["rows"]
    write = lambda: atomic_write_text(args.out + ".json",  # noqa: E731
                                      json.dumps({"dispatch_cost": costs, "rows": rows}, indent=1) + "\n")
    if args.dispatch_only:
        costs[:], planners = [dispatch_cost(spec) for spec in args.models.split(",")], []
        write()
    for spec in args.models.split(","):
        if not any(c["model"] == spec for c in costs):
            costs.append(dispatch_cost(spec))
        kept = [r for r in rows if r["model"] != spec]
        todo = [p for p in planners if not any(r["model"] == spec and r["planner"] == p for r in rows)]
        if not todo:
            continue
        earlier = [r for r in rows if r["model"] == spec]

        def save(new, kept=kept, earlier=earlier):
            rows[:] = kept + earlier + new
            write()

        model_rows(spec, todo, args.steps, save)
    log.info("done in %.0f s", time.perf_counter() - started)
    atomic_write_text(args.out + ".md", to_markdown(rows, costs))


if __name__ == "__main__":
    main()
