"""Can a planned step be captured as one CUDA graph? The check, over the trace and what runs it.

A CUDA graph replays fixed kernels on fixed addresses with no host work (PyTorch's "CUDA
Graphs" notes, "Constraints"): no op may synchronize the host with the device, no shape may
depend on the data, the optimizer's state must live on the device, and every replay takes
inputs of the captured shapes. So a step is refused, with one line per cause, for:

- ops the trace holds that read a value on the host (`aten._local_scalar_dense`: `.item()`,
  `bool()`, `int()` or `float()` of a tensor; `aten.equal`, `aten.is_nonzero`) or whose output's
  shape depends on the data (`aten.nonzero`, `aten.masked_select`, `aten._unique2`, ...: the
  ops PyTorch's sync debug mode flags); a repeat_interleave with a tensor of repeats is one
  unless given its output size, which a trace does not record, so it is refused too;
- a GradScaler (its ops in the trace): its step reads on the host whether the gradients
  overflowed, to skip the optimizer step;
- an optimizer that keeps state on the host: torch's optimizers need `capturable=True`
  (Adam, AdamW, Adamax, ASGD, NAdam, RAdam, RMSprop, Rprop, Adadelta); SGD keeps none; any
  other is not known to be capturable;
- a plan that compresses a swapped storage (zero-value compression sizes its output by the
  data: memplan.exec.compress), or that swaps within the step a storage the step begins with (a
  parameter, optimizer state, an input): its refill lands in the graph's pool, while a replay's
  ops before the swap read it at its address from before the capture (a gap across the
  iteration boundary is fine: the storage lives in the pool throughout);
- inputs on the CPU of a step on the GPU (their copy to the device waits for the host);
- before torch 2.10, a plan whose recomputations set the CUDA generator's state back (a hooked
  region run, a replayed random op), which a capture allows from 2.10 on;
- at a step's call, inputs of another shape or dtype than the captured ones (`input_change`), or
  an optimizer whose number hyper-parameters (a float lr a scheduler changed) differ from the
  captured ones (`hyper_change`): a replay would use the captured values.

What a trace cannot show (a boolean mask index, a copy to the host) makes the capture itself
fail: memplan.exec.graphed says so in the same one-line form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.torch_version import TorchVersion

from ..model import Trace
from ..model.program import HOOKED, StepProgram

# Ops that hand a device value to the host (the host waits for the device).
HOST_READS = {
    "aten._local_scalar_dense": "copies a tensor's value to the host (.item(), bool(), int() or float() of a tensor)",
    "aten.equal": "compares two tensors on the host",
    "aten.is_nonzero": "reads a tensor's truth value on the host",
}
DATA_SHAPE = "its output's shape depends on the data (a graph replays fixed shapes)"
# Ops whose output's shape depends on the data (the host waits to learn it).
DATA_SHAPED = ("aten.nonzero", "aten.argwhere", "aten.masked_select", "aten._unique", "aten._unique2",
               "aten.unique_dim", "aten.unique_consecutive", "aten.unique_dim_consecutive", "aten.bincount")
# repeat_interleave with a tensor of repeats: data-dependent unless output_size is given (not in a trace).
REPEATS = ("aten.repeat_interleave.Tensor", "aten.repeat_interleave.self_Tensor")
REPEATS_CAUSE = ("with a tensor of repeats its output size depends on the data unless output_size is given "
                 "(a trace does not record it)")
# The GradScaler's ops: unscaling checks for overflow, which its step then reads on the host.
GRAD_SCALER = ("aten._amp_foreach_non_finite_check_and_unscale_", "aten._amp_update_scale_")
GRAD_SCALER_CAUSE = ("a GradScaler: its step reads on the host whether the gradients overflowed, to skip the "
                     "optimizer step")
COMPRESSED = "compresses its host copy, whose size depends on the data (zero-value compression)"
MOVED = ("swaps a {kind} within the step: its refill lands elsewhere, in the graph's pool, while a replay's "
         "ops before the swap read it where it was before the capture (keep it on the host between steps, or "
         "run eagerly)")
KIND_NAMES = {"param": "parameter", "grad": "gradient"}
RNG_IN_CAPTURE = (2, 10)  # torch.cuda.get/set_rng_state work inside a capture from this torch on
STATELESS_OPTIMIZERS = ("SGD",)  # torch optimizers whose step is device kernels only (no step count)


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """One reason the step cannot be captured."""

    what: str  # what is refused: an op (index, name, phase, module), the optimizer, an input, a decision
    cause: str  # why a graph cannot hold it
    op: int | None = None  # the op's index in the trace, where an op is refused

    def line(self) -> str:
        """The refusal as one readable line."""
        return f"{self.what}: {self.cause}"


@dataclass(frozen=True, kw_only=True)
class CaptureCheck:
    """What stops a step from being captured (nothing: it can be)."""

    refusals: tuple[Refusal, ...] = ()  # ops first, in trace order; then the rest

    @property
    def capturable(self) -> bool:
        """True when nothing was refused."""
        return not self.refusals

    @property
    def reason(self) -> str:
        """The first refusal as one line ("" when capturable), counting the others."""
        if not self.refusals:
            return ""
        more = len(self.refusals) - 1
        return self.refusals[0].line() + (f" (and {more} more)" if more else "")

    def to_json(self) -> dict:
        """JSON-ready: whether it is capturable, the one-line reason and every refusal's line."""
        return {"capturable": self.capturable, "reason": self.reason, "refusals": [r.line() for r in self.refusals]}


def check_step(trace: Trace, program: StepProgram | None = None, *, optimizer=None, signature: tuple = (),
               device: str = "cuda") -> CaptureCheck:
    """Every reason the planned step cannot be captured (see the module docstring).

    Args:
        trace: the traced iteration.
        program: its step program (None: no plan's actions are checked).
        optimizer: the step's optimizer (None: only its ops in the trace are checked).
        signature: (shape, dtype, device type) of each input tensor (memplan.workflows.step_trace.input_signature).
        device: the device type the step runs on.
    Returns:
        The check.
    """
    refusals = check_trace(trace) + check_optimizer(optimizer) + check_inputs(signature, device)
    if program is not None:
        refusals += check_program(program, trace)
    return CaptureCheck(refusals=tuple(refusals))


def check_trace(trace: Trace) -> list[Refusal]:
    """The ops of `trace` a graph cannot hold, in trace order."""
    out = []
    for op in trace.ops:
        cause = op_cause(op.name)
        if cause:
            where = f"{op.phase}, module {op.module}" if op.module else op.phase
            out.append(Refusal(what=f"op {op.index} {op.name} ({where})", cause=cause, op=op.index))
    return out


def op_cause(name: str) -> str:
    """Why an op named `name` (an aten overload, e.g. "aten.nonzero.default") cannot be captured ("" if it can)."""
    packet = name.rsplit(".", 1)[0]
    if packet in GRAD_SCALER:
        return GRAD_SCALER_CAUSE
    if packet in HOST_READS:
        return HOST_READS[packet]
    if packet in DATA_SHAPED:
        return DATA_SHAPE
    return REPEATS_CAUSE if name in REPEATS else ""


def check_optimizer(optimizer) -> list[Refusal]:
    """The optimizer, when its step keeps state on the host (see the module docstring)."""
    if optimizer is None:
        return []
    name = type(optimizer).__name__
    groups = getattr(optimizer, "param_groups", [])
    if "capturable" in getattr(optimizer, "defaults", {}):
        if all(group.get("capturable") for group in groups):
            return []
        cause = "keeps its step count on the host; build it with capturable=True"
    elif type(optimizer).__module__.startswith("torch.optim") and name in STATELESS_OPTIMIZERS:
        return []
    elif type(optimizer).__module__.startswith("torch.optim"):
        cause = "has no capturable mode"
    else:
        cause = ("is not known to be capturable (memplan captures torch optimizers built with capturable=True, "
                 "and SGD)")
    return [Refusal(what=f"the optimizer {name}", cause=cause)]


def check_inputs(signature: tuple, device: str) -> list[Refusal]:
    """Inputs on the CPU of a step on a GPU: their copy to the device waits for the host."""
    if device == "cpu":
        return []
    return [Refusal(what=f"input {i} ({_described(s)})",
                    cause="is on the CPU: its copy to the GPU waits for the host (move the batch to the GPU first)")
            for i, s in enumerate(signature) if s[2] == "cpu"]


def check_program(program: StepProgram, trace: Trace | None = None,
                  torch_version: str = torch.__version__) -> list[Refusal]:
    """Decisions of the plan a graph cannot run: compressed swaps, and (given the trace) swaps within the
    step of a storage that exists before it, and before torch 2.10 recomputations that set the generator."""
    out = []
    if trace is not None and TorchVersion(torch_version) < RNG_IN_CAPTURE and _sets_generator(program, trace):
        out.append(Refusal(what="the plan's recomputations", cause=f"set the CUDA generator's state back inside "
                                                                   f"the capture, which torch {torch_version} does "
                                                                   f"not allow (2.10 and later do)"))
    for k, d in enumerate(program.decisions):
        if d.action != "swap":
            continue
        if d.compress_ratio is not None:
            out.append(Refusal(what=f"decision {k} (storage {d.storage})", cause=COMPRESSED))
        elif trace is not None and not d.wraps and _before_the_step(trace.storages[d.storage]):
            kind = trace.storages[d.storage].kind
            out.append(Refusal(what=f"decision {k} (storage {d.storage})", cause=MOVED.format(
                kind=KIND_NAMES.get(kind, kind.replace("_", " ")))))
    return out


def _sets_generator(program: StepProgram, trace: Trace) -> bool:
    """Whether running `program` sets the generator's state: a region run always does (memplan.exec.hooked),
    an op replay before a random op it records (memplan.exec.op_replay)."""
    if program.level == HOOKED:
        return bool(program.regions)
    return any(_random(trace.ops[i].name) for i in program.captured_ops)


def _random(name: str) -> bool:
    """Whether the aten overload named `name` ("aten.native_dropout.default") draws random numbers."""
    namespace, packet, overload = (name.split(".") + ["default"])[:3]
    op = getattr(getattr(getattr(torch.ops, namespace, None), packet, None), overload, None)
    return op is not None and torch.Tag.nondeterministic_seeded in op.tags


def _before_the_step(storage) -> bool:
    """Whether a storage exists before the step begins (allocated outside a capture of it)."""
    return storage.persistent or storage.kind == "input"


def hyper_parameters(optimizer) -> dict:
    """The optimizer's hyper-parameters a graph holds as captured: each group's numbers and tuples of numbers
    (a float lr, betas), by (group, name). Tensors are read by the kernels at every replay: not among them."""
    if optimizer is None:
        return {}
    return {(g, name): value for g, group in enumerate(optimizer.param_groups) for name, value in group.items()
            if name != "params" and _number(value)}


def hyper_change(captured: dict, optimizer) -> Refusal | None:
    """The first hyper-parameter of `optimizer` that differs from the `captured` ones (None: all as captured)."""
    now = hyper_parameters(optimizer)
    for (g, name), was in captured.items():
        if now.get((g, name)) != was:
            return Refusal(what=f"the optimizer's {name} of group {g}",
                           cause=f"{now.get((g, name))} where the graph captured {was} (a graph replays the values "
                                 f"it captured: give the optimizer tensor hyper-parameters, e.g. "
                                 f"lr=torch.tensor(0.01, device='cuda'))")
    return None


def _number(value) -> bool:
    if isinstance(value, (tuple, list)):
        return bool(value) and all(_number(v) for v in value)
    return isinstance(value, (bool, int, float))


def input_change(captured: tuple, signature: tuple) -> Refusal | None:
    """The first input whose shape or dtype differs from the captured ones (None: all as captured)."""
    if len(captured) != len(signature):
        return Refusal(what="the inputs", cause=f"{len(signature)} tensors where the graph was captured for "
                                                f"{len(captured)} (a graph replays fixed inputs)")
    for i, (was, now) in enumerate(zip(captured, signature)):
        if was != now:
            return Refusal(what=f"input {i}", cause=f"{_described(now)} where the graph was captured for "
                                                    f"{_described(was)} (a graph replays fixed shapes)")
    return None


def _described(entry: tuple) -> str:
    shape, dtype, device = entry
    return f"shape {tuple(shape)} {str(dtype).removeprefix('torch.')} on {device}"

