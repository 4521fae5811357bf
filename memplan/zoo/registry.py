"""Name resolution: zoo names, ``hf:<name>``, ``tv:<name>``, ``module:function``."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..errors import MemplanError, about_model, model_code, unknown_name
from . import external, hf
from .builtins import SPECS
from .config import merge_config
from .workload import OPTIMIZERS, ModelSpec, Workload, build_workload

log = logging.getLogger(__name__)


def known_models(*, include_hf: bool = True) -> list[str]:
    """Every model name the zoo builds (``tv:`` and ``module:function`` names come on top).

    Args:
        include_hf: also list the ``hf:`` presets.

    Returns:
        Sorted names.
    """
    return sorted(SPECS) + (sorted(hf.known()) if include_hf else [])


def get_spec(name: str, config: Mapping | None = None) -> ModelSpec:
    """The ModelSpec for a zoo, ``hf:`` or ``tv:`` name (not for ``module:function``).

    Raises:
        UnknownNameError: an unknown name (the message lists the known ones).
    """
    config = config or {}
    if name.startswith(hf.PREFIX):
        return hf.spec(name, config)
    if name.startswith(external.TV_PREFIX):
        return external.tv_spec(name, config)
    spec = SPECS.get(name.lower())
    if spec is None:
        raise unknown_name("model", name, known_models())
    return spec


def check_model_name(name: str) -> None:
    """Raise the error `get_workload` would give for `name` itself, without building anything.

    Raises:
        UnknownNameError: an unknown zoo, ``hf:`` or ``tv:`` name; MemplanError: a
            ``module:function`` that does not import.
    """
    if external.is_user_reference(name):
        external.resolve_function(name)
    else:
        get_spec(name)


def get_workload(name: str, batch: int, input_size: int | None = None, device="cpu", seed: int = 0,
                 **config) -> Workload:
    """Build a named training workload: model, optimizer, example inputs, training step.

    Works inside an active ``torch._subclasses.fake_tensor.FakeTensorMode`` (then every tensor is
    fake and nothing is allocated). Deterministic in `seed`; the caller's RNG state is untouched.

    Args:
        name: a zoo name (see `known_models`), ``hf:<preset>``, ``tv:<torchvision name>`` or
            ``package.module:function``.
        batch: batch size of the example inputs (for ``kmeans``: number of points).
        input_size: image side in pixels (default: the model's; only for image models).
        device: where model and inputs live.
        seed: seed for parameters and inputs.
        **config: model configuration overrides (``num_classes``, ``seq_len``, transformers config
            fields, ...) plus ``lr`` and ``optimizer`` (sgd | adam | sgd-plain | adam-capturable).

    Returns:
        The Workload, model in training mode.

    Raises:
        MemplanError: unknown name, unknown config key, bad batch or input size.
        ModelError: the model's own code refused the configuration (one line naming the model
            and the config given).
    """
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise MemplanError(f"model {name}: batch must be a positive integer, got {batch!r}")
    # Every config value goes through the model's own validation: whatever its code raises is one line.
    with about_model(name, config), model_code("cannot be built"):
        if external.is_user_reference(name):
            return external.user_workload(name, batch=batch, input_size=input_size, device=device, seed=seed,
                                          config=config)
        return _build(name, batch, input_size, device, seed, config)


def _build(name: str, batch: int, input_size: int | None, device, seed: int, config: dict) -> Workload:
    spec = get_spec(name, config)
    merged = merge_config(name, {**spec.defaults, "lr": spec.lr, "optimizer": spec.optimizer}, config)
    if merged["optimizer"] not in OPTIMIZERS:
        raise MemplanError(f"model {name}: optimizer must be one of {', '.join(OPTIMIZERS)}")
    size = _input_size(spec, input_size)
    log.info("building %s (batch %d, input %s) on %s", name, batch, size, device)
    return build_workload(spec, batch=batch, input_size=size, device=device, seed=seed, config=merged,
                          name=name)


def _input_size(spec: ModelSpec, input_size: int | None) -> int | None:
    if input_size is None:
        return spec.input_size
    if spec.input_size is None:
        raise MemplanError(f"model {spec.name} takes no image; set its config (e.g. seq_len), not input_size")
    if not isinstance(input_size, int) or input_size < 1:
        raise MemplanError(f"model {spec.name}: input_size must be a positive integer, got {input_size!r}")
    return input_size


def describe(name: str) -> dict:
    """Summary, default input size, optimizer and config defaults of a zoo or ``hf:`` name."""
    spec = get_spec(name)
    return {"name": name, "summary": spec.summary, "input_size": spec.input_size, "optimizer": spec.optimizer,
            "lr": spec.lr, "config": dict(spec.defaults)}
