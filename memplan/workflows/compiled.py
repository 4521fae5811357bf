"""`memplan.optimize(..., compile=True)`: memplan plans the step, torch.compile runs it.

The step is traced and planned as for eager training, on a cost model of compiled execution
(memplan.cost.compiled) and on the trace without its hook records (the compiler places every
decision at its op, so nothing is moved onto hooks). The model's forward is then compiled with
the plan lowered onto the partitioner that splits its joint graph (memplan.exec.partition):
what the plan recomputes is recomputed by the compiled backward, what it swaps is offloaded
where the compiler can offload (CUDA), and the rest is the compiler's own choice. Swaps need a
GPU: elsewhere the planner plans without them (`auto`'s `swaps=False`; a planner that swaps is
refused), which is said once in the log.

The budget is kept in measured bytes: the first step after each compilation is metered (on the
CPU from the allocator's own events, on a GPU by its counters); one over the budget, or one whose
plan left memory unused, makes the planner plan once more with the margin measured
(memplan.workflows.keep_budget.FitOnce), and the forward compiles again: at most two compilations
per budget (COMPILATIONS).
"""

from __future__ import annotations

import contextlib
import logging
import time
import types
import warnings
from dataclasses import replace
from typing import Callable

import torch

from ..budget import budget_in_force, bytes_to_json
from ..cost.compiled import compiled_cost
from ..errors import InfeasibleBudgetError, MemplanError
from ..exec.partition import CompiledPlan, PlanPartitioner, compile_options, offload_available
from ..model import Plan, Trace
from ..model.program import COMPILED, Prediction
from ..planners.base import get_planner, plan_problem
from ..problem import Problem, cost_of
from ..run_options import RunOptions
from ..sim.stage import simulate
from .keep_budget import FitOnce, least_load_plan
from .measure import StepMeter
from .step_trace import TrainingStep, input_signature

log = logging.getLogger(__name__)

COMPILATIONS = 2  # compilations per budget at most: the first plan's, and one plan made again with a margin
_LIVE = ("plan", "predicted", "partitioner", "compiled")  # what a compilation's record holds beside its report
MIN_GAIN = 0.01  # a plan made to use memory the first left is compiled if it simulates this much faster
METHOD = "method"  # the key of compile's options that names the model's method compiled (default "forward")
SWAPLESS = "auto"  # the planner whose `swaps` parameter turns swaps off
LEAST_TRIES = 3  # loads an infeasible budget names that are tried in turn for a plan the measured step may keep


def compiled_problem(trace: Trace, budget, profile, seed: int = 0) -> Problem:
    """The planning problem of a compiled step: `trace` without its hook records (the compiler
    takes each decision at its op), priced as compiled (memplan.cost.compiled)."""
    return Problem.of(replace(trace, saved=(), calls=()), budget, seed=seed,
                      cost=compiled_cost(trace, cost_of(trace, profile)))


def plan_compiled(problem: Problem, planner: str, offload: bool, params: dict) -> Plan:
    """`planner`'s plan of a compiled step; without `offload`, a plan without swaps.

    Raises:
        MemplanError: without offload, a planner that only swaps, or whose plan swaps.
    """
    if not offload:
        spec = get_planner(planner)
        if planner == SWAPLESS:
            params = {"swaps": False, **params}
        elif "swap" in spec.decides and "recompute" not in spec.decides:
            raise MemplanError(f"planner {planner!r} only swaps, and this compiled step cannot offload (compile-time "
                               f"activation offload needs CUDA): use auto, or a planner that recomputes")
    plan = plan_problem(problem, planner, **params)
    if not offload and any(d.action == "swap" for d in plan.decisions):
        raise MemplanError(f"planner {planner!r} swapped, and this compiled step cannot offload (compile-time "
                           f"activation offload needs CUDA): use auto, or a planner that only recomputes")
    return plan


class CompiledStep:
    """A training step whose model's forward runs compiled, under a plan lowered onto the compiler.

    Call it like the step function (its first steps are metered and keep the budget), or use it as a
    context manager around a loop you own (the compiled forward runs under the plan made first).

    Attributes:
        trace: the traced step. plan: the plan the compiled forward runs (the latest).
        model: the model whose forward is compiled. keeper: keeps the budget (None without one).
        steps: a record per metered step (its peak, time, the compilation it ran).
    """

    def __init__(self, target: TrainingStep, problem: Problem, plan: Plan, *, trace: Trace, keeper: FitOnce | None,
                 options: RunOptions):
        self.step_fn, self.model, self.optimizer = target.step_fn, target.model, target.optimizer
        self.trace, self.problem, self.keeper = trace, problem, keeper
        self.signature, self.device = target.signature, target.device
        self._options = dict(options.compile or {})
        self._method = self._options.pop(METHOD, "forward")  # the model's method torch.compile runs
        self._offload = offload_available(self.device)
        self._measure = options.measure
        self._meter = StepMeter(self.device, compiled=True) if options.measure else None
        self._original = self.model.__dict__.get(self._method)  # an instance's own method, put back on close
        self.steps: list[dict] = []  # metered steps
        self.compilations: list[dict] = []  # per plan compiled: its first call's seconds, what was lowered
        self._fresh = False  # the next call compiles
        self._current = 0  # the compilation in force (1-based)
        self._warned = False
        self.on_settled: Callable[[], None] | None = None  # called once a measured step keeps the budget
        self._lower(plan)

    @property
    def meters_itself(self) -> bool:
        """Whether the next call is metered here (memplan.workflows.measure takes its record)."""
        return self._meter is not None and (self._measure is True or self._fresh or not self.settled)

    @property
    def settled(self) -> bool:
        """True once no measured step can make the planner plan again."""
        return self.keeper is None or self.keeper.settled

    @property
    def predicted(self) -> Prediction:
        """The plan's simulated step on the compiled cost model."""
        return self._predicted

    def last_step(self) -> dict:
        """The record of the last metered step ({} before any)."""
        return self.steps[-1] if self.steps else {}

    def __call__(self, *inputs):
        if input_signature(inputs) != self.signature and not self._warned:
            warnings.warn("memplan: inputs differ from the traced ones (shape or dtype): the compiled step "
                          "recompiles for them, its budget was planned for the traced ones", RuntimeWarning,
                          stacklevel=2)
            self._warned = True
        with self.iteration(*inputs):
            return self.step_fn(*inputs)

    @contextlib.contextmanager
    def iteration(self, *inputs):
        """One step run by the code in the block (the step function, or a framework whose own hooks
        begin and end the step): metered while the budget is being kept; the first after a
        compilation is timed (it compiles)."""
        started, fresh, number = time.perf_counter(), self._fresh, self._current
        metering = self._meter.metering(inputs, self.model, self.optimizer) if self.meters_itself else None
        with metering if metering is not None else contextlib.nullcontext({}) as record:
            yield self
        if fresh:
            self.compilations[-1]["first_call_s"] = time.perf_counter() - started
            self._fresh = False
        if metering is not None:
            self.steps.append({**record, "compilation": number})
            self._keep_budget(record["measured_peak_bytes"])

    def _keep_budget(self, measured: int) -> None:
        """After a metered step: compile again under the plan the keeper makes again (FitOnce), if any."""
        if self.keeper is None or self.keeper.settled:
            return
        lowered = self.compilations[self._current - 1]["partitioner"].report()
        plan = self.keeper.after_step(measured, self._predicted.peak_load_bytes,
                                      saved_excess=lowered["saved_bytes"] - lowered["trace_saved_bytes"])
        if plan is not None and (not self.keeper.filling or self._faster(plan)):
            self._lower(plan)
            return
        if plan is not None:
            self.keeper.decline()
        if self.keeper.reverted:  # the first plan kept the budget, the second did not
            self._restore(self.compilations[-2])
        if not self.keeper.error and self.on_settled is not None:
            self.on_settled()

    def _faster(self, plan: Plan) -> bool:
        """Whether `plan` simulates faster than the one in force by more than MIN_GAIN (another
        compilation is worth that)."""
        time_s = _prediction(self.problem, plan).time_s
        return time_s is not None and time_s < self._predicted.time_s * (1 - MIN_GAIN)

    def _lower(self, plan: Plan) -> None:
        """Compile the model's forward under `plan` (from the next call on)."""
        predicted = _prediction(self.problem, plan)
        partitioner = PlanPartitioner(self.trace, CompiledPlan.of(self.trace, plan, offload=self._offload))
        options = compile_options(partitioner, self._options)
        if self._original is not None:  # the instance's own callable
            compiled = torch.compile(self._original, **options)
        else:  # the class's function, bound to the model: a method still (Lightning inspects its training_step)
            compiled = types.MethodType(torch.compile(getattr(type(self.model), self._method), **options), self.model)
        self.compilations.append({"planner": plan.planner, "budget_bytes": plan.budget_bytes,
                                  "simulated_peak_bytes": predicted.peak_load_bytes, "simulated_step_s": predicted.time_s,
                                  "plan": plan, "predicted": predicted, "partitioner": partitioner, "compiled": compiled})
        self._restore(self.compilations[-1])
        self._fresh = True

    def _restore(self, compilation: dict) -> None:
        """Run `compilation`'s plan from the next call on (its graph compiled already, if it ran)."""
        self.plan, self._predicted = compilation["plan"], compilation["predicted"]
        setattr(self.model, self._method, compilation["compiled"])
        self._current = self.compilations.index(compilation) + 1

    def stats(self) -> dict:
        """What the compiled step did: each compilation (its first call's seconds, what it lowered
        onto the partitioner), the metered steps, and what keeping the budget took (`margin_bytes`,
        `replanned`)."""
        compilations = [{**{k: v for k, v in c.items() if k not in _LIVE}, **c["partitioner"].report()}
                        for c in self.compilations]
        final = len(self.steps)  # the steps since the last one that ran another plan ran the current one
        while final and self.steps[final - 1]["compilation"] == self._current:
            final -= 1
        budget = self.keeper.budget_bytes if self.keeper is not None else self.plan.budget_bytes
        measured = [s["measured_peak_bytes"] for s in self.steps]
        out = {"executor": "compiled", "level": COMPILED, "compilations": compilations,
               "compilation_in_force": self._current, "decisions": len(self.plan.decisions),
               "budget_bytes": bytes_to_json(budget), "simulated_peak_bytes": self._predicted.peak_load_bytes,
               "measured_peak_bytes": max(measured, default=None), "steps_measured": [dict(s) for s in self.steps],
               "final_plan_from_step": final}
        out.update(self.keeper.report() if self.keeper else {"margin_bytes": 0, "replanned": 0})
        return out

    def host_buffers(self) -> tuple:
        """Host memory beside the device role: none (an offload's host copies are the compiler's)."""
        return ()

    def restore(self) -> None:
        """Nothing to bring back between steps: the compiled step keeps parameters and state in place."""

    def close(self) -> None:
        """Put the model's own forward back."""
        if self._original is None:
            self.model.__dict__.pop(self._method, None)
        else:
            setattr(self.model, self._method, self._original)
        if self._meter is not None:
            self._meter.close()
            self._meter = None

    def __enter__(self) -> "CompiledStep":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_plan(problem: Problem, planner: str, offload: bool, params: dict, *, measured: bool) -> Plan:
    """The plan compiled first: `planner`'s under the budget; where the trace's view of memory cannot
    meet it but a measured step may (a compiled step holds less than the trace: it fuses and recomputes
    on its own), the plan of the least load the planner reaches, which the keeper then measures (the
    load an infeasible budget names is tried again: a search may name one it then misses)."""
    def make_plan(load: int) -> Plan:
        return plan_compiled(problem.at(load), planner, offload, params)

    try:
        return make_plan(problem.budget_bytes)
    except InfeasibleBudgetError as exc:
        if not measured or exc.min_feasible_bytes <= problem.budget_bytes:
            raise
        log.info("compiled: %s; planned at that load, the compiled step's peak is measured against the budget", exc)
        return least_load_plan(make_plan, exc, tries=LEAST_TRIES)


def _prediction(problem: Problem, plan: Plan) -> Prediction:
    """The simulation of `plan` on the compiled problem, as a step program's prediction."""
    budget, source = budget_in_force(None, plan.budget_bytes, problem.trace.peak_load_bytes)
    result = simulate(problem.trace, plan, budget=budget, cost=problem.cost)
    return Prediction(**{**result.summary(), "budget_bytes": budget, "budget_source": str(source), "level": COMPILED,
                         "level_reason": "lowered onto torch.compile's partitioner"})


def compiled_step(target: TrainingStep, trace: Trace, *, budget, planner: str, plan: Plan | None,
                  options: RunOptions, params: dict) -> CompiledStep:
    """`optimize(..., compile=...)`'s step: `plan` (else `planner`'s plan under `budget`) lowered
    onto the compiled forward of the step's model.

    Raises:
        MemplanError: no model to compile, or a planner this step cannot run (see plan_compiled).
    """
    if target.model is None:
        raise MemplanError("compile needs the model whose forward is compiled: pass model=...")
    offload = offload_available(target.device)
    if not offload:
        log.info("compiled on %s: planned without swaps (compile-time activation offload needs CUDA)",
                 target.device.type)
    problem = compiled_problem(trace, budget, options.profile, options.seed)
    keeper, measured = None, options.measure is not False
    if plan is None:
        plan = _first_plan(problem, planner, offload, params, measured=measured)
        if problem.limited and measured:
            keeper = FitOnce(budget_bytes=problem.budget_bytes,
                             make_plan=lambda nbytes: plan_compiled(problem.at(nbytes), planner, offload, params))
    return CompiledStep(target, problem, plan, trace=trace, keeper=keeper, options=options)
