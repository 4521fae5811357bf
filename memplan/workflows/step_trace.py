"""The traced side of `memplan.optimize`: one step recorded, undone, with its model found.

A real trace runs the step once, unplanned, and puts model, optimizer and RNG back
(`restored`); a fake trace runs it on fake copies (memplan.tracing.fake.fake_copies), so
nothing of the step is allocated. The optimizer's lazily made state is created first
(`prime_optimizer_state`) so that the traced step and the first planned one are steady-state
steps.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
import logging
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_leaves

from ..errors import MemplanError
from ..model import Trace
from ..tracing.fake import fake_copies
from ..tracing.formats import load_any
from ..tracing.tracer import DEFAULT_WARMUP
from ..tracing.tracer import trace as run_tracer

log = logging.getLogger(__name__)


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
               time_clock: str = "wall", fake: bool = False) -> Trace:
    """Trace one call of `step_fn`: with fake tensors if they are fake, on fake copies of the
    real ones with `fake`, else for real, undone (with `time_repeats` timed iterations after
    it on the CPU, undone too).

    A real trace runs the step once, unplanned; the model's parameters and gradients, the
    optimizer's state and the RNG states are restored afterwards, so the next step is the
    same as if tracing had not happened.
    """
    warmup = _warmup_for(model)
    if is_fake(inputs, model):
        return run_tracer(step_fn, *inputs, fake=True, model=model, optimizer=optimizer, warmup=warmup)
    if fake:  # on a GPU each op is also run alone, for its time and the memory it takes inside itself
        on_gpu = device_of(inputs, model).type == "cuda"
        with restored_rng(), fake_copies(model, optimizer, inputs) as (mode, fake_inputs), mode:
            return run_tracer(step_fn, *fake_inputs, fake=True, model=model, optimizer=optimizer, warmup=warmup,
                              time_ops=on_gpu)
    if optimizer is None:
        log.warning("no optimizer found for the step: its state is not restored after tracing")
    with restored(model, optimizer):
        return run_tracer(step_fn, *inputs, fake=False, model=model, optimizer=optimizer, warmup=warmup,
                          time_repeats=time_repeats, time_clock=time_clock)


DDP_WARMUP = 2  # DDP rebuilds its gradient buckets in the second forward: trace the third step


def _warmup_for(model) -> int:
    """Untraced steps before the traced one: the steady state starts later under DDP."""
    return DDP_WARMUP if isinstance(model, DistributedDataParallel) else DEFAULT_WARMUP


class restored_rng:
    """Context manager: put the CPU and CUDA random number generators' states back on exit."""

    def __enter__(self):
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return self

    def __exit__(self, *exc):
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


class restored(restored_rng):
    """Context manager: put model parameters, gradients, optimizer state and RNG back on exit."""

    def __init__(self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None):
        self.model = model
        self.optimizer = optimizer

    def __enter__(self):
        m, o = self.model, self.optimizer
        self.params = {k: v.detach().clone() for k, v in m.state_dict().items()} if m is not None else None
        self.grads = [(p, None if p.grad is None else p.grad.clone()) for p in m.parameters()] if m is not None else []
        self.opt_state = copy.deepcopy(o.state_dict()) if o is not None else None
        return super().__enter__()

    def __exit__(self, *exc):
        with torch.no_grad():
            if self.params is not None:
                for k, v in self.model.state_dict().items():
                    v.copy_(self.params[k])
            for p, g in self.grads:
                p.grad = g
        if self.opt_state is not None:
            self.optimizer.load_state_dict(self.opt_state)
        super().__exit__(*exc)


def input_signature(inputs: tuple) -> tuple:
    """(shape, dtype, device type) of every tensor in `inputs`: what a plan depends on."""
    return tuple((tuple(t.shape), t.dtype, t.device.type) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))


def model_of(step_fn: Callable, model: torch.nn.Module | None = None) -> torch.nn.Module | None:
    """`model`, or the one module `step_fn` trains (on its owner or in its closure), or None."""
    return model if model is not None else find_in_step(step_fn, torch.nn.Module, "model")


def find_in_step(step_fn: Callable, cls: type, attr: str):
    owner = getattr(step_fn, "__self__", None)
    if isinstance(getattr(owner, attr, None), cls):
        return getattr(owner, attr)
    inner = getattr(owner, "step_fn", None)  # a zoo Workload around a user's (step_fn, inputs)
    if callable(inner):
        return find_in_step(inner, cls, attr)
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


def load_trace(trace) -> Trace:
    """A Trace, or one read from a file in any format memplan imports."""
    return trace if isinstance(trace, Trace) else load_any(trace)


def is_fake(inputs: tuple, model) -> bool:
    """True when the inputs or the model's parameters are fake tensors."""
    tensors = [t for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    tensors += list(model.parameters()) if model is not None else []
    return any(isinstance(t, FakeTensor) for t in tensors)


def device_of(inputs: tuple, model) -> torch.device:
    """Where the step runs: the first input tensor's device, else the model's."""
    for t in tree_leaves(inputs):
        if isinstance(t, torch.Tensor):
            return t.device
    if model is not None:
        for p in model.parameters():
            return p.device
    raise MemplanError("cannot tell the device: no tensor among the inputs and no model")


@dataclass(frozen=True)
class TrainingStep:
    """The training step a plan runs: the function, what it trains, where, and the inputs' signature
    (the example inputs themselves are not held: a planned step would keep them alive)."""

    step_fn: Callable  # one iteration: forward, backward, optimizer step
    model: torch.nn.Module | None  # the root module (given, or found on the step function)
    optimizer: torch.optim.Optimizer | None  # its optimizer (given, or found likewise)
    device: torch.device  # where the step runs: where its inputs and model are
    signature: tuple  # `input_signature` of the example inputs: other calls run unplanned

    @classmethod
    def of(cls, step_fn: Callable, inputs: tuple, model=None, optimizer=None) -> TrainingStep:
        """The step of `step_fn` on example `inputs`, its model and optimizer found on it when not given."""
        model = model_of(step_fn, model)
        optimizer = optimizer if optimizer is not None else find_in_step(step_fn, torch.optim.Optimizer, "optimizer")
        return cls(step_fn, model, optimizer, device_of(inputs, model), input_signature(inputs))
