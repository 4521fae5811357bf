"""`memplan sweep`: run planners over budgets; print load_min and overhead against memory."""

from __future__ import annotations

import sys

from ..problem import DEFAULT_PROFILE
from ..units import format_bytes
from .base import command
from .options import add_json_flag, budgets_option, output_of, positive_int
from .output import emit_json, print_table

AUTOSWAP_PREFIX = "autoswap"  # planners that take the AutoSwap options below
DEFAULT_BUDGETS = "100%,90%,80%,70%,60%,50%,40%"


@command("sweep")
def add_sweep(sub):
    """Register `memplan sweep`."""
    p = sub.add_parser("sweep", help="run planners over budgets (overhead against memory)",
                       description=__doc__.splitlines()[0])
    p.add_argument("trace", help="trace file (memplan JSON lines or an importable format)")
    p.add_argument("--planner", action="append", required=True,
                   help="planner name; repeat to put several on one plot")
    p.add_argument("--budgets", type=budgets_option, default=DEFAULT_BUDGETS,
                   help="comma-separated sizes or shares of the peak (default "
                        + DEFAULT_BUDGETS.replace("%", "%%") + ")")
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help=f"the cost model's device profile (default {DEFAULT_PROFILE})")
    p.add_argument("--seed", type=int, default=0, help="seed for search planners")
    p.add_argument("--allow-multi-swap", action="store_true",
                   help="AutoSwap: below load_min, swap storages more than once")
    p.add_argument("--trials", type=positive_int, default=None, help="AutoSwap bo: Bayesian-optimisation evaluations")
    p.add_argument("--objective", choices=("simulated", "measured"), default=None,
                   help="AutoSwap bo: what the search minimises (measured needs a GPU)")
    p.add_argument("--plot", type=output_of("plot"), metavar="FILE.png",
                   help="write the overhead-against-memory plot here (.png, .pdf or .svg)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Run the sweep and print it."""
    from .. import load_any, sweep
    from ..services import plot_pareto

    _check_sweep_options(args)
    trace = load_any(args.trace)
    params = {name: _autoswap_params(args) for name in args.planner if name.startswith(AUTOSWAP_PREFIX)}
    result = sweep(trace, args.planner, args.budgets, args.profile, seed=args.seed, params=params,
                   progress=not args.json and sys.stderr.isatty())
    summary = result.to_json()
    if args.plot:
        plot_pareto(result, args.plot, title=f"{trace.meta.get('model', args.trace)} on {args.profile}")
        summary["plot"] = str(args.plot)
    if args.json:
        emit_json(summary)
    else:
        _print_table(result)
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0


def _check_sweep_options(args) -> None:
    """Planners and profile, checked before the trace is loaded (the budgets, when they were parsed)."""
    from .. import get_profile
    from ..services import get_planner

    for name in args.planner:
        get_planner(name)
    get_profile(args.profile)


def _autoswap_params(args) -> dict:
    out = {}
    if args.allow_multi_swap:
        out["allow_multi_swap"] = True
    if args.trials is not None:
        out["n_trials"] = args.trials
    if args.objective:
        out["objective"] = args.objective
    return out


def _print_table(result) -> None:
    print(f"peak load {format_bytes(result.peak_load_bytes)}   load_min {format_bytes(result.load_min_bytes)}")
    rows = [(p.planner, format_bytes(p.budget_bytes),
             format_bytes(p.peak_load_bytes) if p.peak_load_bytes is not None else "-",
             format_bytes(p.footprint_bytes) if p.footprint_bytes else "-",
             f"{p.overhead:.2%}" if p.overhead is not None else "infeasible", f"{p.planning_s:.2f}")
            for p in result.points]
    print_table(("planner", "budget", "peak load", "footprint", "overhead", "plan s"), rows)
