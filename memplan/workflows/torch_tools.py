"""PyTorch's own memory tools, run the same way as a plan so `memplan run --baseline` compares them.

- `torch-checkpoint`: non-reentrant `torch.utils.checkpoint.checkpoint` around every
  top-level block (see `top_level_blocks`); as PyTorch does it, batch-norm running
  statistics inside a block are updated again when the block is recomputed.
- `save-on-cpu`: `torch.autograd.graph.save_on_cpu(pin_memory=True on a GPU)` around the step.
- `sac-compute`: selective activation checkpointing
  (`torch.utils.checkpoint.create_selective_checkpoint_contexts`) around the same blocks,
  with a policy that saves the outputs of matmuls, convolutions and attention (the
  expensive ops) and recomputes everything else (normalisation, activations, adds).
- `compile-budget`: the model's forward through `torch.compile`, with
  `torch._functorch.config.activation_memory_budget` = budget / unplanned peak, so the
  compiler's min-cut partitioner chooses what to recompute; `compile-budget:F` sets that
  fraction to F (in (0, 1]) whatever the budget.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ..errors import MemplanError

BASELINES = ("torch-checkpoint", "sac-compute", "save-on-cpu", "compile-budget")
COMPILE_BUDGET = "compile-budget"  # also "compile-budget:F" with the activation memory budget F
# What `sac-compute` saves: the outputs of the ops that cost compute, not memory bandwidth.
_aten = torch.ops.aten
SAC_SAVED_OPS = frozenset({
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default,
    _aten.convolution.default, _aten._convolution.default, _aten.cudnn_convolution.default,
    _aten._scaled_dot_product_flash_attention.default, _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
})


def check_baseline(name: str) -> None:
    """Raise MemplanError for a name that is not one of BASELINES (or compile-budget:F, F in (0, 1])."""
    if name.startswith(COMPILE_BUDGET + ":"):
        compile_fraction(name, 1.0)
    elif name not in BASELINES:
        raise MemplanError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}, {COMPILE_BUDGET}:F "
                           f"(F in (0, 1], e.g. {COMPILE_BUDGET}:0.5)")


def compile_fraction(name: str, budget_fraction: float) -> float:
    """The activation memory budget of compile-budget baseline `name`: its own F, else `budget_fraction`."""
    _, _, given = name.partition(":")
    if not given:
        return min(max(float(budget_fraction), 0.0), 1.0)
    try:
        fraction = float(given)
    except ValueError:
        fraction = float("nan")
    if not 0.0 < fraction <= 1.0:
        raise MemplanError(f"baseline {name!r}: the activation memory budget after ':' must be a number in (0, 1], "
                           f"got {given!r}")
    return fraction


def top_level_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks `torch-checkpoint` wraps: the model's children, with containers opened.

    A Sequential or ModuleList child of blocks (items with children) stands for its items,
    one of plain layers is one block; a child holding a ModuleList
    (a transformer's layer stack) stands for that list's items; any other child is itself
    a block. Only modules with children and a forward of their own are returned.
    """
    blocks = []
    for name, child in model.named_children():
        if isinstance(child, (nn.Sequential, nn.ModuleList)) and all(any(True for _ in m.children()) for m in child):
            blocks += [(f"{name}.{n}", m) for n, m in child.named_children()]
            continue
        stacks = [(n, m) for n, m in child.named_modules() if isinstance(m, nn.ModuleList) and len(m) > 1]
        if stacks:
            path, stack = stacks[0]
            blocks += [(f"{name}.{path}.{n}", m) for n, m in stack.named_children()]
        else:
            blocks.append((name, child))
    # Lone layers are not blocks: checkpointing an in-place ReLU by itself breaks autograd.
    return [(n, m) for n, m in blocks if type(m).forward is not nn.Module.forward and any(True for _ in m.children())]


def is_compiled(name: str | None) -> bool:
    """True for the baselines that run torch.compile'd code (`compile-budget`, `compile-budget:F`)."""
    return bool(name) and name.split(":")[0] == COMPILE_BUDGET


@contextlib.contextmanager
def baseline_installed(name: str, model: nn.Module, budget_fraction: float, device: torch.device):
    """Apply baseline `name` to `model` for the block; everything is undone on exit.

    Args:
        name: one of BASELINES, or compile-budget:F.
        model: the model whose training steps run inside the block.
        budget_fraction: budget / unplanned peak (used by compile-budget without its own F).
        device: where the model lives (pins host memory on a GPU).
    Raises:
        MemplanError: unknown name, or torch.compile unavailable here.
    """
    check_baseline(name)
    if name == "save-on-cpu":
        with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"):
            yield
    elif name == "torch-checkpoint":
        with _patched(top_level_blocks(model), _checkpointed):
            yield
    elif name == "sac-compute":
        with _patched(top_level_blocks(model), functools.partial(_checkpointed, context_fn=_save_compute)):
            yield
    else:
        with _compiled(model, compile_fraction(name, budget_fraction)):
            yield


def _checkpointed(forward: Callable, context_fn: Callable | None = None) -> Callable:
    extra = {} if context_fn is None else {"context_fn": context_fn}

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    return run


def _save_compute_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAC_SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _save_compute():
    """`sac-compute`'s context pair: save what SAC_SAVED_OPS make, recompute the rest."""
    return create_selective_checkpoint_contexts(_save_compute_policy)


@contextlib.contextmanager
def _patched(modules: list[tuple[str, nn.Module]], wrap: Callable):
    patched = []
    try:
        for _, module in modules:
            patched.append((module, module.__dict__.get("forward")))
            module.forward = wrap(module.forward)
        yield
    finally:
        for module, previous in patched:
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous


@contextlib.contextmanager
def _compiled(model: nn.Module, budget_fraction: float):
    try:
        # torch._dynamo takes a second to import: only the compile baseline pays for it
        import torch._dynamo  # noqa: F401  (its exc module names compile failures)
        import torch._functorch.config as functorch_config
    except ImportError as exc:
        raise MemplanError(f"--baseline compile-budget needs torch._functorch: {exc}") from None
    if not hasattr(functorch_config, "activation_memory_budget"):
        raise MemplanError("--baseline compile-budget: this PyTorch has no activation_memory_budget")
    fraction = float(budget_fraction)
    compiled = torch.compile(model.forward)
    with _patched([("", model)], lambda _: compiled), functorch_config.patch(activation_memory_budget=fraction):
        try:
            yield
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            raise MemplanError(f"--baseline compile-budget: torch.compile failed here ({type(exc).__name__}): "
                               f"{str(exc).splitlines()[0]}") from None
