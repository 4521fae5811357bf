"""`memplan plan` (plan a trace under a budget), `memplan planners` (list them) and
`memplan calibrate` (measure this GPU or this CPU into a device profile)."""

from __future__ import annotations

import json
import logging
import sys

from ..services import parse_config_value
from ..errors import MemplanError
from ..fileio import atomic_write_text, written_together
from ..problem import DEFAULT_PROFILE
from ..units import format_bytes
from .base import command
from .options import add_json_flag, budget_option, nonnegative_int, output_of, positive_float
from .output import emit_json, print_rows, readable

log = logging.getLogger(__name__)

INTERNAL_ERROR = 1  # exit code of a planner bug (an invalid plan, an unexpected exception), not the user's mistake
SHOWN_VIOLATIONS = 5  # violations listed when a plan is rejected


@command("plan")
def add_plan(sub) -> None:
    """Register `memplan plan`."""
    p = sub.add_parser("plan", help="plan where every storage of a trace lives under a memory budget")
    p.add_argument("trace", help="trace file")
    p.add_argument("--planner", default="none", help="registered planner name (see `memplan planners`)")
    p.add_argument("--budget", type=budget_option, required=True,
                   help="bytes (8GiB, 512MB) or a share of the trace's peak (60%%)")
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help=f"the cost model's device profile, a name or a profile JSON (default {DEFAULT_PROFILE})")
    p.add_argument("--seed", type=int, default=0, help="random seed for search planners (default 0)")
    p.add_argument("--param", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="planner hyper-parameters (int, float, true/false, else string)")
    p.add_argument("--time-limit", type=positive_float, default=None, metavar="SECONDS",
                   help="wall-clock limit of a planner that takes one (auto, milp, home:fast, home:seeded, "
                        "dqn:refined): --param time_limit_s=SECONDS")
    p.add_argument("--format", default=None, help="trace file format (detected when omitted)")
    p.add_argument("-o", "--output", type=output_of("JSON"), required=True, help="plan file to write (JSON)")
    p.add_argument("--plot", type=output_of("plot"), default=None, metavar="FILE.png",
                   help="write a plot (.png, .pdf or .svg) of the planner's search convergence (planners that "
                        "search record one, e.g. home)")
    add_json_flag(p)
    p.set_defaults(func=run_plan)


@command("planners")
def add_planners(sub) -> None:
    """Register `memplan planners`."""
    q = sub.add_parser("planners", help="list the registered planners")
    q.add_argument("--decides", default=None, choices=("swap", "recompute", "pool", "microbatch"),
                   help="only the planners that decide this")
    add_json_flag(q)
    q.set_defaults(func=run_planners)


@command("calibrate")
def add_calibrate(sub) -> None:
    """Register `memplan calibrate`."""
    c = sub.add_parser("calibrate", help="measure this CUDA GPU (or, with --device cpu, this CPU) into a device profile")
    c.add_argument("-o", "--output", type=output_of("JSON"), default=None,
                   help="profile JSON to write (usable as --profile FILE)")
    c.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="what to measure: the CUDA GPU (default) or this CPU, as a device whose host link "
                        "is a copy between two host buffers")
    c.add_argument("--name", default=None, help="profile name (default: from the GPU's name; cpu: \"cpu\")")
    c.add_argument("--gpu", type=nonnegative_int, default=0, help="CUDA device index (default 0)")
    add_json_flag(c)
    c.set_defaults(func=run_calibrate)


# --- plan --------------------------------------------------------------------------------------


def parse_params(items: list[str]) -> dict:
    """`key=value` strings into planner keyword arguments (values typed as int, float, bool or str).

    Raises:
        MemplanError: an item without `=` or with an empty key.
    """
    params = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise MemplanError(f"--param: expected key=value, got {item!r}")
        params[key.strip().replace("-", "_")] = parse_config_value(text.strip())
    return params


def run_plan(args) -> int:
    """Plan, validate, write the plan and print its predicted simulation."""
    from .. import load_any, plan, validate, write_plan
    from ..plots import plot_history

    _check_plan_options(args)
    trace = load_any(args.trace, args.format)
    params = parse_params(args.param)
    if args.time_limit is not None:
        if params.get("time_limit_s", args.time_limit) != args.time_limit:
            raise MemplanError("--time-limit and --param time_limit_s disagree: give one")
        params["time_limit_s"] = args.time_limit
    if params.get("objective") == "measured":
        from ..services import measured_objective  # torch (a second): only a measured objective pays for it

        params["objective"] = measured_objective(trace)
    try:
        result = plan(trace, args.budget, planner=args.planner, profile=args.profile, seed=args.seed, **params)
    except MemplanError:
        raise  # the user's mistake (or an infeasible budget): one line, exit 2
    except Exception as exc:  # noqa: BLE001  anything else raised while planning is a bug in the planner
        return _planner_raised(args, trace, params, exc)
    violations = validate(trace, result, result.budget_bytes)
    summary = {**plan_summary(result), "trace_peak_bytes": trace.peak_load_bytes}
    if violations:
        head = "; ".join(str(v) for v in violations[:SHOWN_VIOLATIONS])
        return _internal_error(args, summary, f"it produced an invalid plan ({len(violations)} violations; "
                                              f"not written): {head}", violations=violations)
    if args.plot and not result.history.get("series"):
        raise MemplanError(f"planner {args.planner!r} records no search history to plot (search planners such as "
                           f"home do); nothing written")
    with written_together():  # the plan and its plot, or neither (even on Ctrl-C)
        write_plan(result, args.output)
        if args.plot:
            plot_history(f"{args.planner} at {_budget(result.budget_bytes, trace.peak_load_bytes)}", result.history,
                         args.plot)
            summary["plot"] = str(args.plot)
    summary["output"] = str(args.output)
    if args.json:
        emit_json(summary)
    else:
        print_rows(_plan_rows(summary))
    return 0


def _check_plan_options(args) -> None:
    """Planner and profile, checked before the trace is loaded (the budget, when it was parsed)."""
    from .. import get_profile
    from ..services import get_planner

    get_planner(args.planner)
    get_profile(args.profile)


def plan_summary(result) -> dict:
    """The numbers `memplan plan` prints for a plan."""
    actions = {}
    for d in result.decisions:
        actions[d.action] = actions.get(d.action, 0) + 1
    return {
        "planner": result.planner, "params": result.params, "seed": result.seed,
        "budget_bytes": result.budget_bytes, "trace_digest": result.trace_digest,
        "decisions": len(result.decisions), "swaps": actions.get("swap", 0),
        "recomputes": actions.get("recompute", 0), "pool_bytes": result.pool_bytes,
        "microbatches": len(result.microbatches), "planning_s": result.planning_s,
        "predicted": result.predicted or None, "report": result.report or None, "valid": True,
    }


def _planner_raised(args, trace, params: dict, exc: Exception) -> int:
    log.info("planner %r raised", args.planner, exc_info=exc)  # the traceback, with -v
    summary = {"planner": args.planner, "params": params, "seed": args.seed,
               "trace_peak_bytes": trace.peak_load_bytes}
    return _internal_error(args, summary, f"{type(exc).__name__}: {exc}", exception=type(exc).__name__)


def _internal_error(args, summary: dict, what: str, violations=(), exception: str | None = None) -> int:
    """Report a planner bug in one line on stderr (and, with --json, the summary with the
    violations or the exception), and return INTERNAL_ERROR."""
    line = " ".join(f"internal error in planner {args.planner!r}: {what}; please report".split())
    summary.update(valid=False, internal_error=line, exception=exception,
                   violations=[{"kind": v.kind, "storage": v.storage, "op": v.op, "message": v.message}
                               for v in violations])
    if args.json:
        emit_json(summary)
    print(f"memplan: error: {line}", file=sys.stderr)
    return INTERNAL_ERROR


def _plan_rows(summary: dict) -> list[tuple[str, object]]:
    rows = [("planner", summary["planner"]),
            ("budget", _budget(summary["budget_bytes"], summary["trace_peak_bytes"])),
            ("decisions", f"{summary['decisions']} ({summary['swaps']} swap, {summary['recomputes']} recompute)")]
    if summary["pool_bytes"] is not None:
        rows.append(("pool", _bytes(summary["pool_bytes"])))
    if summary["microbatches"]:
        rows.append(("micro-batched layers", summary["microbatches"]))
    rows.append(("planning time", f"{summary['planning_s']:.3f} s"))
    rows += [(f"planner: {name}", text) for name, text in
             (readable(k, v) for k, v in (summary["report"] or {}).items())]
    rows += _prediction_rows(summary["predicted"])
    rows.append(("written", summary["output"]))
    return rows


def _prediction_rows(p: dict) -> list[tuple[str, object]]:
    if not p.get("feasible", True):
        return [("predicted", f"infeasible at op {p.get('infeasible_op')} "
                              f"(short by {format_bytes(p.get('shortfall_bytes', 0))})")]
    rows = [("predicted time", f"{p['time_s'] * 1e3:.2f} ms (baseline {p['baseline_time_s'] * 1e3:.2f} ms, "
                               f"overhead {p['overhead']:+.1%})"),
            ("predicted peak", _bytes(p["peak_load_bytes"])),
            ("host memory", format_bytes(p.get("host_peak_bytes", 0))),
            ("link traffic", format_bytes(p.get("link_bytes", 0)))]
    rows += [(f"  {k}", f"{v * 1e3:.2f} ms") for k, v in p.get("breakdown", {}).items()]
    return rows


def _budget(budget: int | None, peak: int) -> str:
    if budget is None or not peak:
        return _bytes(budget)
    above = ": above it, nothing needs to move" if budget > peak else ""
    return f"{_bytes(budget)}, {budget / peak:.0%} of the unconstrained peak{above}"


def _bytes(n: int | None) -> str:
    return "-" if n is None else f"{format_bytes(n)} ({n} B)"


# --- planners ----------------------------------------------------------------------------------


def run_planners(args) -> int:
    """List registered planner names with their one-line summaries."""
    from .. import known_planners

    planners = [spec.describe() for spec in known_planners(args.decides).values()]
    # X+Y, X any swap or recompute planner: Y decides the convolutions first, or lays the pool out after
    seconds = {kind: [name for name, spec in known_planners().items() if spec.decides == {kind}]
               for kind in ("microbatch", "pool")}
    if args.json:
        emit_json({"planners": json.loads(json.dumps(planners, default=str)), "compose_with": seconds})
        return 0
    ys = ", ".join(seconds["microbatch"] + seconds["pool"])
    composed = ("X+Y", f"X any swap or recompute planner, Y one of {ys} "
                       "(e.g. capuchin+smartpool, autoswap:doa+ucudnn:wd)")
    print_rows([(p["name"], f"[{', '.join(p['decides']) or 'nothing'}] {p['summary']}") for p in planners] + [composed])
    return 0


# --- calibrate ---------------------------------------------------------------------------------


def run_calibrate(args) -> int:
    """Measure the GPU (or the CPU), print the profile and write it (with -o)."""
    # torch takes a second to import: only the commands that run it pay for it
    from .. import calibrate
    from ..services import calibrate_cpu, profile_to_json, with_executor_costs

    profile = calibrate_cpu(name=args.name) if args.device == "cpu" else calibrate(args.gpu, name=args.name)
    profile = with_executor_costs(profile, "cpu" if args.device == "cpu" else f"cuda:{args.gpu}")
    data = profile_to_json(profile)
    if args.output:
        atomic_write_text(args.output, json.dumps(data, indent=1) + "\n")
    if args.json:
        emit_json({**data, "output": args.output})
    else:
        print_rows(_profile_rows(data) + ([("written", args.output)] if args.output else []))
    return 0


def _flops(rate: float) -> str:
    """TFLOP/s for a GPU, GFLOP/s for what a CPU reaches."""
    return f"{rate / 1e12:.1f} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.1f} GFLOP/s"


def _profile_rows(data: dict) -> list[tuple[str, object]]:
    giga = 1e9
    return [("name", data["name"]), ("device", data["description"]),
            ("FP32", _flops(data["fp32_flops"])), ("TF32", _flops(data["tf32_flops"])),
            ("BF16", _flops(data["bf16_flops"])),
            ("FP16", _flops(data.get("fp16_flops") or data["bf16_flops"])),
            ("memory bandwidth", f"{data['hbm_bytes_per_s'] / giga:.0f} GB/s"),
            ("host->device", f"{data['h2d_bytes_per_s'] / giga:.1f} GB/s"),
            ("device->host", f"{data['d2h_bytes_per_s'] / giga:.1f} GB/s"),
            ("launch latency", f"{data['launch_s'] * 1e6:.1f} us"),
            ("copy latency", f"{data['copy_latency_s'] * 1e6:.1f} us"),
            ("host per op", f"{data.get('host_op_s', 0.0) * 1e6:.1f} us"),
            ("per saved-tensor hook", f"{data.get('hook_s', 0.0) * 1e6:.1f} us"),
            ("per executor hook call", f"{data['hook_call_s'] * 1e6:.1f} us"),
            ("per op in a dispatch mode", f"{data.get('mode_op_s', 0.0) * 1e6:.1f} us"),
            ("per op guarded (a storage away)", f"{data.get('guard_op_s', 0.0) * 1e6:.1f} us"),
            ("per replayed op", f"{data.get('replay_op_s', 0.0) * 1e6:.1f} us"),
            ("per op recorded to replay", f"{data.get('record_op_s', 0.0) * 1e6:.1f} us"),
            ("per executor action", f"{data.get('action_s', 0.0) * 1e6:.1f} us"),
            ("per region run", f"{data.get('region_s', 0.0) * 1e6:.1f} us"),
            ("memory", format_bytes(data["memory_bytes"])), ("kind", data.get("kind", "gpu"))]
