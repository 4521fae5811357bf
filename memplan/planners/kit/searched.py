"""What a search planner reports about its search: how many plans it evaluated, and how fast."""

from __future__ import annotations


def search_report(evaluations: int, seconds: float, **more) -> dict:
    """`plan.report` of a search: `evaluations` (plans it simulated, or found not to fit without
    simulating) in `seconds`, and their rate."""
    return {"evaluations": int(evaluations), "evaluations_per_s": evaluations / seconds if seconds > 0 else None,
            **more}
