"""`memplan simulate`: score a plan (or no plan) on a trace with the simulator."""

from __future__ import annotations

from dataclasses import replace

from ..budget import NO_LIMIT, budget_in_force, limited
from ..problem import DEFAULT_PROFILE
from ..units import format_bytes
from .base import command
from .options import add_json_flag, budget_option, output_of
from .output import emit_json

_PROFILE_SOURCES = {"given": "from --profile", "plan": "the profile the plan was made for", "default": "the default"}
_BUDGET_SOURCES = {"given": "from --budget", "plan": "the plan's own budget", "none": "uncapped"}
LANE_COLORS = {"compute": "tab:blue", "d2h": "tab:orange", "h2d": "tab:green"}


@command("simulate")
def add_simulate(sub) -> None:
    """Register `memplan simulate`."""
    p = sub.add_parser("simulate", help="simulate one iteration of a trace under a plan and budget")
    p.add_argument("trace", help="trace file (memplan JSON lines or an importable format)")
    p.add_argument("--format", help="trace format, when detection is not wanted")
    p.add_argument("--plan", help="plan JSON written by `memplan plan` (default: keep everything)")
    p.add_argument("--profile", default=None, help="the cost model's device profile, a name or a profile file, e.g. "
                   f"from `calibrate --device cpu` (default: the profile the plan was made for, else "
                   f"{DEFAULT_PROFILE})")
    p.add_argument("--budget", type=budget_option,
                   help="memory cap: bytes (8GiB), a share of the unconstrained peak (60%%) or none (no cap); "
                        "default: the plan's own budget, no cap without a plan")
    p.add_argument("--plot", type=output_of("plot"), metavar="FILE.png",
                   help="write the memory-load timeline and stream lanes here (.png, .pdf or .svg)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Simulate and print the result."""
    from ..services import Simulator, simulate_comm, simulation_profile
    from ..problem import Problem
    from .inputs import trace_and_plan

    trace, plan = trace_and_plan(args)
    own = NO_LIMIT if plan is None else plan.budget_bytes
    budget, source = budget_in_force(args.budget, own, trace.peak_load_bytes)
    profile, profile_source = simulation_profile(plan, args.profile)
    sim = Simulator(trace, Problem.of(trace, profile=profile).cost)
    result = replace(sim.run(plan, budget, timeline=bool(args.plot)), budget_bytes=budget, budget_source=source)
    summary = {"trace": args.trace, "profile": sim.cost.profile.name, "profile_source": profile_source,
               **result.summary()}
    if args.plot and result.feasible:
        _plot(trace, sim, result, budget, args)
        summary["plot"] = str(args.plot)
    if trace.meta.get("world_size"):  # one rank of a DDP/FSDP2 job: its collectives beside compute
        summary["communication"] = simulate_comm(trace, cost=sim.cost).to_json()
    if args.json:
        emit_json(summary)
    else:
        _print(summary)
    return 0


def _print(summary: dict) -> None:
    cap = "no cap" if summary["budget_bytes"] is None else format_bytes(summary["budget_bytes"])
    print(f"profile     {summary['profile']:>13}   ({_PROFILE_SOURCES[summary['profile_source']]})")
    print(f"budget      {cap:>13}   ({_BUDGET_SOURCES[summary['budget_source']]})")
    if not summary["feasible"]:
        print(f"infeasible: op {summary['infeasible_op']} cannot allocate, "
              f"short by {format_bytes(summary['shortfall_bytes'])}")
        return
    print(f"time        {summary['time_s'] * 1e3:10.2f} ms   (baseline {summary['baseline_time_s'] * 1e3:.2f} ms, "
          f"overhead {summary['overhead']:.1%})")
    print(f"peak load   {format_bytes(summary['peak_load_bytes']):>13}")
    print(f"host peak   {format_bytes(summary['host_peak_bytes']):>13}   link {format_bytes(summary['link_bytes'])}")
    for key, value in summary["breakdown"].items():
        print(f"  {key:<18}{value * 1e3:10.2f} ms")
    comm = summary.get("communication")
    if comm:
        print(f"with comm   {comm['iteration_s'] * 1e3:10.2f} ms   ({comm['collectives']} collectives on "
              f"{comm['world_size']} ranks over {comm['link']}: {comm['comm_s'] * 1e3:.2f} ms, "
              f"{comm['exposed_comm_s'] * 1e3:.2f} ms not hidden by compute; unplanned)")
    if "plot" in summary:
        print(f"plot        {summary['plot']}")


def _plot(trace, sim, result, budget, args) -> None:
    """Memory load with and without the plan above, the compute lane below."""
    import numpy as np
    from ..plots import GIB, save_figure, subplots

    fig, (top, lanes) = subplots(2, 1, figsize=(10, 5.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    base_starts = sim.baseline_op_start_s * 1e3
    top.step(base_starts, trace.load / GIB, where="post", color="black", lw=1, label="no plan")
    top.step(result.timeline_t * 1e3, result.timeline_load / GIB, where="post", color="tab:red", lw=1,
             label="under the plan")
    if limited(budget):
        top.axhline(budget / GIB, color="grey", ls="--", lw=0.8, label="budget")
    top.set_ylabel("memory load (GiB)")
    top.legend(fontsize=8)
    top.set_title(f"{args.trace} on {sim.cost.profile.name} (simulated)")
    for row, (lane, spans) in enumerate(result.lanes.items()):
        spans = np.asarray(spans) * 1e3
        lanes.broken_barh([(s, e - s) for s, e in spans], (row, 0.8), color=LANE_COLORS.get(lane, "grey"))
    lanes.set_yticks([r + 0.4 for r in range(len(result.lanes))], list(result.lanes))
    lanes.set_xlabel("simulated time (ms)")
    save_figure(fig, args.plot)
