"""Plan files: a Plan as JSON on disk, read back checked against the trace it is used with."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import TraceFormatError
from ..fileio import atomic_write_text
from .check import check_plan
from .plan import Plan


def write_plan(plan: Plan, path: str | os.PathLike) -> None:
    """Write a plan as JSON, atomically."""
    atomic_write_text(path, json.dumps(plan.to_json(), indent=1) + "\n")


def read_plan(path: str | os.PathLike, trace=None) -> Plan:
    """Read a plan written by `write_plan`, checked against `trace` when given.

    Args:
        path: the plan file.
        trace: the Trace it will be used with; then `memplan.model.check.check_plan` runs.
    Raises:
        TraceFormatError: the file is missing, not JSON or not a plan.
        PlanMismatchError: (with `trace`) the plan is for another trace or names storages
            or ops it does not have.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"{path}: cannot read plan: {exc}") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        where = f":{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise TraceFormatError(f"{path}{where}: not JSON ({getattr(exc, 'msg', 'nested too deeply')})") from None
    plan = Plan.from_json(data, str(path))
    if trace is None:
        return plan
    return check_plan(trace, plan, str(path))
