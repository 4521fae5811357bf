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
unplanned. Either way training stays correct.

The traced iteration is a steady-state one (optimizer state exists). So that the first
planned step is one too, an optimizer without state gets it before tracing, as its first
step would create it (`prime_optimizer_state`).
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves

from ..cost.model import Cost
from ..errors import MemplanError
from ..exec.runtime import PlanRuntime
from ..model import Plan, Trace, check_plan, read_plan
from ..model.program import StepProgram
from ..sim.program import compile_program

log = logging.getLogger(__name__)


class OptimizedStep:
    """A training step bound to a plan: call it, or use it as a context manager.

    Attributes:
        trace: the traced iteration.
        plan: the plan it runs under.
        runtime: the PlanRuntime (hooks, host slab, copy lanes).
        model: the model trained (given, or found on the step function; None if neither).
    """

    def __init__(self, step_fn: Callable, trace: Trace, plan: Plan, runtime: PlanRuntime, signature: tuple,
                 model: torch.nn.Module | None = None):
        self.step_fn = step_fn
        self.model = model
        self.trace = trace
        self.plan = plan
        self.program: StepProgram = runtime.program
        self.runtime = runtime
        self.signature = signature
        self._ctx = None
        self._warned = False

    def __call__(self, *inputs):
        """Run one iteration under the plan (unplanned, with a warning, if the inputs differ)."""
        if input_signature(inputs) != self.signature:
            if not self._warned:
                warnings.warn("memplan: inputs differ from the traced ones (shape or dtype): "
                              "running this step without the plan", RuntimeWarning, stacklevel=2)
                self._warned = True
            self.runtime.restore()
            return self.step_fn(*inputs)
        if self._ctx is not None:
            return self._step(inputs)
        with self.runtime.installed():
            return self._step(inputs)

    def _step(self, inputs: tuple):
        self.runtime.begin_step(inputs)
        try:
            return self.step_fn(*inputs)
        finally:
            self.runtime.end_step()

    def __enter__(self) -> "OptimizedStep":
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
        (see PlanRuntime.stats)."""
        return self.runtime.stats()

    def restore(self) -> None:
        """Bring back parameters and optimizer state that the plan keeps on the host between steps.

        Calling the model, the optimizer's step, or `state_dict()`/`load_state_dict()` of
        either does it by itself; call this before touching them otherwise.
        """
        self.runtime.restore()

    def close(self) -> None:
        """Bring everything back to the device; release the host slabs and the copy lanes."""
        self.runtime.close()


def optimize(step_fn: Callable, *example_inputs, budget: str | int | None = None, planner: str = "none",
             device: str = "h100", model: torch.nn.Module | None = None,
             optimizer: torch.optim.Optimizer | None = None, plan: Plan | str | os.PathLike | None = None,
             trace: Trace | str | os.PathLike | None = None, seed: int = 0, measure: bool | str = "first",
             time_repeats: int = 0, time_clock: str = "wall", **planner_params) -> OptimizedStep:
    """Trace `step_fn`, plan it under `budget` and return the step wrapped to run under the plan.

    Args:
        step_fn: one training iteration (forward, backward, optimizer step) of `model`.
        *example_inputs: inputs of one call (their shapes are the planned ones).
        budget: memory budget ("8GiB", "60%" of the unplanned peak, bytes); None: no limit.
        planner: a registered planner name.
        device: the cost-model device profile the planner plans for.
        model: the root module (found on `step_fn.__self__` or in its closure if omitted);
            parameters and buffers the plan swaps between steps are found through it.
        optimizer: its optimizer (found likewise); its state is restored after tracing.
        plan: a saved plan (a Plan or a JSON path) to use instead of planning.
        trace: a saved trace (a Trace or a path) to use instead of tracing.
        seed: planner seed.
        measure: which steps' peak memory to measure and check against the budget (a
            dispatch-level meter on CPU, the CUDA allocator's counters on a GPU): "first" (the
            default: every step runs the same program), True (every step) or False. A step
            measured above its budget logs a warning and is listed in
            `stats()["over_budget_steps"]`. On the CPU the meter sums the live storages after
            every op, which can make a step of many small ops 2-3 times slower (so only the
            first pays it by default); on a GPU it reads the allocator's counters.
        time_repeats: on the CPU, time every op of the real trace as the least over this many
            more iterations (undone afterwards, like the traced one), so the planner and the
            simulator price ops at their measured durations; 0: roofline estimates.
        time_clock: the clock of those durations: "wall", or "cpu" (this thread's CPU time).
        **planner_params: the planner's hyper-parameters.
    Returns:
        The OptimizedStep.
    Raises:
        MemplanError: a plan that was made for another trace, an unknown planner, ...
    """
    model = model_of(step_fn, model)
    optimizer = optimizer if optimizer is not None else _find(step_fn, torch.optim.Optimizer, "optimizer")
    if optimizer is not None and not _is_fake(example_inputs, model):
        prime_optimizer_state(optimizer)
    trace = _load_trace(trace) if trace is not None else trace_step(step_fn, example_inputs, model, optimizer,
                                                                    time_repeats, time_clock)
    cost = Cost.for_trace(trace, device)
    if plan is None:
        from ..planners.base import plan as make_plan

        plan = make_plan(trace, budget, planner=planner, cost=cost, seed=seed, **planner_params)
    elif not isinstance(plan, Plan):
        plan = read_plan(plan, trace)
    else:
        check_plan(trace, plan)
    program = compile_program(trace, plan, cost)
    runtime = PlanRuntime(trace, program, model, device=_device_of(example_inputs, model), optimizer=optimizer,
                          measure=measure)
    if not _is_fake(example_inputs, model):
        runtime.settle()  # the first step starts as every later one does
    return OptimizedStep(step_fn, trace, plan, runtime, input_signature(example_inputs), model)


# Optimizers whose state, created by one step with zero gradients, learning rate 0 and no
# weight decay and then with its step counters set back to 0, is exactly what their first
# real step would create (checked by tests against plain training).
PRIMED_EXACTLY = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "RAdam", "Adamax")
_NEUTRAL = {"lr": 0.0, "weight_decay": 0.0}


def prime_optimizer_state(optimizer: torch.optim.Optimizer) -> bool:
    """Create an optimizer's lazily made state now, with the values its first step would give it.

    Returns:
        True when the state was created (False: it exists, or the optimizer is not one known
        to prime exactly; then the first planned step creates it and runs unplanned).
    """
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    if all(optimizer.state.get(p) for p in params):
        return False
    if type(optimizer).__name__ not in PRIMED_EXACTLY:
        log.warning("%s creates its state in its first step: that step runs unplanned", type(optimizer).__name__)
        return False
    grads = [(p, p.grad) for p in params]
    saved = [{k: g[k] for k in _NEUTRAL if k in g} for g in optimizer.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for group in optimizer.param_groups:
            for k, v in _NEUTRAL.items():
                if k in group:
                    group[k] = torch.tensor(v) if isinstance(group[k], torch.Tensor) else v
        optimizer.step()
    finally:
        for group, values in zip(optimizer.param_groups, saved):
            group.update(values)
        for p, g in grads:
            p.grad = g
    for state in optimizer.state.values():
        if isinstance(state.get("step"), torch.Tensor):
            state["step"].zero_()
        elif "step" in state:
            state["step"] = 0
    return True


def trace_step(step_fn: Callable, inputs: tuple, model, optimizer, time_repeats: int = 0,
               time_clock: str = "wall") -> Trace:
    """Trace one call of `step_fn`: with fake tensors if they are fake, else for real, undone
    (with `time_repeats` timed iterations after it on the CPU, undone too).

    A real trace runs the step once, unplanned; the model's parameters and gradients, the
    optimizer's state and the RNG states are restored afterwards, so the next step is the
    same as if tracing had not happened.
    """
    from ..tracing.tracer import trace as run_tracer

    warmup = _warmup_for(model)
    if _is_fake(inputs, model):
        return run_tracer(step_fn, *inputs, fake=True, model=model, optimizer=optimizer, warmup=warmup)
    if optimizer is None:
        log.warning("no optimizer found for the step: its state is not restored after tracing")
    with restored(model, optimizer):
        return run_tracer(step_fn, *inputs, fake=False, model=model, optimizer=optimizer, warmup=warmup,
                          time_repeats=time_repeats, time_clock=time_clock)


DDP_WARMUP = 2  # DDP rebuilds its gradient buckets in the second forward: trace the third step


def _warmup_for(model) -> int:
    """Untraced steps before the traced one: the steady state starts later under DDP."""
    from torch.nn.parallel import DistributedDataParallel

    from ..tracing.tracer import DEFAULT_WARMUP

    return DDP_WARMUP if isinstance(model, DistributedDataParallel) else DEFAULT_WARMUP


class restored:
    """Context manager: put model parameters, gradients, optimizer state and RNG back on exit."""

    def __init__(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None):
        self.model = model
        self.optimizer = optimizer

    def __enter__(self):
        m, o = self.model, self.optimizer
        self.params = {k: v.detach().clone() for k, v in m.state_dict().items()} if m is not None else None
        self.grads = [(p, None if p.grad is None else p.grad.clone()) for p in m.parameters()] if m is not None else []
        self.opt_state = copy.deepcopy(o.state_dict()) if o is not None else None
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            if self.params is not None:
                for k, v in self.model.state_dict().items():
                    v.copy_(self.params[k])
            for p, g in self.grads:
                p.grad = g
        if self.opt_state is not None:
            self.optimizer.load_state_dict(self.opt_state)
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


def input_signature(inputs: tuple) -> tuple:
    """(shape, dtype, device type) of every tensor in `inputs`: what a plan depends on."""
    return tuple((tuple(t.shape), t.dtype, t.device.type) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))


def model_of(step_fn: Callable, model: torch.nn.Module | None = None) -> torch.nn.Module | None:
    """`model`, or the one module `step_fn` trains (on its owner or in its closure), or None."""
    return model if model is not None else _find(step_fn, torch.nn.Module, "model")


def _find(step_fn: Callable, cls: type, attr: str):
    owner = getattr(step_fn, "__self__", None)
    if isinstance(getattr(owner, attr, None), cls):
        return getattr(owner, attr)
    inner = getattr(owner, "step_fn", None)  # a zoo Workload around a user's (step_fn, inputs)
    if callable(inner):
        return _find(inner, cls, attr)
    cells = [c.cell_contents for c in (getattr(step_fn, "__closure__", None) or ()) if _filled(c)]
    names = getattr(getattr(step_fn, "__code__", None), "co_names", ())
    glob = getattr(step_fn, "__globals__", {})
    found = [v for v in cells + [glob[n] for n in names if n in glob] if isinstance(v, cls)]
    return found[0] if len({id(v) for v in found}) == 1 else None


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _load_trace(trace) -> Trace:
    if isinstance(trace, Trace):
        return trace
    from ..tracing.formats import load_any

    return load_any(trace)


def _is_fake(inputs: tuple, model) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    tensors = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    tensors += list(model.parameters()) if model is not None else []
    return any(isinstance(t, FakeTensor) for t in tensors)


def _device_of(inputs: tuple, model) -> torch.device:
    for t in tree_leaves(inputs):
        if isinstance(t, torch.Tensor):
            return t.device
    if model is not None:
        for p in model.parameters():
            return p.device
    raise MemplanError("cannot tell the device: no tensor among the inputs and no model")
