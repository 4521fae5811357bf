"""`memplan report`: one self-contained HTML page that shows a plan on its trace."""

from __future__ import annotations

from ..units import format_bytes
from .base import command
from .options import add_json_flag, output_of
from .output import emit_json


@command("report")
def add_report(sub) -> None:
    """Register `memplan report`."""
    p = sub.add_parser("report", help="write one HTML page that shows a plan on its trace: the memory over the step "
                                      "with and without it, the budget, every storage's fate, the predicted overhead")
    p.add_argument("plan", help="plan JSON written by `memplan plan`")
    p.add_argument("trace", help="the trace the plan was made for (memplan JSON lines or an importable format)")
    p.add_argument("--format", help="trace format, when detection is not wanted")
    p.add_argument("-o", "--output", type=output_of("HTML"), required=True,
                   help="the page to write (.html; self-contained: it opens offline and loads nothing)")
    p.add_argument("--profile", default=None, help="the cost model's device profile, a name or a file, to time "
                   "the step on (default: the profile the plan was made for)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Write the page and say what it shows."""
    from .. import write_report  # numpy and the simulator: only when a report is made
    from .inputs import trace_and_plan

    trace, plan = trace_and_plan(args)
    summary = write_report(trace, plan, args.output, args.profile)
    if args.json:
        emit_json(summary)
        return 0
    print(f"wrote {summary['report']} ({format_bytes(summary['bytes'])}): {summary['planner']} on "
          f"{summary['profile']}, "
          f"peak {format_bytes(summary['peak_bytes'])} of a budget of {summary['budget']} "
          f"(without the plan {format_bytes(summary['plain_peak_bytes'])}), predicted overhead "
          f"{100 * summary['overhead']:.1f}%")
    return 0
