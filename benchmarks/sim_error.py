"""The simulator's error on the CPU: simulated vs measured step time and peak, for real.

This CPU is calibrated into a device profile (`memplan calibrate --device cpu`), each model
is traced once for real with measured op times (the least of 3 timed iterations per op), and every
(planner, budget) is planned against that trace and profile and run for real: one metered
step (warm-up; its peak is the measured peak, by the independent meter) then `--steps`
unmetered steps whose median wall time is the measured step time. Beside them: the
simulator's step time and peak for the same plan under the CPU profile. Torch runs one
thread (the host is shared; the load average before and after each run is recorded).

    .venv/bin/python benchmarks/sim_error.py [--models transformer-encoder@8,...] [--planners none,sqrt-n,...]
                                             [--budgets 0.7,0.5] [--steps 5] [--time-limit 10]

Writes benchmarks/results/sim_error.{json,md} (and the profile, sim_error_cpu_profile.json).
Step times are measured (CPU) or simulated (the calibrated CPU profile); peaks likewise.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from memplan import InfeasibleBudgetError, MemplanError, get_workload, run_workload
from memplan.services import calibrate_cpu, profile_to_json, trace_step
from memplan.fileio import atomic_write_text

RESULTS = Path(__file__).parent / "results"
MODELS = ("transformer-encoder@8", "hf:gpt2@8", "vgg11-cifar@64", "resnet18-cifar@64")
CONFIGS = {"hf:gpt2": {"n_layer": 4}}
PLANNERS = ("none", "sqrt-n", "checkpoint-all", "capuchin", "superneurons", "home:fast", "milp")
TIME_LIMITED = ("home:fast", "milp")  # planners given --time-limit seconds
BUDGETS = (0.7, 0.5)
STEPS = 5
TIME_REPEATS = 3
TIME_TARGET, PEAK_TARGET = 0.10, 0.05
SEED = 0
MIB = 2**20
log = logging.getLogger("sim_error")


def model_rows(spec: str, planners, budgets, steps: int, profile: str, time_limit: float, clock: str, rows: list,
               save) -> None:
    """Every (planner, budget) run of one model, appended to `rows`; `save()` after each.

    A budget the planner cannot meet is replaced by the smallest it can (once per planner)."""
    name, batch = spec.rsplit("@", 1)
    batch, config = int(batch), CONFIGS.get(name, {})
    w = get_workload(name, batch, seed=SEED, **config)
    trace = trace_step(w.step, w.inputs, w.model, w.optimizer, time_repeats=TIME_REPEATS, time_clock=clock)
    del w
    peak = trace.peak_load_bytes
    for planner in planners:
        smallest_run = False
        for share in ((1.0,) if planner == "none" else budgets):
            params = {"time_limit_s": time_limit} if planner in TIME_LIMITED else {}
            row = {"model": name, "batch": batch, "clock": clock, "planner": planner, "budget_share": share,
                   "load_before": _load()}
            started = time.perf_counter()
            run = lambda budget: run_workload(  # noqa: E731
                name, batch, planner=planner, budget=budget, steps=1, device="cpu", profile=profile, seed=SEED,
                config=config, trace=trace, timed_steps=steps, planner_params=params, clock=clock)
            try:
                try:
                    out = run(f"{share:.0%}")
                except InfeasibleBudgetError as exc:
                    if smallest_run:
                        continue  # the smallest feasible budget was run already
                    smallest_run = True
                    row.update(budget_share=exc.min_feasible_bytes / peak, asked_share=share, at_smallest=True)
                    out = run(exc.min_feasible_bytes)
                row.update(_figures(out))
            except MemplanError as exc:
                row["error"] = str(exc).splitlines()[0]
            row.update(load_after=_load(), wall_s=round(time.perf_counter() - started, 1))
            log.info("%s", row)
            rows.append(row)
            save()


def _figures(out: dict) -> dict:
    sim_t, meas_t = out["simulated_step_s"], out["measured_step_s"]
    sim_p, meas_p = out["simulated_peak_bytes"], out["measured_peak_bytes"]
    return {"budget_bytes": out["budget_bytes"], "simulated_step_s": sim_t, "measured_step_s": meas_t,
            "timed_step_s": out["timed_step_s"], "time_error": meas_t / sim_t - 1 if sim_t else None,
            # the least contended step: on a shared host, noise only ever adds time
            "time_error_min": min(out["timed_step_s"]) / sim_t - 1 if sim_t else None,
            "simulated_peak_bytes": sim_p, "measured_peak_bytes": meas_p,
            "peak_error": meas_p / sim_p - 1 if sim_p else None, "op_times": out["op_times"],
            "replayed_ops": out["executor"]["replayed_ops"], "swapped_out": out["executor"]["swapped_out"],
            # seconds the main thread waited for the copy workers, over all steps of the run
            "prefetch_wait_s": out["executor"].get("prefetch_wait_s"),
            "release_wait_s": out["executor"].get("release_wait_s"),
            "simulated_breakdown": out["predicted"].get("breakdown")}


def _earlier(models: list[str], clock: str) -> tuple[list[dict], list[str]]:
    """Rows of other models (or clocks) from the results file, and the commands that made them."""
    try:
        data = json.loads((RESULTS / "sim_error.json").read_text())
    except (OSError, ValueError):
        return [], []
    rows = [r for r in data.get("rows", []) if r["model"] not in models or r.get("clock", "wall") != clock]
    return rows, data.get("commands", []) if rows else []


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def write(rows: list[dict], meta: dict) -> None:
    data = {**meta, "rows": rows}
    atomic_write_text(RESULTS / "sim_error.json", json.dumps(data, indent=1) + "\n")
    atomic_write_text(RESULTS / "sim_error.md", markdown(rows, meta))


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# Simulator error on the CPU (measured (CPU) vs simulated ({meta['profile_name']}))", "",
             "Commands (rows of models or clocks not re-run are kept from the earlier commands; each command "
             "calibrates the CPU anew):", "",
             *[f"- `{c}`" for c in meta["commands"]], "",
             f"CPU: {meta['cpu']}; torch {meta['torch']}, {meta['threads']} thread. The host is shared with other "
             f"sessions: 1-minute load average {meta['load_start']} at the start of the last command, "
             f"{meta['load_end']} at its end (per run in the JSON and the table). Measured step: median of "
             f"{meta['steps']} unmetered steps after one metered warm-up step; measured peak: the independent "
             f"meter in that step. Simulated: the plan's step program under the calibrated CPU profile, with the "
             f"trace's measured op times (least of {TIME_REPEATS} iterations). A budget marked * is the "
             f"planner's smallest feasible one (the asked share was infeasible).", ""]
    for clock in sorted({r.get("clock", "wall") for r in rows}, reverse=True):
        lines += _clock_table([r for r in rows if r.get("clock", "wall") == clock], clock)
    return "\n".join(lines) + "\n"


def _clock_table(rows: list[dict], clock: str) -> list[str]:
    ok = [r for r in rows if "error" not in r]
    time_hits = sum(abs(r["time_error"]) <= TIME_TARGET for r in ok)
    peak_hits = sum(abs(r["peak_error"]) <= PEAK_TARGET for r in ok)
    what = "wall clock" if clock == "wall" else "main thread's CPU time (op times and steps alike)"
    lines = [f"## Times on the {what}", "",
             f"Within the targets: step time (10%) {time_hits}/{len(ok)}, peak (5%) {peak_hits}/{len(ok)}.", "",
             "| model | batch | planner | budget | simulated step (s) | measured step (s) | time error | "
             "error of the fastest step | simulated peak (MiB) | measured peak (MiB) | peak error | replayed ops | "
             "swaps | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = "*" if r.get("at_smallest") else ""
        head = f"| {r['model']} | {r['batch']} | {r['planner']} | {r['budget_share']:.0%}{mark} |"
        if "error" in r:
            lines.append(f"{head} {r['error']} | | | | | | | | | {r['load_before']} |")
            continue
        lines.append(f"{head} {r['simulated_step_s']:.3f} | {r['measured_step_s']:.3f} | {r['time_error']:+.1%} | "
                     f"{r['time_error_min']:+.1%} | {r['simulated_peak_bytes'] / MIB:.1f} | "
                     f"{r['measured_peak_bytes'] / MIB:.1f} | {r['peak_error']:+.2%} | {r['replayed_ops']} | "
                     f"{r['swapped_out']} | {r['load_before']} |")
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="name@batch, comma-separated")
    ap.add_argument("--planners", default=",".join(PLANNERS))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="shares of the traced peak")
    ap.add_argument("--steps", type=int, default=STEPS, help="unmetered timed steps per run")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds for home:fast and milp")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="op and step times on the wall clock, or the main thread's CPU time (see memplan.tracing."
                         "optimes): on a shared host the CPU time is not inflated by the other sessions' work")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    profile = calibrate_cpu()
    profile_path = RESULTS / "sim_error_cpu_profile.json"
    atomic_write_text(profile_path, json.dumps(profile_to_json(profile), indent=1) + "\n")
    command = "python benchmarks/sim_error.py " + " ".join(argv if argv is not None else sys.argv[1:])
    models = [spec.rsplit("@", 1)[0] for spec in args.models.split(",")]
    kept, commands = _earlier(models, args.clock)
    meta = {"commands": commands + [command],
            "cpu": profile.description, "profile_name": profile.name, "profile": profile_to_json(profile),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "steps": args.steps,
            "load_start": _load(), "load_end": None}
    rows: list[dict] = list(kept)

    def save():
        write(rows, {**meta, "load_end": _load()})

    for spec in args.models.split(","):
        model_rows(spec, args.planners.split(","), [float(b) for b in args.budgets.split(",")], args.steps,
                   str(profile_path), args.time_limit, args.clock, rows, save)
    meta["load_end"] = _load()
    write(rows, meta)
    ok = [r for r in rows if "error" not in r]
    if ok:  # over every row in the file
        print(f"median |time error| {statistics.median(abs(r['time_error']) for r in ok):.1%}, "
              f"median |peak error| {statistics.median(abs(r['peak_error']) for r in ok):.2%} over {len(ok)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
