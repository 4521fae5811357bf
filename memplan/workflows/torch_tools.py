"""PyTorch's own memory tools, run the same way as a plan so `memplan run --baseline` compares them.

- `torch-checkpoint`: non-reentrant `torch.utils.checkpoint.checkpoint` around every
  top-level block (see `top_level_blocks`); as PyTorch does it, batch-norm running
  statistics inside a block are updated again when the block is recomputed.
- `save-on-cpu`: `torch.autograd.graph.save_on_cpu(pin_memory=True on a GPU)` around the step.
- `compile-budget`: the model's forward through `torch.compile`, with
  `torch._functorch.config.activation_memory_budget` = budget / unplanned peak, so the
  compiler's min-cut partitioner chooses what to recompute.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..errors import MemplanError

BASELINES = ("torch-checkpoint", "save-on-cpu", "compile-budget")


def check_baseline(name: str) -> None:
    """Raise MemplanError for a name that is not one of BASELINES."""
    if name not in BASELINES:
        raise MemplanError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")


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


@contextlib.contextmanager
def baseline_installed(name: str, model: nn.Module, budget_fraction: float, device: torch.device):
    """Apply baseline `name` to `model` for the block; everything is undone on exit.

    Args:
        name: one of BASELINES.
        model: the model whose training steps run inside the block.
        budget_fraction: budget / unplanned peak (used by compile-budget).
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
    else:
        with _compiled(model, budget_fraction):
            yield


def _checkpointed(forward: Callable) -> Callable:
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


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
        import torch._dynamo  # noqa: F401  (its exc module names compile failures)
        import torch._functorch.config as functorch_config
    except ImportError as exc:
        raise MemplanError(f"--baseline compile-budget needs torch._functorch: {exc}") from None
    if not hasattr(functorch_config, "activation_memory_budget"):
        raise MemplanError("--baseline compile-budget: this PyTorch has no activation_memory_budget")
    fraction = min(max(float(budget_fraction), 0.0), 1.0)
    compiled = torch.compile(model.forward)
    with _patched([("", model)], lambda _: compiled), functorch_config.patch(activation_memory_budget=fraction):
        try:
            yield
        except torch._dynamo.exc.BackendCompilerFailed as exc:
            raise MemplanError(f"--baseline compile-budget: torch.compile failed here ({type(exc).__name__}): "
                               f"{str(exc).splitlines()[0]}") from None
