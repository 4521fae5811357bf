"""What the commands that score a plan read: a trace with ops and the plan made for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import MemplanError

if TYPE_CHECKING:
    from .. import Plan, Trace


def trace_and_plan(args) -> tuple[Trace, Plan | None]:
    """The trace `args.trace` (format `args.format`), which must have ops, and the plan `args.plan`
    made for it (None without one); `args.profile`, if given, is checked first (one line if unknown).

    Raises:
        MemplanError: an unknown profile, an unreadable file, a trace without ops, a plan of another trace.
    """
    # numpy-based layers: every command module is imported to build the parser (commands/base.py)
    from .. import get_profile, load_any, read_plan

    if args.profile is not None:
        get_profile(args.profile)
    trace = load_any(args.trace, args.format)
    if not trace.ops:
        raise MemplanError(f"{args.trace}: has no ops (a pool-only problem); use `memplan pool`")
    return trace, read_plan(args.plan, trace) if args.plan else None
