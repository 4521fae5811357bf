"""Models from elsewhere: ``tv:<name>`` (torchvision, where it imports) and ``module:function``."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import MemplanError
from .tasks import classify_loss, image_inputs
from .workload import SGD_LR, ModelSpec, Workload

TV_PREFIX = "tv:"
IMAGENET_SIZE = 224
IMAGENET_CLASSES = 1000
# torchvision models whose default input is not 224x224.
TV_INPUT_SIZES = {"inception_v3": 299}
# torchvision models with an auxiliary head that training mode would return next to the logits.
TV_AUX_MODELS = ("inception_v3", "googlenet")
# Keyword arguments that `get_workload` passes to a user function when its signature accepts them.
OPTIONAL_USER_ARGS = ("input_size", "device", "seed")


def _torchvision():
    try:
        import torchvision  # optional: only tv:<name> models need it
    except Exception as exc:  # noqa: BLE001 - a broken install raises RuntimeError/OSError, not ImportError
        raise MemplanError(f"torchvision is not importable here ({type(exc).__name__}: {exc}); "
                           f"use a zoo model, hf:<name> or module:function") from exc
    return torchvision


def tv_spec(name: str, overrides: Mapping[str, Any]) -> ModelSpec:
    """The ModelSpec of ``tv:<name>``: ``torchvision.models.get_model(name, weights=None, **config)``.

    Raises:
        MemplanError: torchvision does not import, or does not know `name`.
    """
    torchvision = _torchvision()
    arch = name[len(TV_PREFIX):]
    if arch not in torchvision.models.list_models():
        raise MemplanError(f"torchvision has no model {arch!r}; see torchvision.models.list_models()")
    extra = {"aux_logits": False, "init_weights": True} if arch in TV_AUX_MODELS else {}
    fields = {k: v for k, v in overrides.items() if k not in ("lr", "optimizer")}

    def build(config: dict, input_size) -> nn.Module:
        return torchvision.models.get_model(arch, weights=None, **extra, **config)

    return ModelSpec(name=name, summary=f"torchvision {arch}", build=build, make_inputs=image_inputs,
                     loss=_tv_loss, defaults={"num_classes": IMAGENET_CLASSES, **fields},
                     input_size=TV_INPUT_SIZES.get(arch, IMAGENET_SIZE), optimizer="sgd", lr=SGD_LR)


def _tv_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return classify_loss(lambda x: _logits(model(x)), images, labels)


def _logits(out):
    # Some torchvision models return a named tuple (logits, aux) in training mode.
    return out if isinstance(out, torch.Tensor) else out[0]


def is_user_reference(name: str) -> bool:
    """True for ``package.module:function`` names (any prefix other than hf/tv)."""
    module, sep, function = name.partition(":")
    return bool(sep and module and function) and not name.startswith(("hf:", TV_PREFIX))


def user_workload(name: str, *, batch: int, input_size, device, seed: int, config: dict) -> Workload:
    """Import ``module:function`` and call ``function(batch=batch, **config)``.

    The function may also take ``input_size``, ``device`` and ``seed`` (passed when its signature
    names them or has ``**kwargs``). It returns a Workload (used as is) or a ``(step_fn, inputs)``
    pair, wrapped into a Workload without model or optimizer whose ``make_inputs(b)`` calls the
    function again with ``batch=b``.

    Raises:
        MemplanError: the module does not import, has no such function, or returns something else.
    """
    function = resolve_function(name)
    optional = {"input_size": input_size, "device": device, "seed": seed}

    def call(b: int):
        return function(batch=b, **_accepted(function, optional), **config)

    result = call(batch)
    if isinstance(result, Workload):
        return result
    if not (isinstance(result, tuple) and len(result) == 2 and callable(result[0])):
        raise MemplanError(f"{name} returned {type(result).__name__}; expected a Workload or (step_fn, inputs)")
    step_fn, inputs = result
    return Workload(name=name, model=None, optimizer=None, inputs=_as_tuple(inputs), batch=batch,
                    input_size=input_size,
                    device=torch.device(device), seed=seed, config=dict(config), step_fn=step_fn,
                    input_fn=lambda b, s: _as_tuple(call(b)[1]))


def _as_tuple(inputs) -> tuple:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def resolve_function(name: str):
    """The function ``module:function`` names (the module imported).

    Raises:
        MemplanError: the module does not import, or has no such function.
    """
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MemplanError(f"model {name}: cannot import module {module_name!r} ({exc})") from exc
    function = getattr(module, attr, None)
    if not callable(function):
        raise MemplanError(f"model {name}: module {module_name!r} has no function {attr!r}")
    return function


def _accepted(function, optional: dict) -> dict:
    params = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return optional
    return {k: v for k, v in optional.items() if k in params}
