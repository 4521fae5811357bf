"""Planned training at the speed of plain PyTorch (issue 34's CPU proxy): memplan's plans beside
`torch.utils.checkpoint` at the same memory, on models whose ops are as short as a GPU's.

On one host thread, each configuration trains in a fresh process: plain (memplan `none`),
PyTorch's checkpoint around every block (`torch-checkpoint`), memplan's planners at
checkpoint's measured peak (the first round measures it), and capuchin and autoswap:doa, which
reach no less on these models, at 90% of the plain peak. Rounds alternate the order of the
configurations; a configuration's step time is the median over rounds of each run's median
timed step. Every memplan run plans on a calibrated CPU profile from a real trace whose ops
were timed, so its simulated step answers to the measured one. Reported per run: the step,
its ratio to plain and to checkpoint, the measured peak, the executor's level and per-step
counts (ops through a dispatch mode, replayed ops, regions run again), the simulated step. The
same timed steps are read on the wall clock too (a column beside: on a loaded host it carries the
other work; on a quiet one it adds time spent waiting, which the thread clock leaves out).

    python benchmarks/exec_speed.py --out benchmarks/results/exec_speed [--rounds 3] [--timed 15] [--clock cpu]
        [--cases gpt2-tiny@1] [--configs plain,torch-checkpoint,sqrt-n] [--profile PROFILE.json]

A subset (`--cases`, `--configs`) re-measures a few rows with the same alternating rounds; the
table leaves out what it did not run. `--profile` reuses a calibrated profile (else one is made).

Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_children import calibrate, run_child, write_results  # noqa: E402

CASES = {
    "gpt2-tiny@1": ("hf:gpt2", 1, {"n_layer": 6, "n_embd": 64, "n_head": 2, "vocab_size": 256, "seq_len": 64}),
    "transformer-encoder@2": ("transformer-encoder", 2, {}),
}
PLAIN, CHECKPOINT = "plain", "torch-checkpoint"
AT_CHECKPOINT = ("sqrt-n", "dtr", "save-on-cpu", "auto")  # planned at checkpoint's measured peak
LOOSER = ("capuchin", "autoswap:doa")  # they reach no less on these models: planned at LOOSER_BUDGET
LOOSER_BUDGET = "90%"
PLANNERS = AT_CHECKPOINT + LOOSER
# Every storage of these small models is under the planners' 1 MiB default: none is left out
PLANNER_PARAMS = {"auto": {"time_limit_s": 10.0, "min_bytes": 0}, "autoswap:doa": {"min_bytes": 0}}
PEAK_SLACK = 0.03  # a plan runs "at checkpoint's memory" when its measured peak is at most 3% above it
METERED = 1  # metered steps (the first, which checks the budget)


def run_one(case: str, config: str, budget, profile: str, timed: int, clock: str) -> dict:
    """One configuration in this process (the child side); `budget` as `run_workload` takes it
    (bytes, a share "90%", or "none")."""
    import torch

    torch.set_num_threads(1)
    from memplan import UNLIMITED, run_workload

    model, batch, model_config = CASES[case]
    planner = "none" if config in (PLAIN, CHECKPOINT) else config
    out = run_workload(model, batch, planner=planner, budget=budget if planner != "none" else UNLIMITED, steps=METERED,
                       timed_steps=timed, profile=profile, config=dict(model_config),
                       baseline=CHECKPOINT if config == CHECKPOINT else None,
                       planner_params=PLANNER_PARAMS.get(config), clock=clock)
    executor = out.get("executor") or {}
    per_step = (executor.get("steps_measured") or [{}])[0]
    wall = out["timed_step_s_by_clock"]["wall"]
    return {"case": case, "config": config, "step_s": out["measured_step_s"],
            "wall_step_s": statistics.median(wall) if wall else None,
            "timed_step_s": out.get("timed_step_s"), "peak_bytes": out["measured_peak_bytes"],
            "budget_bytes": budget, "simulated_step_s": out.get("simulated_step_s"),
            "level": (out.get("predicted") or {}).get("level"), "ops": out.get("trace_ops"),
            "ops_in_mode": per_step.get("ops_in_mode"), "replayed_ops": per_step.get("replayed_ops"),
            "regions_recomputed": per_step.get("regions_recomputed"), "host_s": per_step.get("host_s"),
            "diverged_steps": executor.get("diverged_steps"), "within_budget": out.get("within_budget")}


def child(case: str, config: str, budget, profile: str, timed: int, clock: str) -> dict:
    """Run one configuration in a fresh process with one host thread."""
    # the budget as text: bytes, a share ("90%"), or UNLIMITED's "none"
    return run_child(__file__, [case, config, budget, profile, timed, clock], {"case": case, "config": config})


def bench(rounds: int, timed: int, out: Path, clock: str, cases=None, configs=None, profile=None) -> dict:
    """`cases`, `configs`: the subset to run (None: all); `profile`: a calibrated profile to reuse."""
    from memplan import UNLIMITED

    profile = profile or calibrate(out)
    runs: list[dict] = []
    budgets: dict[str, int] = {}
    chosen = list(configs) if configs else [PLAIN, CHECKPOINT, *PLANNERS]
    for case in cases or CASES:
        first = child(case, CHECKPOINT, UNLIMITED, profile, timed, clock)
        runs.append({**first, "round": 0})
        budgets[case] = first["peak_bytes"]
        configs = chosen
        for r in range(rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]  # alternate who goes first
            for config in order:
                budget = budgets[case] if config in AT_CHECKPOINT else LOOSER_BUDGET if config in LOOSER else UNLIMITED
                rec = child(case, config, budget, profile, timed, clock)
                runs.append({**rec, "round": r + 1})
                print(json.dumps(runs[-1]), flush=True)
    return {"rounds": rounds, "timed_steps": timed, "clock": clock, "profile": profile, "budgets": budgets, "runs": runs,
            "cases": list(cases or CASES), "configs": chosen,
            "host": os.uname().nodename, "cpus": os.cpu_count(), "load": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def summarize(result: dict) -> list[dict]:
    """One row per (case, configuration): medians over the rounds after the first."""
    rows = []
    configs = result.get("configs") or (PLAIN, CHECKPOINT, *PLANNERS)  # results before the subset options: all
    for case in result.get("cases") or CASES:
        mine = [r for r in result["runs"] if r["case"] == case and r["round"] > 0]
        median = _medians(mine, "step_s")
        wall = _medians(mine, "wall_step_s")
        for config in configs:
            recs = [r for r in mine if r["config"] == config]
            ok = [r for r in recs if "error" not in r]
            if not ok:
                rows.append({"case": case, "config": config, "error": recs[0]["error"] if recs else "not run"})
                continue
            last = ok[-1]
            sims = [r["simulated_step_s"] for r in ok if r.get("simulated_step_s")]
            sim = statistics.median(sims) if sims else None
            rows.append({"case": case, "config": config, "budget": last["budget_bytes"], "step_s": median[config],
                         "x_plain": _ratio(median, config, PLAIN), "x_checkpoint": _ratio(median, config, CHECKPOINT),
                         "wall_step_s": wall[config], "wall_x_checkpoint": _ratio(wall, config, CHECKPOINT),
                         "peak_bytes": last["peak_bytes"], "checkpoint_peak_bytes": result["budgets"][case],
                         "at_checkpoint_memory": last["peak_bytes"] <= (1 + PEAK_SLACK) * result["budgets"][case],
                         "level": last.get("level"), "ops": last.get("ops"), "ops_in_mode": last.get("ops_in_mode"),
                         "replayed_ops": last.get("replayed_ops"), "regions_recomputed": last.get("regions_recomputed"),
                         "simulated_step_s": sim, "sim_error": None if sim is None else sim / median[config] - 1,
                         "within_budget": last.get("within_budget"), "diverged_steps": last.get("diverged_steps")})
    return rows


def _ratio(medians: dict, config: str, base: str) -> float:
    """medians[config] / medians[base] (NaN where the subset left `base` out)."""
    return medians[config] / medians.get(base, float("nan"))


def _medians(runs: list[dict], key: str) -> dict:
    """Per configuration, the median of `key` over its runs that did not fail (NaN where none did)."""
    return {c: statistics.median([r[key] for r in runs if r["config"] == c and r.get(key) is not None] or [float("nan")])
            for c in {r["config"] for r in runs}}


def markdown(result: dict, rows: list[dict]) -> str:
    lines = [f"Planned training on the CPU, one host thread (measured, {result['clock']} clock; {result['date']}, load "
             f"{', '.join(f'{x:.2f}' for x in result['load'])}; median of {result['rounds']} alternating rounds, each "
             f"run a fresh process, {result['timed_steps']} timed steps each; the same steps on the wall clock "
             f"beside)", "",
             "| model | run | budget | level | step ms | x plain | x checkpoint | wall ms | wall x checkpoint | peak MB | "
             "<= ckpt memory | ops | ops in mode | replayed ops | regions | simulated ms | sim error |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: "
             "| ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['config']} | error: {r['error']} |" + " |" * 14)
            continue
        sim = "-" if r["simulated_step_s"] is None else f"{1e3 * r['simulated_step_s']:.2f}"
        err = "-" if r["sim_error"] is None else f"{100 * r['sim_error']:+.1f}%"
        # "none": no limit (null in results written before issue 38)
        budget = r["budget"] if isinstance(r["budget"], str) or r["budget"] is None else f"{r['budget'] / 1e6:.3f} MB"
        lines.append(f"| {r['case']} | {r['config']} | {budget or '-'} | {r['level'] or '-'} | {1e3 * r['step_s']:.2f} | "
                     f"{_x(r['x_plain'])} | {_x(r['x_checkpoint'])} | {_ms(r.get('wall_step_s'))} | "
                     f"{_x(r.get('wall_x_checkpoint'))} | {r['peak_bytes'] / 1e6:.3f} | "
                     f"{'yes' if r['at_checkpoint_memory'] else 'no'} | {_n(r['ops'])} | {_n(r['ops_in_mode'])} | "
                     f"{_n(r['replayed_ops'])} | {_n(r['regions_recomputed'])} | {sim} | {err} |")
    return "\n".join(lines) + "\n"


def _n(x) -> str:
    return "-" if x is None else str(x)


def _ms(seconds) -> str:  # results written before the wall column have none
    return "-" if seconds is None or seconds != seconds else f"{1e3 * seconds:.2f}"


def _x(ratio) -> str:
    return "-" if ratio is None or ratio != ratio else f"{ratio:.2f}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        case, config, budget, profile, timed, clock = sys.argv[2:8]
        budget = int(budget) if budget.isdigit() else budget  # bytes, or "90%" or "none" as written
        print(json.dumps(run_one(case, config, budget, profile, int(timed), clock)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/exec_speed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timed", type=int, default=15)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="what steps and op times measure: the thread's CPU time (default: a shared host's "
                             "other work does not inflate it; one thread, copies inline) or wall time")
    parser.add_argument("--cases", help=f"comma-separated subset of {', '.join(CASES)} (default: all)")
    parser.add_argument("--configs", help=f"comma-separated subset of {', '.join((PLAIN, CHECKPOINT, *PLANNERS))} "
                                          "(default: all; checkpoint's first run, which sets the budget, always runs)")
    parser.add_argument("--profile", help="a calibrated CPU profile to reuse (default: calibrate one beside OUT)")
    args = parser.parse_args()
    out = Path(args.out)
    cases, configs = _subset(args.cases, CASES), _subset(args.configs, (PLAIN, CHECKPOINT, *PLANNERS))
    write_results(out, bench(args.rounds, args.timed, out, args.clock, cases, configs, args.profile), summarize,
                  markdown)


def _subset(text: str | None, known) -> list[str] | None:
    """A comma-separated list, each checked against `known` (None: all)."""
    if not text:
        return None
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in known]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)} (known: {', '.join(known)})")
    return chosen


if __name__ == "__main__":
    main()
