"""DTR against the planners that decide offline (issue 17): simulated overhead at 70/50/30% of the peak.

For each zoo model (fake-tensor trace) and budget share, every planner plans and the simulator
scores the plan on one device profile (default h100): the overhead (time / unconstrained time
- 1), or, when the planner cannot meet the budget, the smallest load it names. `milp` gets a
time limit and runs only on traces up to --milp-max-ops ops (it is the reference on small
traces, not a product path); `home:fast` runs under --home-limit-s.

    .venv/bin/python benchmarks/dtr.py [--models resnet18-cifar@128,...] [--budgets 0.7,0.5,0.3]
        [--profile h100] [--milp-limit-s 30] [--milp-max-ops 800] [--home-limit-s 10]

Writes benchmarks/results/dtr.{json,md}. Every figure is "simulated (<profile>)".
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from memplan import DEFAULT_PROFILE, InfeasibleBudgetError, Problem, plan, trace_workload
from memplan.fileio import atomic_write_text

RESULTS = Path(__file__).parent / "results"
MODELS = ("resnet18-cifar@128", "vgg11-cifar@512", "resnet50@32", "mobilenet_v2@32", "transformer-encoder@16")
BUDGETS = (0.7, 0.5, 0.3)
PLANNERS = ("dtr", "milp", "capuchin", "home:fast", "checkpoint-all", "sqrt-n")


def main() -> int:
    args = _args()
    rows = []
    for spec in args.models.split(","):
        model, batch = spec.rsplit("@", 1)
        trace = trace_workload(model, int(batch), fake=True)
        cost = Problem.of(trace, profile=args.profile).cost
        for share in (float(b) for b in args.budgets.split(",")):
            for planner in PLANNERS:
                rows.append({"model": model, "batch": int(batch), "ops": len(trace.ops), "budget_share": share,
                             "planner": planner, **_point(trace, cost, planner, share, args)})
                print(json.dumps(rows[-1]), file=sys.stderr)
    command = "python benchmarks/dtr.py " + shlex.join(sys.argv[1:])
    out = {"command": command, "source": f"simulated ({args.profile})", "rows": rows}
    atomic_write_text(RESULTS / "dtr.json", json.dumps(out, indent=1) + "\n")
    atomic_write_text(RESULTS / "dtr.md", _markdown(out))
    return 0


def _point(trace, cost, planner: str, share: float, args) -> dict:
    if planner == "milp" and len(trace.ops) > args.milp_max_ops:
        return {"skipped": f"trace has {len(trace.ops)} ops > --milp-max-ops {args.milp_max_ops}"}
    params = {"milp": {"time_limit_s": args.milp_limit_s}, "home:fast": {"time_limit_s": args.home_limit_s}}
    try:
        result = plan(trace, share, planner=planner, cost=cost, **params.get(planner, {}))
    except InfeasibleBudgetError as exc:
        return {"min_feasible_share": exc.min_feasible_bytes / trace.peak_load_bytes}
    p = result.predicted
    return {"overhead": p["overhead"], "peak_share": p["peak_load_bytes"] / trace.peak_load_bytes,
            "recompute_s": p["breakdown"]["recompute_s"], "decisions": len(result.decisions),
            "planning_s": result.planning_s}


def _markdown(out: dict) -> str:
    lines = ["# DTR against offline planners", "", f"Produced by: `{out['command']}`", "",
             f"All figures {out['source']}: overhead = simulated time / unconstrained time - 1. Where a planner "
             "cannot meet the budget the cell gives the smallest load it names (share of the peak, `>= x%`).", ""]
    keys = list(dict.fromkeys((r["model"], r["batch"], r["ops"]) for r in out["rows"]))
    for model, batch, ops in keys:
        mine = [r for r in out["rows"] if r["model"] == model and r["batch"] == batch]
        shares = list(dict.fromkeys(r["budget_share"] for r in mine))
        lines += [f"## {model}, batch {batch} ({ops} ops)", "",
                  "| planner | " + " | ".join(f"{s:.0%} budget" for s in shares) + " |",
                  "| --- |" + " ---: |" * len(shares)]
        for planner in PLANNERS:
            cells = [_cell(next(r for r in mine if r["planner"] == planner and r["budget_share"] == s))
                     for s in shares]
            lines.append(f"| {planner} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _cell(row: dict) -> str:
    if "overhead" in row:
        return f"{row['overhead']:.1%}"
    if "min_feasible_share" in row:
        return f">= {row['min_feasible_share']:.0%}"
    return "skipped"


def _args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="model@batch, comma-separated")
    p.add_argument("--budgets", default=",".join(str(b) for b in BUDGETS), help="shares of the peak")
    p.add_argument("--profile", default=DEFAULT_PROFILE, help="the cost model's device profile")
    p.add_argument("--milp-limit-s", type=float, default=30.0)
    p.add_argument("--milp-max-ops", type=int, default=800)
    p.add_argument("--home-limit-s", type=float, default=10.0)
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(main())
