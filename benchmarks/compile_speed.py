"""memplan inside torch.compile (issue 47's CPU figures): a byte budget kept by PyTorch's own
partitioner, beside torch.compile's `activation_memory_budget` and memplan's own eager executor.

Per model, on one host thread, each configuration in a fresh process (`run_workload`):

- `compiled`: plain torch.compile (activation_memory_budget 1.0): its measured peak is the top of
  the budgets; `eager`: plain eager training.
- the least that recompute reaches compiled: `auto` (recompute only: the CPU cannot offload) at
  the smallest load it plans for, lowered once, measured (no plan made again to fill the budget).
- `memplan`: `auto` lowered onto the partitioner (`run_workload(compile=True)`) at six budgets from
  the plain compiled peak down to that least peak; each budget kept in measured bytes (at most two
  compilations).
- `compile-budget:F`: torch.compile with activation_memory_budget F, for F swept from 1.0 down;
  beside each memplan run, the fastest of them whose peak is within 3% of memplan's and within
  memplan's budget (+2%): the same memory, the same budget kept.
- `memplan-eager`: `auto` at the same budgets, run by memplan's eager executor (hooked).

Every memplan run plans on a calibrated CPU profile from a real trace whose ops were timed.
Step times are the median of the timed steps on this thread's CPU clock (other work on the host
does not inflate them); compilation time is excluded from them and reported per run (the first
call of each compiled plan). Peaks are the allocator meter's (it sees what Inductor allocates).

    python benchmarks/compile_speed.py --out benchmarks/results/compile_speed [--timed 15] [--cases ...]

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
    "resnet18-cifar@32": ("resnet18-cifar", 32, {}),
}
BUDGETS = 6  # memplan's budgets per model, from the plain compiled peak down to the least recompute reaches
FRACTIONS = (1.0, 0.8, 0.6, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02)  # compile-budget's sweep
SAME_MEMORY = 0.03  # two peaks within 3% are the same memory
PLANNER_PARAMS = {"time_limit_s": 10.0}
COMPILED = ("memplan", "memplan-check")  # memplan's compiled runs (the second also checks its parameters)
CHECKED = 2  # the budget (0: the top) whose run also trains plainly compiled and compares the parameters
LEAST_TRIES = 4  # loads tried for the least that recompute reaches
METERED = 3  # metered steps: the first compiles, a second may compile a plan made again; then settled
OVER = 0.02  # a peak within the budget + 2% keeps it


def run_one(case: str, config: str, budget, profile: str, timed: int) -> dict:
    """One configuration in this process (the child side)."""
    import torch

    torch.set_num_threads(1)
    if config == "least":
        return _least(case, profile)
    from memplan import UNLIMITED, run_workload

    model, batch, model_config = CASES[case]
    memplan = config in ("memplan", "memplan-check", "memplan-eager")
    out = run_workload(model, batch, planner="auto" if memplan else "none", budget=budget if memplan else UNLIMITED,
                       steps=METERED, timed_steps=timed, profile=profile, config=dict(model_config),
                       baseline=None if memplan or config == "eager" else config, clock="cpu",
                       planner_params=PLANNER_PARAMS if memplan else None, compile=config in COMPILED,
                       check=config == "memplan-check")
    executor = out.get("executor") or {}
    compilations = executor.get("compilations") or []
    return {"case": case, "config": config, "budget_bytes": budget if memplan else None,
            "step_s": out["measured_step_s"], "peak_bytes": max(r["measured_peak_bytes"]
                                                                 for r in out["steps"][out["final_plan_from_step"]:]),
            "within_budget": out["within_budget"] if memplan else None, "meter": out["steps"][-1]["meter"],
            "simulated_step_s": out.get("simulated_step_s"), "simulated_peak_bytes": out.get("simulated_peak_bytes"),
            "level": (out.get("predicted") or {}).get("level"), "compilations": len(compilations),
            "compile_s": [round(c.get("first_call_s") or 0.0, 1) for c in compilations] or
                         ([round(out["step_time_s"][0], 1)] if config.startswith("compile") else []),
            "decisions_lowered": [c["decisions_lowered"] for c in compilations],
            "decisions_not_lowered": [sum(c["decisions_not_lowered"].values()) for c in compilations],
            "replanned": out.get("replanned"), "max_param_diff": out.get("max_param_diff")}


def _least(case: str, profile: str) -> dict:
    """The least measured peak recompute reaches compiled: auto's plan at its smallest load, lowered once."""
    from memplan import InfeasibleBudgetError, get_workload, optimize
    from memplan.services import Metering, measure_steps

    model, batch, model_config = CASES[case]
    w = get_workload(model, batch, device="cpu", seed=0, **model_config)
    options = dict(model=w.model, optimizer=w.optimizer, planner="auto", profile=profile, compile=True, measure=False,
                   time_repeats=3, clock="cpu", **PLANNER_PARAMS)
    budget = 1
    for _ in range(LEAST_TRIES):  # a search may name a load it then misses: the next one it names
        try:
            step = optimize(w.step, *w.inputs, budget=budget, **options)
            break
        except InfeasibleBudgetError as exc:
            budget = exc.min_feasible_bytes
    else:
        step = optimize(w.step, *w.inputs, budget=budget, **options)
    records = measure_steps(step, lambda i: w.make_inputs(batch, seed=1 + i), 2, w.model, w.optimizer, 0, Metering(compiled=True))
    return {"case": case, "config": "least", "budget_bytes": step.plan.budget_bytes,
            "peak_bytes": records[-1]["measured_peak_bytes"], "decisions": len(step.plan.decisions)}


def child(case: str, config: str, budget, profile: str, timed: int) -> dict:
    """Run one configuration in a fresh process with one host thread."""
    return run_child(__file__, [case, config, budget, profile, timed],
                     {"case": case, "config": config, "budget_bytes": budget})


def bench(cases: list[str], timed: int, out: Path) -> dict:
    profile = calibrate(out)
    runs: list[dict] = []

    def record(case: str, config: str, budget=None) -> dict:
        runs.append(child(case, config, budget, profile, timed))
        print(json.dumps(runs[-1]), flush=True)
        return runs[-1]

    for case in cases:
        top = record(case, "compile-budget:1.0")
        record(case, "eager")
        least = record(case, "least")
        if "error" in top or "error" in least:
            continue
        high, low = top["peak_bytes"], min(least["peak_bytes"], top["peak_bytes"])
        for k in range(BUDGETS):
            budget = int(round(high - (high - low) * k / (BUDGETS - 1)))
            record(case, "memplan-check" if k == CHECKED else "memplan", budget)
            record(case, "memplan-eager", budget)
        for fraction in FRACTIONS[1:]:
            record(case, f"compile-budget:{fraction}")
    return {"timed_steps": timed, "clock": "cpu", "profile": profile, "runs": runs, "host": os.uname().nodename,
            "cpus": os.cpu_count(), "load": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}


def summarize(result: dict) -> list[dict]:
    """Per memplan budget: its compiled run beside compile-budget at the same memory and the eager plan."""
    rows = []
    for case in dict.fromkeys(r["case"] for r in result["runs"]):
        mine = [r for r in result["runs"] if r["case"] == case and "error" not in r]
        budgets = [r for r in mine if r["config"].startswith("compile-budget")]
        eager = {r["budget_bytes"]: r for r in result["runs"] if r["case"] == case and r["config"] == "memplan-eager"}
        plain = next((r for r in mine if r["config"] == "eager"), None)
        for run in (r for r in result["runs"] if r["case"] == case and r["config"] in COMPILED):
            rows.append(_row(case, run, budgets, eager.get(run["budget_bytes"]), plain))
    return rows


def _row(case: str, run: dict, budgets: list[dict], eager: dict | None, plain: dict | None) -> dict:
    row = {"case": case, "budget_bytes": run["budget_bytes"], "error": run.get("error")}
    if "error" in run:
        return row
    peak = run["peak_bytes"]  # compile-budget at the same memory: within 3% of memplan's peak, and within its budget
    same = [b for b in budgets if abs(b["peak_bytes"] - peak) <= peak * SAME_MEMORY
            and b["peak_bytes"] <= run["budget_bytes"] * (1 + OVER)]
    rival = min(same, key=lambda b: b["step_s"]) if same else None
    row.update({k: run.get(k) for k in ("peak_bytes", "step_s", "simulated_step_s", "simulated_peak_bytes",
                                    "compilations", "compile_s", "decisions_lowered", "decisions_not_lowered",
                                    "max_param_diff")})
    row["within_budget"] = peak <= run["budget_bytes"] * (1 + OVER)
    row["compile_budget"] = None if rival is None else rival["config"].split(":")[1]
    row["compile_budget_peak_bytes"] = None if rival is None else rival["peak_bytes"]
    row["x_compile_budget"] = None if rival is None else run["step_s"] / rival["step_s"]
    usable = eager is not None and "error" not in eager
    row["eager_step_s"] = eager["step_s"] if usable else None
    row["eager_error"] = eager.get("error") if eager is not None and not usable else None
    row["x_eager"] = run["step_s"] / eager["step_s"] if usable else None
    row["x_plain_eager"] = run["step_s"] / plain["step_s"] if plain else None
    return row


def monotone(rows: list[dict]) -> dict[str, bool]:
    """Per model: whether memplan's measured peaks fall as its budgets do."""
    out = {}
    for case in dict.fromkeys(r["case"] for r in rows):
        peaks = [r["peak_bytes"] for r in sorted((r for r in rows if r["case"] == case and not r.get("error")),
                                                 key=lambda r: -r["budget_bytes"])]
        out[case] = all(a >= b for a, b in zip(peaks, peaks[1:]))
    return out


def markdown(result: dict, rows: list[dict]) -> str:
    lines = [f"memplan compiled beside torch.compile's activation_memory_budget and memplan's eager executor "
             f"(measured, CPU, one thread, cpu clock; {result['date']}, load "
             f"{', '.join(f'{x:.2f}' for x in result['load'])}; median of {result['timed_steps']} timed steps, each "
             f"configuration a fresh process)", "",
             "| model | budget MB | peak MB | within | step ms | compile s | lowered (not) | compile-budget F at that "
             "memory | its peak MB | x compile-budget | eager plan ms | x eager plan | x plain eager | simulated ms |",
             "| --- | ---: | ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['case']} | {r['budget_bytes'] / 1e6:.3f} | error: {r['error']} |" + " |" * 11)
            continue
        lowered = ", ".join(f"{a} ({b})" for a, b in zip(r["decisions_lowered"], r["decisions_not_lowered"]))
        lines.append(
            f"| {r['case']} | {r['budget_bytes'] / 1e6:.3f} | {r['peak_bytes'] / 1e6:.3f} | "
            f"{'yes' if r['within_budget'] else 'NO'} | {1e3 * r['step_s']:.2f} | "
            f"{', '.join(map(str, r['compile_s']))} | {lowered} | {r['compile_budget'] or 'none reaches'} | "
            f"{_mb(r['compile_budget_peak_bytes'])} | {_x(r['x_compile_budget'])} | {_ms(r['eager_step_s'])} | "
            f"{_x(r['x_eager'])} | {_x(r['x_plain_eager'])} | {_ms(r['simulated_step_s'])} |")
    checked = [r for r in rows if r.get("max_param_diff") is not None]
    lines += ["", "Peaks monotone in the budget: " + ", ".join(f"{c} {'yes' if ok else 'NO'}"
                                                                 for c, ok in monotone(rows).items()), "",
              "Parameters after the run's steps against plain torch.compile training from the same seed (largest "
              "difference): " + ", ".join(f"{r['case']} at {r['budget_bytes'] / 1e6:.3f} MB {r['max_param_diff']:.3g}"
                                          for r in checked), "",
              "compile-budget's sweep (fraction: measured peak MB, step ms):", ""]
    for case in dict.fromkeys(r["case"] for r in result["runs"]):
        points = [r for r in result["runs"] if r["case"] == case and r["config"].startswith("compile-budget")]
        lines.append(f"- {case}: " + "; ".join(
            f"{p['config'].split(':')[1]}: " + (f"{p['peak_bytes'] / 1e6:.3f}, {1e3 * p['step_s']:.2f}"
                                                if "error" not in p else f"error ({p['error']})") for p in points)
            + f"; {_rises(points)}")
    return "\n".join(lines) + "\n"


def _rises(points: list[dict]) -> str:
    """Where compile-budget's peak rises as its fraction falls (it is not a bound, nor monotone)."""
    ok = [p for p in points if "error" not in p]
    rises = [f"{b['config'].split(':')[1]} above {a['config'].split(':')[1]}" for a, b in zip(ok, ok[1:])
             if b["peak_bytes"] > a["peak_bytes"]]
    return "not monotone: " + ", ".join(rises) if rises else "monotone"


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:.3f}"


def _ms(x) -> str:
    return "-" if x is None else f"{1e3 * x:.2f}"


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        case, config, budget, profile, timed = sys.argv[2:7]
        budget = int(budget) if budget.isdigit() else None
        print(json.dumps(run_one(case, config, budget, profile, int(timed))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/compile_speed")
    parser.add_argument("--timed", type=int, default=15)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args()
    out = Path(args.out)
    write_results(out, bench(args.cases, args.timed, out), summarize, markdown)


if __name__ == "__main__":
    main()
