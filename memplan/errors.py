"""Errors that mean "the user asked for something wrong": the CLI prints one line and exits 2."""


class MemplanError(Exception):
    """A user mistake or an impossible request; the message is one readable line."""


class TraceFormatError(MemplanError):
    """A trace, plan or import file that cannot be read; the message names file, line and field."""


class UnknownNameError(MemplanError):
    """An unknown planner, model, device or allocator; the message lists the known names."""


class InfeasibleBudgetError(MemplanError):
    """No plan of this planner fits the budget.

    Attributes:
        budget_bytes: the budget that was asked for.
        min_feasible_bytes: the smallest load this planner (or the trace) can reach.
    """

    def __init__(self, message: str, *, budget_bytes: int, min_feasible_bytes: int):
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.min_feasible_bytes = min_feasible_bytes


class NeedsOpsError(MemplanError):
    """A planner that decides what happens between ops was given a trace without ops (a pool
    problem, e.g. a minimalloc CSV): only pool planners can plan it."""


def unknown_name(what: str, name: str, known) -> UnknownNameError:
    """Build the error for an unknown `name` of kind `what`, listing the known ones."""
    return UnknownNameError(f"unknown {what} {name!r}; known: {', '.join(sorted(known))}")
