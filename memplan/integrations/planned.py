"""The steps a framework's loop runs, each under the plan made for its kind (shared by the integrations).

A framework's loop runs forward and backward once per batch and the optimizer step after it
(or after several batches, with gradient accumulation). What memplan plans is that forward and
backward: the optimizer step, gradient clipping, the learning-rate scheduler and logging stay
the framework's own, and run with everything resident (the step brings back what it left on
the host, `OptimizedStep.restore`).

Steps of one loop are not all alike. A step's kind (`StepKind`) is what its ops and memory
depend on: the shapes and dtypes of the batch (padding buckets) and whether gradients exist
when it starts (the first micro-batch after the optimizer step makes them, the next ones add
to them). Each kind is traced and planned (`memplan.optimize`) the first time it comes, and every later
step of that kind runs under that plan. A kind whose planner cannot meet the budget is planned by
`auto` (FALLBACK: it may move weights, gradients and optimizer state, and recompute) before it is
given up; a kind that still cannot be planned (or one past `max_plans`) runs unplanned, and the
report says why, or with `strict` the step raises instead.

The traced function stands for the framework's step; for a kind that starts without
gradients it first sets them to None, as the framework left them (tracing runs the step
once untraced first, which makes them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from ..budget import parse_budget
from ..errors import InfeasibleBudgetError, MemplanError
from ..run_options import RunOptions, split_options
from .. import OptimizedStep, optimize
from ..services import check_planner_params, get_planner, input_signature

log = logging.getLogger(__name__)

DEFAULT_MAX_PLANS = 8  # kinds planned at most; later ones run unplanned (pad batches to a few lengths)
PERSISTENT_KINDS = ("param", "grad", "optimizer_state")  # what the optimizer step holds, outside the plan
PREFIX = "memplan/"  # the keys of the reports in a framework's logs
FALLBACK = "auto"  # the planner of a kind whose own planner cannot meet the budget


@dataclass(frozen=True)
class StepKind:
    """What a step's ops and memory depend on: one plan per kind."""

    signature: tuple  # (shape, dtype, device type) of every tensor of the inputs
    grads_present: bool  # gradients exist when the step starts (a later micro-batch adds to them)

    def describe(self) -> str:
        """The batch's shapes (and whether the step adds to gradients), as the report shows them."""
        shapes = ", ".join("x".join(map(str, shape)) for shape, _, _ in self.signature if shape)
        return shapes + (" (adding to gradients)" if self.grads_present else "")


def kind_of(inputs: tuple, model: torch.nn.Module) -> StepKind:
    """The kind of a step with `inputs` on `model` as it is now."""
    grads = any(p.grad is not None for p in model.parameters())
    return StepKind(signature=input_signature(inputs), grads_present=grads)


class PlannedSteps:
    """Steps of one training loop, each run under the plan of its kind (planned at first sight).

    Args:
        budget: the memory budget of every plan ("6GiB", "70%" of each kind's unplanned peak, bytes).
        planner: a registered planner name ("auto" searches within its time limit).
        max_plans: kinds planned at most.
        strict: a kind that would run unplanned (no plan meets the budget, or max_plans) raises
            MemplanError at its first step instead.
        report: called with each plan's report (after its first step, which is measured) and with
            the reason a kind runs unplanned; keys start with "memplan/".
        options: how every plan runs (memplan.RunOptions: profile, seed, measure, fake, compile...).
        **keywords: passed to `memplan.optimize`: run options by name, and the planner's parameters.
    """

    def __init__(self, budget, planner: str = "auto", *, max_plans: int = DEFAULT_MAX_PLANS, strict: bool = False,
                 report: Callable[[dict], None] | None = None, options: RunOptions | None = None, **keywords):
        given, params = split_options(keywords)
        self.options = RunOptions.of(options, **given)  # how every plan runs
        self.params = params  # the planner's parameters
        _check_settings(budget, planner, params)
        self.budget = budget
        self.planner = planner
        self.max_plans = max_plans
        self.strict = strict
        self.report = report or (lambda entry: None)
        self.steps: dict[StepKind, OptimizedStep | None] = {}  # None: the kind runs unplanned
        self.reports: list[dict] = []  # every report made, in order
        self._current: Callable | None = None  # the framework's step the traced function runs
        self._open: tuple | None = None  # (context, step, kind) of a step begun and not ended
        self._unreported: set[StepKind] = set()
        self._closed: list[dict] = []  # stats of the plans `close` released

    # --- planning ---------------------------------------------------------------------------

    def step_for(self, kind: StepKind, step_fn: Callable, inputs: tuple, model, optimizer) -> OptimizedStep | None:
        """The planned step of `kind`, planned now if it is new (tracing runs `step_fn` on
        `inputs`); None when the kind runs unplanned."""
        self._current = step_fn
        if kind not in self.steps:
            self.steps[kind] = self._plan(kind, inputs, model, optimizer)
        return self.steps[kind]

    def _plan(self, kind: StepKind, inputs: tuple, model, optimizer) -> OptimizedStep | None:
        planned = sum(step is not None for step in self.steps.values())
        if planned >= self.max_plans:
            return self._unplanned(kind, f"{planned} step kinds are planned already (max_plans); pad batches to a "
                                         "few lengths or raise max_plans")
        try:
            step = self._optimized(kind, inputs, model, optimizer)
        except InfeasibleBudgetError as exc:
            return self._unplanned(kind, " ".join(str(exc).split()))
        step.restore()  # the framework's own code runs between steps: everything resident
        self._unreported.add(kind)
        self._check_persistent(step)
        return step

    def _optimized(self, kind: StepKind, inputs: tuple, model, optimizer) -> OptimizedStep:
        """The kind's step under its planner's plan, or under `auto`'s where its planner cannot meet
        the budget (its own parameters left out: they are its planner's)."""
        traced = self._traced(kind, model)
        try:
            return optimize(traced, *inputs, budget=self.budget, planner=self.planner, model=model,
                            optimizer=optimizer, options=self.options, **self.params)
        except InfeasibleBudgetError as exc:
            if self.planner == FALLBACK:
                raise
            own = " ".join(str(exc).split())
        log.warning("memplan: %s cannot plan steps of batch %s (%s): planned by %s", self.planner, kind.describe(),
                    own, FALLBACK)
        self._emit({f"{PREFIX}batch": kind.describe(), f"{PREFIX}fallback": f"{self.planner}: {own}"})
        try:
            return optimize(traced, *inputs, budget=self.budget, planner=FALLBACK, model=model, optimizer=optimizer,
                            options=self.options)
        except InfeasibleBudgetError as exc:
            raise InfeasibleBudgetError(f"{self.planner}: {own}; {FALLBACK}: {' '.join(str(exc).split())}",
                                        budget_bytes=exc.budget_bytes, min_feasible_bytes=exc.min_feasible_bytes) \
                from None

    def _traced(self, kind: StepKind, model) -> Callable:
        """The function traced for `kind`: the framework's step, from the gradients it starts with."""
        def traced(*inputs):
            if not kind.grads_present:
                for p in model.parameters():
                    p.grad = None
            return self._current(*inputs)

        return traced

    def _unplanned(self, kind: StepKind, reason: str) -> None:
        if self.strict:
            raise MemplanError(f"memplan: steps of batch {kind.describe()} cannot be planned (strict): {reason}")
        log.warning("memplan: steps of batch %s run unplanned: %s", kind.describe(), reason)
        self._emit({f"{PREFIX}batch": kind.describe(), f"{PREFIX}unplanned": reason})
        return None

    @staticmethod
    def _check_persistent(step: OptimizedStep) -> None:
        """Warn when what the optimizer step holds (outside the plan) is over the budget alone."""
        held = sum(s.nbytes for s in step.trace.storages if s.kind in PERSISTENT_KINDS)
        budget = step.plan.budget_bytes
        if held > budget:
            log.warning("memplan: parameters, gradients and optimizer state take %d bytes, more than the budget of %d "
                        "bytes: the optimizer step, which runs outside the plan, holds them all", held, budget)

    # --- running ----------------------------------------------------------------------------

    def run(self, step_fn: Callable, inputs: tuple, model, optimizer):
        """Run `step_fn(*inputs)` (forward and backward) under the plan of its kind."""
        kind = kind_of(inputs, model)
        step = self.step_for(kind, step_fn, inputs, model, optimizer)
        if step is None:
            return step_fn(*inputs)
        try:
            return step(*inputs)
        finally:
            step.restore()
            self._report_first(kind, step)

    def begin(self, kind: StepKind, step_fn: Callable, inputs: tuple, model, optimizer) -> None:
        """Begin a step that the framework runs itself (until `end`), under the plan of `kind`;
        `step_fn(*inputs)` stands for it when the kind is traced."""
        self.end()
        step = self.step_for(kind, step_fn, inputs, model, optimizer)
        if step is not None:
            context = step.iteration(*inputs)
            context.__enter__()
            self._open = (context, step, kind)

    def end(self, exc: BaseException | None = None) -> None:
        """End the step `begin` began (if any): everything comes back to the device."""
        if self._open is None:
            return
        context, step, kind = self._open
        self._open = None
        try:
            context.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
        finally:
            step.restore()
        self._report_first(kind, step)

    @property
    def in_step(self) -> bool:
        """A step begun with `begin` has not ended yet."""
        return self._open is not None

    # --- reports ----------------------------------------------------------------------------

    def _report_first(self, kind: StepKind, step: OptimizedStep) -> None:
        """After a plan's first step: its report, with that step's measured peak."""
        if kind in self._unreported:
            self._unreported.discard(kind)
            self._emit(plan_report(kind, step))

    def _emit(self, entry: dict) -> None:
        self.reports.append(entry)
        self.report(entry)

    def stats(self) -> list[dict]:
        """Per plan made (released ones too): its batch and `OptimizedStep.stats()`, with every
        measured step's peak (`steps_measured`) beside the budget."""
        live = [{"batch": kind.describe(), **step.stats()} for kind, step in self.steps.items() if step is not None]
        return self._closed + live

    def close(self) -> None:
        """End any open step, bring everything back and release every plan's host memory."""
        self.end()
        self._closed = self.stats()
        for step in self.steps.values():
            if step is not None:
                step.close()
        self.steps.clear()


def _check_settings(budget, planner: str, params: dict) -> None:
    """Refuse a bad budget, planner or planner parameter at once, not at the first batch.

    Raises:
        MemplanError: one line naming what is wrong.
    """
    parse_budget(budget)
    check_planner_params(get_planner(planner), params)


def plan_report(kind: StepKind, step: OptimizedStep) -> dict:
    """What a framework's logs show of one plan: the batch, the planner, the budget, the peak the
    plan holds (simulated), the first step's measured peak, the unplanned peak and the predicted
    overhead (simulated step time against the unplanned one)."""
    stats = step.stats()
    measured = stats["steps_measured"]
    return {f"{PREFIX}batch": kind.describe(), f"{PREFIX}planner": step.plan.planner,
            f"{PREFIX}budget_bytes": stats["budget_bytes"],
            f"{PREFIX}peak_bytes": stats["simulated_peak_bytes"],
            f"{PREFIX}measured_peak_bytes": measured[0]["measured_peak_bytes"] if measured else None,
            f"{PREFIX}unplanned_peak_bytes": step.trace.peak_load_bytes,
            f"{PREFIX}predicted_overhead": step.plan.predicted.get("overhead"),
            f"{PREFIX}planning_s": round(step.plan.planning_s, 3)}
