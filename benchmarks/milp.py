"""The `milp` reference (issue 12): its optimum, bound and gap on small and medium traces, its time
to optimality, and every other planner's overhead against it at the same budget.

Traces (fake tensors; the batch does not change the problem's size, only its bytes and times):
resnet18-cifar@128, vgg11-cifar@128, hf:gpt2@8 with 2 layers, and one DTR-style transformer block
(transformer-encoder with 1 layer). Budgets: shares of each trace's unconstrained peak. `milp` runs
under a wall-clock limit (default 60 s); where HiGHS proves the optimum, `optimal_s` is its time to
optimality, else the row shows the incumbent, the proven bound and the gap. Every other planner of
COMPARED that is registered (the baselines; home, capuchin and superneurons where present) is
planned at the same budget, and its gap to milp is its simulated overhead minus milp's, in points.

All overheads are simulated (the simulator judges every plan, milp's included); times are
wall-clock seconds on this host, with its load average.

    .venv/bin/python benchmarks/milp.py [--profile h100] [--time-limit 60] [--shares 0.9,0.7,0.5]
                                        [--models resnet18-cifar@128,...]

Writes benchmarks/results/milp.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from memplan import DEFAULT_PROFILE, Cost, InfeasibleBudgetError, Problem, known_planners, plan, trace_workload
from memplan.fileio import atomic_write_text

RESULTS = Path(__file__).parent / "results"
MIB = 2**20
# label -> (model, batch, config)
MODELS = {
    "resnet18-cifar@128": ("resnet18-cifar", 128, {}),
    "vgg11-cifar@128": ("vgg11-cifar", 128, {}),
    "hf:gpt2@8 n_layer=2": ("hf:gpt2", 8, {"n_layer": 2}),
    "transformer-block@32": ("transformer-encoder", 32, {"num_layers": 1}),
}
SHARES = (0.9, 0.7, 0.5)
COMPARED = ("home", "home:fast", "capuchin", "superneurons", "sqrt-n", "checkpoint-all", "save-on-cpu",
            "autoswap:bo")
COMPARED_PARAMS = {"home:fast": {"time_limit_s": 30.0}}
log = logging.getLogger("milp")


def run_planner(trace, budget: int, name: str, cost: Cost, **params) -> dict:
    """Plan and simulate one planner: overhead (simulated), wall seconds, its report."""
    started = time.perf_counter()
    try:
        p = plan(trace, budget, planner=name, cost=cost, seed=0, **params)
    except InfeasibleBudgetError as exc:
        return {"feasible": False, "min_feasible_bytes": exc.min_feasible_bytes}
    pred = p.predicted
    return {"feasible": bool(pred["feasible"]) and pred["peak_load_bytes"] <= budget, "overhead": pred["overhead"],
            "peak_bytes": pred["peak_load_bytes"], "wall_s": round(time.perf_counter() - started, 2),
            "swaps": sum(d.action == "swap" for d in p.decisions),
            "recomputes": sum(d.action == "recompute" for d in p.decisions), "report": p.report}


def case(label: str, share: float, trace, cost: Cost, time_limit_s: float) -> dict:
    """milp and every registered planner of COMPARED at `share` of the trace's peak."""
    budget = int(share * trace.peak_load_bytes)
    load = os.getloadavg()[0]
    milp = run_planner(trace, budget, "milp", cost, time_limit_s=time_limit_s)
    row = {"model": label, "share": share, "budget_bytes": budget, "peak_bytes": trace.peak_load_bytes,
           "load_avg": round(load, 2), "milp": milp}
    if milp.get("feasible"):
        rep = milp["report"]
        row.update(overhead=milp["overhead"], gap=rep["mip_gap"], bound=rep["milp_bound"], status=rep["status"],
                   optimal_s=rep["optimal_s"])
    others = {}
    for name in COMPARED:
        if name in known_planners():
            r = run_planner(trace, budget, name, cost, **COMPARED_PARAMS.get(name, {}))
            if r.get("feasible") and milp.get("feasible"):
                r["gap_to_milp"] = r["overhead"] - milp["overhead"]
            r.pop("report", None)
            others[name] = r
    row["planners"] = others
    log.info("%s at %.0f%%: milp %s; %s", label, 100 * share, {k: v for k, v in milp.items() if k != "report"},
             {n: _pct(r) for n, r in others.items()})
    return row


def _pct(r: dict | None) -> str:
    return "—" if not r or not r.get("feasible") else f"{r['overhead']:.1%}"


def to_markdown(rows: list[dict], profile: str, time_limit_s: float) -> str:
    """Two tables: milp's own figures, then every planner's overhead and gap to milp."""
    out = [(f"Simulated on the `{profile}` profile; `milp` under a {time_limit_s:g} s limit "
            f"(wall-clock on a loaded 2-core host: load average in the last column).\n"),
           ("| trace | budget | feature maps | positions | variables | status | milp overhead (simulated) "
            "| MILP objective | proven bound | gap | time to optimality | solve s | swaps | recomputes | load avg |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r["milp"]
        head = f"| {r['model']} | {r['share']:.0%} ({r['budget_bytes'] / MIB:.0f} MiB) |"
        if not m.get("feasible"):
            out.append(head + f" — | — | — | infeasible: floor {m['min_feasible_bytes'] / MIB:.0f} MiB "
                       "| — | — | — | — | — | — | — | — |" + f" {r['load_avg']} |")
            continue
        rep = m["report"]
        opt = "—" if rep["optimal_s"] is None else f"{rep['optimal_s']:.1f} s"
        out.append(head + f" {rep['feature_maps']} | {rep['positions']} | {rep['variables']} | {rep['status']} | "
                   f"{m['overhead']:.2%} | {_num(rep['milp_overhead'])} | {_num(rep['milp_bound'])} | "
                   f"{_num(rep['mip_gap'], '.1%')} | {opt} | {rep['solve_s']:.1f} | {m['swaps']} | "
                   f"{m['recomputes']} | {r['load_avg']} |")
    names = [n for n in COMPARED if any(n in r["planners"] for r in rows)]
    out += ["", "Every other planner at the same budget: simulated overhead (its gap to milp, in points).\n",
            "| trace | budget | milp | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for r in rows:
        cells = []
        for n in names:
            p = r["planners"].get(n)
            cells.append(_pct(p) + (f" ({100 * p['gap_to_milp']:+.1f})" if p and "gap_to_milp" in p else ""))
        out.append(f"| {r['model']} | {r['share']:.0%} | {_pct(r['milp'])} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _num(value, fmt: str = ".2%") -> str:
    return "—" if value is None else format(value, fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help="the cost model's device profile")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--shares", default=",".join(map(str, SHARES)))
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("memplan").setLevel(logging.WARNING)
    shares = [float(s) for s in args.shares.split(",")]
    rows = []
    for label in args.models.split(","):
        model, batch, config = MODELS[label]
        trace = trace_workload(model, batch, fake=True, **config)
        cost = Problem.of(trace, profile=args.profile).cost
        rows += [case(label, share, trace, cost, args.time_limit) for share in shares]
    data = {"profile": args.profile, "time_limit_s": args.time_limit, "rows": rows}
    atomic_write_text(RESULTS / "milp.json", json.dumps(data, indent=1, default=float) + "\n")
    markdown = to_markdown(rows, args.profile, args.time_limit)
    atomic_write_text(RESULTS / "milp.md", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
