"""`X+smartpool` against X at the same budget (issue 26, paper 000 §V): what fitting the pool costs.

For each model (fake trace on the CPU, the h100 profile) and swap or recompute planner X at a
share of the unconstrained peak: X's plan (simulated overhead and peak load) beside
`X+smartpool`'s (its pool, how many plans it took to fit the pool under the budget, the load X
planned under, the overhead). Simulated, planned on this host; nothing is trained.

    python benchmarks/pool_plans.py [--models resnet50@64,hf:gpt2@8,vgg16@64] [--share 0.5] [--out PATH]

Writes PATH.{json,md} (default benchmarks/results/pool_plans).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import memplan
from memplan import DEFAULT_PROFILE, InfeasibleBudgetError, Problem, trace_workload

OUT = Path(__file__).parent / "results" / "pool_plans"
MODELS = ("resnet50@64", "hf:gpt2@8", "vgg16@64")
PLANNERS = ("autoswap:doa", "capuchin", "dtr")
GIB = 2**30


def one(trace, cost, planner: str, budget: int) -> dict:
    """`planner`'s plan at `budget`: its simulated figures, or the load its error names."""
    started = time.perf_counter()
    try:
        made = memplan.plan(trace, budget, planner=planner, cost=cost)
    except InfeasibleBudgetError as exc:
        return {"planner": planner, "infeasible": True, "min_feasible_bytes": exc.min_feasible_bytes,
                "planning_s": time.perf_counter() - started}
    return {"planner": planner, "infeasible": False, "planning_s": time.perf_counter() - started,
            "overhead": made.predicted["overhead"], "peak_load_bytes": made.predicted["peak_load_bytes"],
            "pool_bytes": made.pool_bytes, "pool_tries": made.report.get("pool_tries"),
            "planned_load_bytes": made.report.get("planned_load_bytes")}


def run(models, share: float) -> list[dict]:
    rows = []
    for spec in models:
        name, batch = spec.rsplit("@", 1)
        trace = trace_workload(name, int(batch), fake=True)
        cost = Problem.of(trace, profile=DEFAULT_PROFILE).cost
        budget = int(trace.peak_load_bytes * share)
        for planner in PLANNERS:
            for which in (planner, f"{planner}+smartpool"):
                row = {"model": spec, "budget_bytes": budget, "share": share, **one(trace, cost, which, budget)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| model | planner | budget GiB | pool GiB | pool / budget | plans to fit | planned under GiB | "
             "peak load GiB | simulated overhead | planning s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gib = lambda key: f"{r[key] / GIB:.3f}" if r.get(key) else "-"  # noqa: E731
        if r["infeasible"]:
            lines.append(f"| {r['model']} | {r['planner']} | {r['budget_bytes'] / GIB:.3f} | - | - | - | - | - | "
                         f"infeasible: fits at {r['min_feasible_bytes'] / GIB:.3f} GiB | {r['planning_s']:.1f} |")
            continue
        ratio = f"{r['pool_bytes'] / r['budget_bytes']:.3f}" if r["pool_bytes"] else "-"
        lines.append(f"| {r['model']} | {r['planner']} | {r['budget_bytes'] / GIB:.3f} | {gib('pool_bytes')} | {ratio} | "
                     f"{r['pool_tries'] or '-'} | {gib('planned_load_bytes')} | {gib('peak_load_bytes')} | "
                     f"{r['overhead'] * 100:.2f}% | {r['planning_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--share", type=float, default=0.5, help="budget as a share of the unconstrained peak")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    rows = run(args.models.split(","), args.share)
    head = (f"# X+smartpool against X (simulated, {DEFAULT_PROFILE} profile; planned on {os.uname().nodename}, "
            f"{os.cpu_count()} CPUs)\n\nCommand: `python benchmarks/pool_plans.py --models {args.models} "
            f"--share {args.share}`. The smartpool search runs its default 10 s per layout.\n\n")
    Path(args.out + ".json").write_text(json.dumps({"share": args.share, "rows": rows}, indent=1) + "\n")
    Path(args.out + ".md").write_text(head + markdown(rows))
    print(head + markdown(rows))


if __name__ == "__main__":
    main()
