"""PyTorch-style baselines against memplan's planners at equal peak memory (simulated).

For each model, every baseline (`sqrt-n`, `checkpoint-all`, `save-on-cpu`) is planned with no
budget; its simulated peak then becomes the budget for memplan's own planners, so each row
compares overheads at the same memory.

    .venv/bin/python benchmarks/baselines.py [--profile h100] [--models resnet50@256,hf:gpt2@8]

Writes benchmarks/results/baselines.{md,json}. All numbers are simulated.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memplan import DEFAULT_PROFILE, InfeasibleBudgetError, Problem, plan, trace_workload
from memplan.fileio import atomic_write_text

RESULTS = Path(__file__).parent / "results"
BASELINES = ("sqrt-n", "checkpoint-all", "save-on-cpu")
MEMPLAN = ("autoswap:bo", "autoswap:swdoa")
GIB = 2**30


def compare(model: str, batch: int, profile: str) -> list[dict]:
    """Rows of (baseline, its peak and overhead, each memplan planner's overhead at that peak)."""
    trace = trace_workload(model, batch, fake=True)
    cost = Problem.of(trace, profile=profile).cost
    rows = []
    for baseline in BASELINES:
        base = plan(trace, "100%", planner=baseline, cost=cost).predicted
        row = {"model": f"{model}@{batch}", "peak_gib": trace.peak_load_bytes / GIB, "baseline": baseline,
               "baseline_peak_gib": base["peak_load_bytes"] / GIB, "baseline_overhead": base["overhead"]}
        for name in MEMPLAN:
            try:
                ours = plan(trace, base["peak_load_bytes"], planner=name, cost=cost, seed=0).predicted
                row[name] = ours["overhead"] if ours["feasible"] else None
            except InfeasibleBudgetError:
                row[name] = None
        rows.append(row)
    return rows


def to_markdown(rows: list[dict], profile: str) -> str:
    """The table the README shows."""
    head = (f"Simulated on the `{profile}` profile; each memplan planner gets the baseline's peak as its budget.\n\n"
            "| model | peak, no plan | baseline | its peak | its overhead | "
            + " | ".join(f"{n} at that peak" for n in MEMPLAN) + " |\n|---|---|---|---|---|"
            + "---|" * len(MEMPLAN) + "\n")
    lines = []
    for r in rows:
        ours = " | ".join("infeasible" if r[n] is None else f"{r[n]:.1%}" for n in MEMPLAN)
        lines.append(f"| {r['model']} | {r['peak_gib']:.2f} GiB | {r['baseline']} | {r['baseline_peak_gib']:.2f} GiB"
                     f" | {r['baseline_overhead']:.1%} | {ours} |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="the cost model's device profile")
    parser.add_argument("--models", default="resnet50@256,vgg16@64,hf:gpt2@8")
    args = parser.parse_args()
    rows = []
    for item in args.models.split(","):
        model, _, batch = item.partition("@")
        rows += compare(model, int(batch), args.profile)
    atomic_write_text(RESULTS / "baselines.json", json.dumps({"profile": args.profile, "rows": rows}, indent=1))
    atomic_write_text(RESULTS / "baselines.md", to_markdown(rows, args.profile))
    print(to_markdown(rows, args.profile))


if __name__ == "__main__":
    main()
