"""The Workload: one model, its optimizer, example inputs and the exact training step.

Everything is built deterministically from a seed: parameters on the CPU generator and then
moved to the device (so CPU and GPU runs start from the same weights), inputs from a second
seed. The caller's RNG state is saved and restored around building. Building works inside an
active ``FakeTensorMode``: then every parameter, buffer and input is a fake tensor and nothing
is allocated.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import DataDependentOutputException, unset_fake_temporarily

log = logging.getLogger(__name__)

# Inputs draw from a different seed than parameters so changing the batch never changes weights.
INPUT_SEED_OFFSET = 1_000_003
# Optimizer hyper-parameters: SGD+momentum as the CNN papers train, Adam for sequence models.
SGD_LR = 0.01
SGD_MOMENTUM = 0.9
SGD_WEIGHT_DECAY = 5e-4
ADAM_LR = 1e-4
OPTIMIZERS = ("sgd", "adam", "sgd-plain", "adam-capturable")

LossFn = Callable[..., torch.Tensor]
InputFn = Callable[[int, torch.device], tuple]


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class Workload:
    """One training workload: model, optimizer, example inputs and its training step.

    Attributes:
        name: the zoo name it was built from (e.g. ``resnet50``, ``hf:gpt2``).
        model: the ``nn.Module`` in training mode on `device` (None for a user ``(step_fn, inputs)``).
        optimizer: the optimizer over ``model.parameters()`` (None for a user step function).
        inputs: example inputs for one step, targets included, on `device`.
        batch: the batch size of `inputs`.
        input_size: image side in pixels for image models, else None.
        device: where model and inputs live.
        seed: the seed everything was drawn from.
        config: the full resolved model configuration.
        loss_fn: ``loss_fn(model, *inputs) -> scalar loss`` (forward plus loss).
        input_fn: ``input_fn(batch, seed) -> inputs`` on `device`.
        step_fn: a user step function replacing the built-in step, or None.
    """

    name: str                              # zoo name
    model: nn.Module | None                # the network, training mode
    optimizer: torch.optim.Optimizer | None  # over model.parameters()
    inputs: tuple                          # example inputs incl. targets
    batch: int                             # batch size of `inputs`
    input_size: int | None                 # image side, None for non-image models
    device: torch.device                   # where everything lives
    seed: int                              # seed for parameters and inputs
    config: Mapping[str, Any]              # resolved configuration
    loss_fn: LossFn | None = None          # (model, *inputs) -> loss
    input_fn: Callable[[int, int], tuple] | None = None  # (batch, seed) -> inputs
    step_fn: Callable[..., Any] | None = None  # user step replacing the built-in one

    def forward_loss(self, *inputs) -> torch.Tensor:
        """Forward pass and loss on `inputs` (default: the example inputs); no backward."""
        return self.loss_fn(self.model, *(inputs or self.inputs))

    def step(self, *inputs) -> torch.Tensor:
        """One training iteration: zero_grad(set_to_none), forward, loss, backward, optimizer step.

        Args:
            inputs: the step's inputs (default: the example inputs).

        Returns:
            The loss, detached (never ``.item()``: works on fake tensors).
        """
        inputs = inputs or self.inputs
        if self.step_fn is not None:
            loss = self.step_fn(*inputs)
            return loss.detach() if isinstance(loss, torch.Tensor) else loss
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model, *inputs)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def make_inputs(self, batch: int, seed: int | None = None) -> tuple:
        """Fresh inputs of another batch size, deterministic in (batch, seed); default seed: the workload's."""
        return self.input_fn(batch, self.seed if seed is None else seed)

    @property
    def num_parameters(self) -> int:
        """Number of trainable parameter elements (0 without a model)."""
        if self.model is None:
            return 0
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """How to build one named model.

    Attributes:
        name: the zoo name.
        summary: one line for listings.
        build: ``build(config, input_size) -> nn.Module`` (on the CPU; the caller moves it).
        make_inputs: ``make_inputs(batch, config, input_size) -> tuple`` (CPU tensors).
        loss: ``loss(model, *inputs) -> scalar``.
        defaults: every config key the model accepts, with its default.
        input_size: default image side, or None where the model takes no image.
        optimizer: ``sgd`` (with momentum), ``adam``, ``sgd-plain`` (no momentum, no decay) or
            ``adam-capturable`` (Adam's state on the device: a CUDA graph can capture its step).
        lr: default learning rate.
    """

    name: str                 # zoo name
    summary: str              # one line for listings
    build: Callable[[dict, int | None], nn.Module]  # (config, input_size) -> module
    make_inputs: Callable[[int, dict, int | None], tuple]  # (batch, config, input_size) -> inputs
    loss: LossFn              # (model, *inputs) -> loss
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # accepted config
    input_size: int | None = None  # default image side
    optimizer: str = "sgd"    # optimizer family
    lr: float = SGD_LR        # default learning rate


def make_optimizer(kind: str, params, lr: float) -> torch.optim.Optimizer:
    """The optimizer of a workload.

    Args:
        kind: ``sgd`` (momentum 0.9, weight decay 5e-4), ``adam``, ``sgd-plain``, or
            ``adam-capturable`` (``capturable=True`` where the parameters are on CUDA, else ``adam``:
            torch's capturable Adam runs on accelerators only).
        params: the parameters to optimize.
        lr: learning rate.

    Returns:
        A ``torch.optim`` optimizer.
    """
    if kind == "adam-capturable":
        params = list(params)
        return torch.optim.Adam(params, lr=lr, capturable=all(p.device.type == "cuda" for p in params))
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM, weight_decay=SGD_WEIGHT_DECAY)
    if kind == "sgd-plain":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.Adam(params, lr=lr)


def seeded(fn: Callable[[], Any], seed: int) -> Any:
    """Run `fn` with the CPU generator seeded to `seed`, restoring the caller's RNG state after."""
    # devices=[]: only the CPU generator is forked; building never touches CUDA RNGs.
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        return fn()


def fake_mode_active() -> bool:
    """True inside an active ``FakeTensorMode`` (tensors created now are fake)."""
    return detect_fake_mode() is not None


def _build_real(make: Callable[[], Any], seed: int) -> nn.Module:
    with unset_fake_temporarily():
        return seeded(make, seed)


def fakeify(module: nn.Module, device: torch.device) -> nn.Module:
    """Replace every parameter and buffer of `module` by a fake copy on `device` (active fake mode)."""
    mode = detect_fake_mode()

    def fake(t: torch.Tensor) -> torch.Tensor:
        with unset_fake_temporarily():
            t = t.detach()
        t = mode.from_tensor(t)
        return t if t.device == device else t.to(device)

    for sub in module.modules():
        for name, param in sub._parameters.items():
            if param is not None:
                sub._parameters[name] = nn.Parameter(fake(param), requires_grad=param.requires_grad)
        for name, buf in sub._buffers.items():
            if buf is not None:
                sub._buffers[name] = fake(buf)
    return module


def on_device(make: Callable[[], Any], device: torch.device, seed: int) -> Any:
    """Run `make` seeded and put what it returns (a module or a tuple of tensors) on `device`.

    Real tensors are made on the CPU generator and then moved, so the values do not depend on the
    device. Fake tensors cannot be moved (``Module.to`` swaps tensors the fake mode holds weak
    references to), and their values do not matter, so they are made on `device` directly.
    """
    if fake_mode_active():
        try:
            with torch.device(device):
                return seeded(make, seed)
        except DataDependentOutputException:
            # The constructor itself reads tensor values (e.g. transformers' ConvNeXt calls
            # linspace(...).tolist()): build it for real on the CPU, then swap in fake copies.
            log.info("constructor reads tensor values; building for real, then faking parameters")
            return fakeify(_build_real(make, seed), device)
    made = seeded(make, seed)
    if device.type == "cpu":
        return made
    if isinstance(made, nn.Module):
        return made.to(device)
    return tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in made)


def build_workload(spec: ModelSpec, *, batch: int, input_size: int | None, device, seed: int,
                   config: dict, name: str | None = None) -> Workload:
    """Build `spec` into a Workload (see `memplan.zoo.get_workload` for the arguments).

    Args:
        spec: the model spec.
        batch: batch size of the example inputs.
        input_size: image side (None: the spec's default).
        device: target device.
        seed: seed for parameters and inputs.
        config: resolved config (defaults merged, plus ``lr`` and ``optimizer``).
        name: the name to record (default: the spec's).

    Returns:
        The Workload, model in training mode.
    """
    device = torch.device(device)
    model_config = {k: v for k, v in config.items() if k not in ("lr", "optimizer")}
    model = on_device(lambda: spec.build(model_config, input_size), device, seed).train()

    def input_fn(n: int, input_seed: int) -> tuple:
        return on_device(lambda: spec.make_inputs(n, model_config, input_size), device,
                         input_seed + INPUT_SEED_OFFSET)

    optimizer = make_optimizer(config["optimizer"], model.parameters(), config["lr"])
    return Workload(name=name or spec.name, model=model, optimizer=optimizer, inputs=input_fn(batch, seed),
                    batch=batch, input_size=input_size, device=device, seed=seed, config=dict(config),
                    loss_fn=spec.loss, input_fn=input_fn)
