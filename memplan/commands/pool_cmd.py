"""`memplan pool`: lay out a trace (optionally under a plan) or a minimalloc CSV in one pool."""

from __future__ import annotations

from ..errors import MemplanError
from ..fileio import atomic_write_text, written_together
from ..problem import DEFAULT_PROFILE
from ..units import format_bytes
from .base import command
from .options import add_json_flag, output_of, positive_float
from .output import emit_json, print_rows, readable

BYTE_DETAILS = ("portfolio_footprint", "lower_bound")  # smartpool details that are byte counts


@command("pool")
def add_pool(sub):
    """Register `memplan pool`."""
    p = sub.add_parser("pool", help="plan a memory pool (SmartPool) or simulate an allocator",
                       description="Lay out every buffer of INPUT (a trace, a trace plus --plan, or a minimalloc "
                                   "CSV) in one pool and report footprint / peak load.")
    p.add_argument("input", help="trace file or minimalloc CSV (id,lower,upper,size)")
    p.add_argument("--allocator", default="smartpool",
                   help="smartpool (default), smartpool-bestfit, smartpool-firstfit, exact, cnmem, caching, "
                        "caching-expandable, vdnnpp-highend")
    p.add_argument("--plan", help="a plan file: swapped-out buffers free memory while on the host")
    p.add_argument("--time-limit", type=positive_float, default=10.0,
                   help="smartpool: wall-clock seconds for the whole command up to a validated layout, start-up "
                        "and loading included (default 10)")
    p.add_argument("--order", choices=("prefetch-first", "derivative-first"), default=None,
                   help="vdnnpp-highend: allocation order at one step (paper 001)")
    p.add_argument("--profile", default=None,
                   help="with --plan: the cost model's device profile that times swap-outs (default: the one the "
                        f"plan was made for, else {DEFAULT_PROFILE})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--offsets-out", type=output_of("CSV"), help="write id,offset CSV (minimalloc ids for CSV input)")
    p.add_argument("--plot", type=output_of("plot"), metavar="FILE.png",
                   help="write a picture of the layout, time x address (.png, .pdf or .svg)")
    add_json_flag(p)
    p.set_defaults(func=run)


def load_problem(path: str, plan_path: str | None, profile: str | None):
    """The PoolProblem for INPUT (and --plan)."""
    from .. import load_any, read_plan
    from ..services import (is_minimalloc_csv, plan_cost, read_minimalloc_csv, residency_pool_problem,
                            storage_pool_problem)

    if is_minimalloc_csv(path):
        if plan_path:
            raise MemplanError("--plan applies to traces, not to a minimalloc CSV")
        return read_minimalloc_csv(path)
    trace = load_any(path)
    if not plan_path:
        return storage_pool_problem(trace)
    plan = read_plan(plan_path, trace)
    return residency_pool_problem(trace, plan, plan_cost(trace, plan, profile))


def run(args) -> int:
    """Solve, validate (inside `solve`), write outputs, print."""
    from ..services import plot_pool_layout, pool_command_limit_s, solve_pool

    options = _check_options(args)
    problem = load_problem(args.input, args.plan, args.profile)
    result = solve_pool(problem, args.allocator, time_limit_s=pool_command_limit_s(args.time_limit), seed=args.seed,
                        **options)
    if (args.offsets_out or args.plot) and result.offsets is None:
        raise MemplanError(f"allocator {args.allocator!r} has no single address space: no offsets to write or plot")
    with written_together():  # both or neither, even on Ctrl-C while the plot is drawn
        if args.offsets_out:
            _write_offsets(args.offsets_out, result)
        if args.plot:
            plot_pool_layout(result, args.plot)
    _print(args, result)
    return 0


def _check_options(args) -> dict:
    """Allocator options, every option checked before the input is loaded."""
    from .. import get_profile
    from ..services import POOL_ALLOCATORS

    POOL_ALLOCATORS.get(args.allocator)  # an unknown name is refused, listing the known ones
    if args.order and args.allocator != "vdnnpp-highend":
        raise MemplanError("--order applies to --allocator vdnnpp-highend only")
    if args.profile is not None:
        get_profile(args.profile)
    return {"order": args.order} if args.order else {}


def _write_offsets(path: str, result) -> None:
    rows = ["id,offset"] + [f"{name},{int(o)}" for name, o in zip(result.problem.names, result.offsets)]
    atomic_write_text(path, "\n".join(rows) + "\n")


def _print(args, result) -> None:
    summary = result.summary()
    if args.json:
        emit_json(summary)
        return
    details = dict(result.details)
    inner = details.pop("seconds", None)  # the allocator's own part of the time
    time = f"{result.seconds:.3f} s" + (f" ({inner:.3f} s laying out, the rest checking the layout)"
                                        if inner is not None else "")
    rows = [("allocator", result.allocator), ("buffers", result.buffers),
            ("peak load", f"{format_bytes(result.peak_load_bytes)} ({result.peak_load_bytes} B)"),
            ("footprint", f"{format_bytes(result.footprint_bytes)} ({result.footprint_bytes} B)"),
            ("ratio", f"{result.ratio:.4f}"), ("device calls", result.alloc_calls), ("time", time)]
    rows += [readable(key, format_bytes(value) if key in BYTE_DETAILS else value) for key, value in details.items()]
    rows += [(what, path) for what, path in (("offsets written to", args.offsets_out),
                                             ("plot written to", args.plot)) if path]
    print_rows(rows)
