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
from ..cost.model import Cost
from ..errors import MemplanError
from ..exec.runtime import PlanRuntime
from ..model import Plan, Trace, check_plan, read_plan
from ..model.program import StepProgram
from ..planners.base import plan_problem
from ..problem import DEFAULT_PROFILE, Problem
from ..sim.program import compile_program
from .compiled import CompiledStep, compile_settings, compiled_step
from .cuda_graph import CudaGraphs, changed_inputs, check_mode, graphs_for
from .keep_budget import BudgetKeeper
from .memory_cap import RESERVED_TOLERANCE
from .step_trace import (device_of, find_in_step, input_signature, is_fake, load_trace, model_of,
                         prime_optimizer_state, trace_step)

log = logging.getLogger(__name__)

EXECUTORS = ("auto", "interpreted")  # optimize(executor=...): hooked where a plan can be, or always interpreted

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

    def __init__(self, step_fn: Callable, trace: Trace, plan: Plan, runtime: PlanRuntime, signature: tuple,
                 model: torch.nn.Module | None = None, *, keeper: BudgetKeeper | None = None,
                 cost: Cost | None = None, measure: bool = True, hooks: bool = True,
                 graphs: CudaGraphs | None = None):
        self.step_fn = step_fn
        self.model = model
        self.trace = trace
        self.plan = plan
        self.program: StepProgram = runtime.program
        self.runtime = runtime
        self.signature = signature
        self.keeper = keeper
        self.cost = cost  # the cost model the plan was compiled with
        self.graphs = graphs  # the CUDA graph side (memplan.workflows.cuda_graph); None: never captured
        self._measure = measure
        self._hooks = hooks  # new plans compile for the hooked executor where they can
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
        program = compile_program(self.trace, plan, self.cost, hooks=self._hooks)
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
             planner: str = "none", profile: str = DEFAULT_PROFILE, model: torch.nn.Module | None = None,
             optimizer: torch.optim.Optimizer | None = None, plan: Plan | str | os.PathLike | None = None,
             trace: Trace | str | os.PathLike | None = None, seed: int = 0, measure: bool | str = "first",
             time_repeats: int = 0, time_clock: str = "wall", fake: bool | None = None,
             executor: str = "auto", cuda_graph: str = "off", compile: bool | dict = False,
             **planner_params) -> OptimizedStep | CompiledStep:
    """Trace `step_fn`, plan it under `budget` and return the step wrapped to run under the plan.

    Args:
        step_fn: one training iteration (forward, backward, optimizer step) of `model`.
        *example_inputs: inputs of one call (their shapes are the planned ones).
        budget: memory budget ("8GiB", "60%" of the unplanned peak, bytes); "none": no limit.
        planner: a registered planner name.
        profile: the cost model's device profile the planner plans for (where the step runs is
            where its inputs and model are).
        model: the root module, whose parameters and buffers the plan may move (else found on the step).
        optimizer: its optimizer (found likewise); its state is restored after tracing.
        plan: a saved plan (a Plan or a JSON path) to use instead of planning.
        trace: a saved trace (a Trace or a path) to use instead of tracing.
        seed: planner seed.
        measure: which steps' peak memory to measure and check against the budget: "first" (the
            default: the first step of every plan made, re-planning until one keeps it), True (every
            step) or False (none, and no check). A step over its budget logs a warning and is listed
            in `stats()["over_budget_steps"]` (the CPU meter slows many small ops 2-3 times).
        time_repeats: on the CPU, time every op of the real trace (the least of this many more
            iterations, undone afterwards); 0: roofline estimates.
        time_clock: the clock of those durations: "wall", or "cpu" (this thread's CPU time).
        fake: trace fake copies of the model, its state and inputs, allocating nothing (None: on
            a GPU, where the unplanned step may not fit).
        executor: "auto": the plan runs at autograd's hooks where it can (memplan.exec.hooked), else
            interpreted; "interpreted": always the dispatch-mode runner (memplan.exec.runner).
        cuda_graph: "auto": on CUDA, after warm-up steps, the step is captured as one CUDA graph and
            replayed where it can be (memplan.workflows.cuda_graph; a warning says why not); "on": that
            is an error, as is a step off CUDA; "off" (the default until a GPU run shows captures work).
        compile: run the model's forward through torch.compile with the plan lowered onto its
            partitioner (docs/compile.md): True, or torch.compile's keyword arguments (backend
            inductor or aot_eager; "method": another method to compile); not with cuda_graph (use
            mode "reduce-overhead") nor executor "interpreted".
        **planner_params: the planner's hyper-parameters.
    Returns:
        The OptimizedStep (with compile: a CompiledStep, alike to use).
    Raises:
        MemplanError: a plan made for another trace, an unknown planner, cuda_graph "on" that cannot be.
    """
    model = model_of(step_fn, model)
    optimizer = optimizer if optimizer is not None else find_in_step(step_fn, torch.optim.Optimizer, "optimizer")
    hooks, options = _hooked(executor, model), compile_settings(compile, executor, cuda_graph)
    run_on = device_of(example_inputs, model)
    check_mode(cuda_graph, run_on)
    trace = _traced(step_fn, example_inputs, trace, model=model, optimizer=optimizer, time_repeats=time_repeats,
                    time_clock=time_clock, fake=run_on.type == "cuda" if fake is None else fake)
    if options is not None:
        return compiled_step(step_fn, example_inputs, as_allocated_on(trace, run_on), model=model, optimizer=optimizer,
                             device=run_on, budget=budget, planner=planner, profile=profile, seed=seed,
                             plan=_saved_plan(plan, trace), measure=measure, options=options, params=planner_params)
    trace, plan, cost, keeper = _plan_of(trace, plan, run_on, profile, budget, measure is not False, planner=planner,
                                         seed=seed, **planner_params)
    return _bound(step_fn, example_inputs, trace, plan, cost, keeper, model=model, optimizer=optimizer,
                  run_on=run_on, measure=measure, hooks=hooks, cuda_graph=cuda_graph)


def execute(step_fn: Callable, *example_inputs, plan: Plan | str | os.PathLike,
            trace: Trace | str | os.PathLike | None = None, **options) -> OptimizedStep:
    """`step_fn` run under a plan already made (`memplan.execute`): `optimize` with `plan`, and a
    `trace` when the plan was made for a saved one (else the step is traced again, and the plan
    must be of that trace). `options` are `optimize`'s.

    Raises:
        MemplanError: as `optimize`; PlanMismatchError: the plan is of another trace.
    """
    return optimize(step_fn, *example_inputs, plan=plan, trace=trace, **options)


def _plan_of(trace: Trace, plan, run_on: torch.device, profile: str, budget, keep: bool, *, planner: str, seed: int,
             **params) -> tuple[Trace, Plan, Cost, BudgetKeeper | None]:
    """The trace as `run_on` holds it, the plan (`plan`, else one `planner` makes under `budget`), the
    cost model on `profile`, and the budget keeper (`keep`)."""
    if plan is not None:
        return trace, _saved_plan(plan, trace), Problem.of(trace, profile=profile).cost, None
    problem = Problem.of(as_allocated_on(trace, run_on), budget, profile, seed=seed)
    plan, keeper = _planned(problem, keep, planner, params)
    return problem.trace, plan, problem.cost, keeper


def _bound(step_fn: Callable, inputs: tuple, trace: Trace, plan: Plan, cost: Cost, keeper: BudgetKeeper | None, *,
           model, optimizer, run_on: torch.device, measure, hooks: bool, cuda_graph: str) -> OptimizedStep:
    """`step_fn` bound to `plan`: its step program, the CUDA graph side and the runtime (settled)."""
    program = compile_program(trace, plan, cost, hooks=hooks)
    fake = is_fake(inputs, model)
    graphs = graphs_for(cuda_graph, run_on, trace, program, optimizer=optimizer, inputs=inputs, fake=fake)
    runtime = PlanRuntime(trace, program, model, device=run_on, optimizer=optimizer, measure=measure,
                          engine=graphs.engine())
    if not fake:
        runtime.settle()  # the first step starts as every later one does
    return OptimizedStep(step_fn, trace, plan, runtime, input_signature(inputs), model, keeper=keeper, cost=cost,
                         measure=measure, hooks=hooks, graphs=graphs)


def _traced(step_fn: Callable, inputs: tuple, trace, *, model, optimizer, time_repeats: int, time_clock: str,
            fake: bool) -> Trace:
    """`trace` loaded, or `step_fn` traced from the steady state (the optimizer's state made first)."""
    if optimizer is not None and not is_fake(inputs, model):
        prime_optimizer_state(optimizer)
    if trace is not None:
        return load_trace(trace)
    return trace_step(step_fn, inputs, model, optimizer, time_repeats, time_clock, fake=fake)


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


def _hooked(executor: str, model) -> bool:
    """Whether plans may run at autograd's hooks (a region run needs the module)."""
    if executor not in EXECUTORS:
        raise MemplanError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    return executor == "auto" and model is not None


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
