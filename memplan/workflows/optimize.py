"""`memplan.optimize`: trace a training step, plan it under a budget, run it under the plan.

    step = memplan.optimize(train_step, x, y, budget="60%", planner="sqrt-n", model=model)
    for x, y in loader:
        loss = step(x, y)                 # one iteration under the plan

    with memplan.optimize(train_step, x, y, budget="60%", model=model) as run:
        for x, y in loader:               # a loop the user owns: each call of the model's
            loss = model(x) ...           # forward starts an iteration under the plan

A saved plan is reused with `optimize(..., plan="plan.json", trace="trace.jsonl")`. The
plan is compiled into a step program (memplan.sim.program) that the executor runs at every
op; the first step's peak memory is measured (`measure=True`: every step's;
`step.stats()["steps_measured"]`), and a step above its budget is warned about.
Calls whose inputs differ in shape or dtype from the traced ones run unplanned, with a
warning; a step whose ops disagree with the trace brings everything back and finishes
unplanned. Either way training stays correct. On CUDA the planned step is captured as one CUDA
graph after warm-up steps and replayed (`cuda_graph`, memplan.workflows.cuda_graph).

On a GPU the step is traced on fake copies of the model (nothing of it is allocated, so a
step that does not fit unplanned can be planned), the trace is seen as the CUDA allocator
counts it (memplan.cost.device_memory), and the first steps are checked against the budget:
a step over it makes the planner plan again with the excess as a margin
(memplan.workflows.keep_budget; `stats()` reports `margin_bytes` and `replanned`).

The traced iteration is a steady-state one (optimizer state exists). So that the first
planned step is one too, an optimizer without state gets it before tracing, as its first
step would create it (`prime_optimizer_state`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import warnings
from typing import Callable

import torch

from ..budget import UNLIMITED, Budget
from ..cost.device_memory import cublas_handles, cublas_workspace_bytes, device_view
from ..exec.runtime import PlanRuntime
from ..model import Plan, Trace, check_plan, read_plan
from ..model.program import StepProgram
from ..planners.base import plan_problem
from ..problem import Problem
from ..run_options import RunOptions, split_options
from ..sim.program import compile_program
from .compiled import CompiledStep, compiled_step
from .cuda_graph import CudaGraphs, changed_inputs, check_mode, graphs_for
from .keep_budget import BudgetKeeper
from .memory_cap import RESERVED_TOLERANCE
from .step_trace import (TrainingStep, input_signature, is_fake, load_trace, model_of, prime_optimizer_state,
                         trace_step)

log = logging.getLogger(__name__)

__all__ = ["OptimizedStep", "execute", "optimize", "prime_optimizer_state", "trace_step", "model_of", "input_signature"]


class OptimizedStep:
    """A training step bound to a plan: call it, or use it as a context manager.

    Attributes:
        trace: the traced iteration (on a GPU, as the allocator counts it).
        plan: the plan it runs under (the latest, when the budget made the planner plan again).
        runtime: the PlanRuntime (hooks, host slab, copy lanes).
        model: the model trained (given, or found on the step function; None if neither).
        keeper: checks measured steps against the budget and plans again (None without a budget).
    """

    def __init__(self, target: TrainingStep, problem: Problem, plan: Plan, runtime: PlanRuntime, *,
                 options: RunOptions, keeper: BudgetKeeper | None = None, graphs: CudaGraphs | None = None):
        self.step_fn = target.step_fn
        self.model = target.model
        self.problem = problem  # the trace (on a GPU, as the allocator counts it) and the cost model the plan runs on
        self.trace = problem.trace
        self.plan = plan
        self.program: StepProgram = runtime.program
        self.runtime = runtime
        self.signature = target.signature
        self.keeper = keeper
        self.graphs = graphs  # the CUDA graph side (memplan.workflows.cuda_graph); None: never captured
        self._measure = options.measure
        self._hooks = hooked(target, options)  # new plans compile for the hooked executor where they can
        self._earlier_steps: list[dict] = []  # step records of runtimes replaced by a new plan
        self.on_settled: Callable[[], None] | None = None  # called once a measured step keeps the budget
        self._ctx = None
        self._warned = False

    def __call__(self, *inputs):
        """Run one iteration under the plan (unplanned, with a warning, if the inputs differ); with a
        CUDA graph, a warm-up step, the capture or a replay (memplan.workflows.cuda_graph)."""
        if input_signature(inputs) != self.signature:
            if self.graphs is not None:
                changed_inputs(self.graphs, self.signature, inputs)
            if not self._warned:
                warnings.warn("memplan: inputs differ from the traced ones (shape or dtype): "
                              "running this step without the plan", RuntimeWarning, stacklevel=2)
                self._warned = True
            self.runtime.restore()
            return self.step_fn(*inputs)
        if self._ctx is not None:
            return self._step(inputs)
        if self.graphs is not None and self.graphs.active:
            return self.graphs.run(self, inputs)
        return self.run_planned(inputs)

    def run_planned(self, inputs: tuple):
        """One eager iteration under the plan, then the budget's check (`keep_budget`)."""
        out = self.run_installed(inputs)
        self.keep_budget()
        return out

    def run_installed(self, inputs: tuple):
        """One eager iteration under the plan, its runtime installed for it."""
        with self.runtime.installed():
            return self._step(inputs)

    @property
    def settled(self) -> bool:
        """True once no measured step can make the planner plan again."""
        return self.keeper is None or self.keeper.settled

    @property
    def cost(self):
        """The cost model the plan was compiled with (the problem's)."""
        return self.problem.cost

    @property
    def predicted(self):
        """The step program's simulated result (memplan.model.program.Prediction)."""
        return self.program.predicted

    def last_step(self) -> dict:
        """The record of the last step run ({} before any)."""
        return self.runtime.steps[-1] if self.runtime.steps else {}

    def host_buffers(self) -> tuple:
        """The host memory beside the device role (the runtime's slab): no meter counts it."""
        return self.runtime.host_buffers()

    @contextlib.contextmanager
    def iteration(self, *inputs):
        """One iteration under the plan, run by the code in the block rather than by `step_fn`:
        for a framework whose own hooks begin and end the step (memplan.integrations.lightning).

        Args:
            *inputs: the step's inputs (the meter counts them as the step's memory).
        """
        with self.runtime.installed():
            self.runtime.begin_step(inputs)
            yield self
        self.keep_budget()

    def _step(self, inputs: tuple):
        self.runtime.begin_step(inputs)
        try:
            out = self.step_fn(*inputs)
        except BaseException:
            self.runtime.end_step(aborted=True)
            raise
        self.runtime.end_step()
        return out

    def keep_budget(self) -> None:
        """After a measured step: plan again if it was over the budget (memplan.workflows.keep_budget)."""
        if self.keeper is None or self.keeper.settled:
            return
        measured = judged_bytes(self.runtime.steps[-1])
        if measured is None:
            return
        plan = self.keeper.after_step(measured, self.program.predicted.peak_load_bytes)
        if plan is not None:
            self._run_plan(plan)
            return
        if self.keeper.settled and not self.keeper.error and self.on_settled is not None:
            self.on_settled()
        if self.keeper.settled and not self._measure:
            self.runtime.stop_measuring()

    def _run_plan(self, plan: Plan) -> None:
        """From the next step on, run `plan` (the current runtime brings everything back first)."""
        program = compile_program(self.problem, plan, hooks=self._hooks)
        runtime = PlanRuntime(self.trace, program, self.model, device=self.runtime.device,
                              optimizer=self.runtime.optimizer, measure=True if self._measure is True else "first",
                              engine=self.graphs.engine() if self.graphs is not None else None)
        self._earlier_steps += self.runtime.steps
        self.runtime.close()
        runtime.settle()
        self.plan, self.program, self.runtime = plan, program, runtime

    def __enter__(self) -> "OptimizedStep":
        if self.graphs is not None:
            self.graphs.own_loop()
        self._ctx = self.runtime.installed(auto_steps=True)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        ctx, self._ctx = self._ctx, None
        try:
            ctx.__exit__(*exc)
        finally:
            self.close()

    def stats(self) -> dict:
        """The runtime's counters and each step's measured peak beside the simulated one
        (see PlanRuntime.stats), and what keeping the budget took (`margin_bytes`, `replanned`)."""
        out = self.runtime.stats()
        out["steps_measured"] = self._earlier_steps + out["steps_measured"]
        out["final_plan_from_step"] = len(self._earlier_steps)  # the first step the current plan ran
        out.update(self.keeper.report() if self.keeper else {"margin_bytes": 0, "replanned": 0})
        if self.graphs is not None:
            out["cuda_graph"] = self.graphs.report(self)
        return out

    def restore(self) -> None:
        """Bring back parameters and optimizer state that the plan keeps on the host between steps.

        Calling the model, the optimizer's step, or `state_dict()`/`load_state_dict()` of
        either does it by itself; call this before touching them otherwise.
        """
        self.runtime.restore()

    def close(self) -> None:
        """Bring everything back to the device; release the CUDA graph, the host slabs and the copy lanes."""
        if self.graphs is not None:
            self.graphs.close()
        self.runtime.close()


def optimize(step_fn: Callable, *example_inputs, budget: Budget | str | int | float = UNLIMITED,
             planner: str = "none", model: torch.nn.Module | None = None,
             optimizer: torch.optim.Optimizer | None = None, plan: Plan | str | os.PathLike | None = None,
             trace: Trace | str | os.PathLike | None = None, options: RunOptions | None = None,
             **keywords) -> OptimizedStep | CompiledStep:
    """Trace `step_fn`, plan it under `budget` and return the step wrapped to run under the plan.

    Args:
        step_fn: one training iteration (forward, backward, optimizer step) of `model`.
        *example_inputs: inputs of one call (their shapes are the planned ones).
        budget: memory budget ("8GiB", "60%" of the unplanned peak, bytes); "none": no limit.
        planner: a registered planner name.
        model: the root module, whose parameters and buffers the plan may move (else found on the step).
        optimizer: its optimizer (found likewise); its state is restored after tracing.
        plan: a saved plan (a Plan or a JSON path) to use instead of planning.
        trace: a saved trace (a Trace or a path) to use instead of tracing.
        options: how the step runs (memplan.RunOptions); any of its fields may be given by name
            instead, among `keywords`. Those `optimize` reads:
            profile: the cost model's device profile the planner plans for (where the step runs is
                where its inputs and model are). seed: planner seed.
            measure: which steps' peak memory to measure and check against the budget: "first" (the
                default: the first step of every plan made, re-planning until one keeps it), True (every
                step) or False (none, and no check). A step over its budget logs a warning and is listed
                in `stats()["over_budget_steps"]` (the CPU meter slows many small ops 2-3 times).
            time_repeats: on the CPU, time every op of the real trace (the least of this many more
                iterations, undone afterwards); 0: roofline estimates.
            clock: the clock of those durations: "wall", or "cpu" (this thread's CPU time).
            fake: trace fake copies of the model, its state and inputs, allocating nothing (None: on
                a GPU, where the unplanned step may not fit).
            executor: "auto": the plan runs at autograd's hooks where it can (memplan.exec.hooked), else
                interpreted; "interpreted": always the dispatch-mode runner (memplan.exec.interpreted).
            cuda_graph: "auto": on CUDA, after warm-up steps, the step is captured as one CUDA graph and
                replayed where it can be (memplan.workflows.cuda_graph; a warning says why not); "on": that
                is an error, as is a step off CUDA; "off" (the default until a GPU run shows captures work).
            compile: run the model's forward through torch.compile with the plan lowered onto its
                partitioner (docs/compile.md): True, or torch.compile's keyword arguments (backend
                inductor or aot_eager; "method": another method to compile); not with cuda_graph (use
                mode "reduce-overhead") nor executor "interpreted".
        **keywords: run options by name (above), and the planner's hyper-parameters.
    Returns:
        The OptimizedStep (with compile: a CompiledStep, alike to use).
    Raises:
        MemplanError: a plan made for another trace, an unknown planner, cuda_graph "on" that cannot be.
    """
    given, params = split_options(keywords)
    options = RunOptions.of(options, **given)
    target = TrainingStep.of(step_fn, example_inputs, model, optimizer)
    check_mode(options.cuda_graph, target.device)
    trace = _traced(target, example_inputs, trace, options)
    if options.compiled:
        return compiled_step(target, as_allocated_on(trace, target.device), budget=budget, planner=planner,
                             plan=_saved_plan(plan, trace), options=options, params=params)
    problem, plan, keeper = _plan_of(target, trace, plan, budget, options, planner=planner, params=params)
    return _bound(target, example_inputs, problem, plan, keeper, options)


def execute(step_fn: Callable, *example_inputs, plan: Plan | str | os.PathLike,
            trace: Trace | str | os.PathLike | None = None, **options) -> OptimizedStep:
    """`step_fn` run under a plan already made (`memplan.execute`): `optimize` with `plan`, and a
    `trace` when the plan was made for a saved one (else the step is traced again, and the plan
    must be of that trace). `options` are `optimize`'s.

    Raises:
        MemplanError: as `optimize`; PlanMismatchError: the plan is of another trace.
    """
    return optimize(step_fn, *example_inputs, plan=plan, trace=trace, **options)


def _plan_of(target: TrainingStep, trace: Trace, plan, budget, options: RunOptions, *, planner: str,
             params: dict) -> tuple[Problem, Plan, BudgetKeeper | None]:
    """The problem (the trace as the step's device holds it, priced on the options' profile), the plan
    (`plan`, else one `planner` makes under `budget`), and the budget keeper (while steps are measured)."""
    if plan is not None:
        return Problem.of(trace, profile=options.profile), _saved_plan(plan, trace), None
    problem = Problem.of(as_allocated_on(trace, target.device), budget, options.profile, seed=options.seed)
    plan, keeper = _planned(problem, options.measure is not False, planner, params)
    return problem, plan, keeper


def _bound(target: TrainingStep, inputs: tuple, problem: Problem, plan: Plan, keeper: BudgetKeeper | None,
           options: RunOptions) -> OptimizedStep:
    """The step bound to `plan`: its step program, the CUDA graph side and the runtime (settled)."""
    program = compile_program(problem, plan, hooks=hooked(target, options))
    fake = is_fake(inputs, target.model)
    graphs = graphs_for(options.cuda_graph, target.device, problem.trace, program, optimizer=target.optimizer,
                        inputs=inputs, fake=fake)
    runtime = PlanRuntime(problem.trace, program, target.model, device=target.device, optimizer=target.optimizer,
                          measure=options.measure, engine=graphs.engine())
    if not fake:
        runtime.settle()  # the first step starts as every later one does
    return OptimizedStep(target, problem, plan, runtime, options=options, keeper=keeper, graphs=graphs)


def _traced(target: TrainingStep, inputs: tuple, trace, options: RunOptions) -> Trace:
    """`trace` loaded, or the step traced from the steady state (the optimizer's state made first)."""
    if target.optimizer is not None and not is_fake(inputs, target.model):
        prime_optimizer_state(target.optimizer)
    if trace is not None:
        return load_trace(trace)
    fake = target.device.type == "cuda" if options.fake is None else options.fake
    return trace_step(target.step_fn, inputs, target.model, target.optimizer, options.time_repeats, options.clock,
                      fake=fake)


def _saved_plan(plan, trace: Trace) -> Plan | None:
    """A plan given to `optimize` (a Plan or a path), checked against `trace`; None without one."""
    if plan is None:
        return None
    plan = read_plan(plan, trace) if not isinstance(plan, Plan) else plan
    check_plan(trace, plan)
    return plan


def judged_bytes(record: dict) -> int | None:
    """What a measured step is judged on against the budget: its allocated peak, and on a GPU its reserved
    peak less the share the allocator may hold beyond the budget (memplan.workflows.memory_cap): what
    `hold_reserved` then enforces is what a step that kept the budget held. None: not measured."""
    allocated, reserved = record.get("measured_peak_bytes"), record.get("measured_peak_reserved_bytes")
    if allocated is None or reserved is None:
        return allocated
    return max(allocated, math.ceil(reserved / (1 + RESERVED_TOLERANCE)))


def hooked(target: TrainingStep, options: RunOptions) -> bool:
    """Whether plans may run at autograd's hooks (a region run needs the module)."""
    return options.hooked and target.model is not None


def _planned(problem: Problem, keep: bool, planner: str, params: dict) -> tuple[Plan, BudgetKeeper | None]:
    """`planner`'s plan of `problem`, and, with `keep` and a budget, the keeper that plans again at a
    margin if a step measures over it."""
    plan = plan_problem(problem, planner, **params)
    if not problem.limited or not keep:
        return plan, None
    return plan, BudgetKeeper(budget_bytes=plan.budget_bytes,
                              make_plan=lambda nbytes: plan_problem(problem.at(nbytes), planner, **params))


def as_allocated_on(trace: Trace, device: torch.device) -> Trace:
    """`trace` with what CUDA `device` holds beside it (memplan.cost.device_memory): the cuBLAS
    workspaces of the step and every op's inner memory; elsewhere the trace itself.

    Storages keep their own sizes: the executor finds them, and a pool slot serves them, by the
    bytes they ask for; the allocator's rounding (under 512 bytes a storage) is left to the
    margin a measured step gives (memplan.workflows.keep_budget)."""
    if device.type != "cuda" or "device_memory" in trace.meta:
        return trace
    major = torch.cuda.get_device_capability(device)[0]
    handles = cublas_handles(trace)
    held = {f"cuBLAS workspaces ({handles} handles)": handles * cublas_workspace_bytes(major)} if handles else {}
    inner = {int(op): nbytes for op, nbytes in trace.meta.get("op_inner_bytes", {}).items()}  # memplan.tracing.opbench
    return device_view(trace, held=held, inner=inner, rounded=False)
