"""Errors that mean "the user asked for something wrong": the CLI prints one line and exits 2."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping

log = logging.getLogger(__name__)


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


class ModelError(MemplanError):
    """A model that cannot be built or run as configured: its own code (or torch's, or the
    hub library's under it) raised. The message names the model and the config options
    given, once `about_model` has labelled it.

    Attributes:
        model: the model's name, once labelled (None before).
    """

    def __init__(self, message: str, *, model: str | None = None):
        super().__init__(message)
        self.model = model


# What torch's allocators say when an allocation fails (CPU: DefaultCPUAllocator; CUDA: OOM).
ALLOCATION_FAILURES = ("can't allocate memory", "out of memory", "not enough memory")


def is_allocation_failure(exc: BaseException) -> bool:
    """True for a failed allocation (host or GPU): the caller says what does not fit where."""
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and any(marker in str(exc) for marker in ALLOCATION_FAILURES))


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message` (just the type when the message is empty)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@contextlib.contextmanager
def model_code(what: str) -> Iterator[None]:
    """Run a model's own code (building it, its training step): anything it raises but a
    MemplanError, a failed allocation or an interrupt becomes one ModelError line,
    "`what`: Type: message"; `-v` logs the traceback."""
    try:
        yield
    except MemplanError:
        raise
    except Exception as exc:  # noqa: BLE001  whatever a model's code raises is the model's
        if is_allocation_failure(exc):
            raise
        log.info("%s", what, exc_info=exc)
        raise ModelError(f"{what}: {first_line(exc)}") from exc


@contextlib.contextmanager
def about_model(name: str, config: Mapping | None = None) -> Iterator[None]:
    """Name model `name` and the config options given in a ModelError raised inside."""
    try:
        yield
    except ModelError as exc:
        if exc.model is not None:
            raise
        options = " ".join(f"{k}={v}" for k, v in (config or {}).items())
        label = f"model {name}" + (f" with config {options}" if options else "")
        raise ModelError(f"{label}: {exc}", model=name) from exc.__cause__ or exc
