"""Trace zoo workloads (or any workload factory) by name: build the model, then trace one
iteration with `memplan.tracing.tracer.trace`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from .. import zoo
from ..errors import MemplanError, about_model, model_code
from ..model import Trace
from ..tracing.fake import new_fake_mode, quiet_fake_warnings
from ..tracing.tracer import DEFAULT_WARMUP, trace


def trace_workload(name_or_factory: str | Callable, batch: int, fake: bool = True, *,
                   input_size: int | None = None, warmup: int = DEFAULT_WARMUP,
                   progress: Callable[[int], None] | None = None, time_repeats: int = 0, time_ops: bool = False,
                   **config) -> Trace:
    """Build a workload (inside a FakeTensorMode when `fake`) and trace one iteration.

    Args:
        name_or_factory: a zoo model name, "module:function", or a callable
            `factory(batch, input_size=..., **config)` returning an object with `.step`,
            `.inputs` and optionally `.model` and `.optimizer`.
        batch: batch size.
        fake: build and trace with fake tensors (nothing allocated).
        input_size: image side in pixels, for image models (None: the model default).
        warmup, progress, time_repeats, time_ops: as for `trace` (time_repeats: real CPU traces only;
            time_ops: fake traces only).
        config: model options passed to the factory.
    Returns:
        The trace, with model, batch and config in its meta.
    Raises:
        MemplanError: unknown model or a factory that cannot be imported.
        ModelError: the model cannot be built or its step fails (one line naming the model
            and its options).
    """
    factory = resolve_factory(name_or_factory)
    sizes = {} if input_size is None else {"input_size": input_size}
    name = name_or_factory if isinstance(name_or_factory, str) else getattr(name_or_factory, "__name__", "custom")
    with about_model(name, sizes | config):
        with new_fake_mode() if fake else contextlib.nullcontext(), quiet_fake_warnings(), \
                model_code("cannot be built"):
            workload = factory(batch, **sizes, **config)
        if not (callable(getattr(workload, "step", None)) and hasattr(workload, "inputs")):
            raise MemplanError(f"model {name!r}: the factory must return an object with .step and .inputs")
        meta = {"model": name, "batch": batch, "input_size": getattr(workload, "input_size", input_size),
                "config": dict(getattr(workload, "config", None) or config)}
        return trace(workload.step, *workload.inputs, fake=fake, model=getattr(workload, "model", None),
                     optimizer=getattr(workload, "optimizer", None), warmup=warmup, progress=progress, meta=meta,
                     time_repeats=time_repeats, time_ops=time_ops)


def resolve_factory(name_or_factory: str | Callable) -> Callable:
    """A workload factory `f(batch, **kw)`: the callable itself, or the zoo for a name.

    Names are whatever `memplan.zoo.get_workload` takes: zoo names, hf:<name>, tv:<name>
    and "module:function". Errors (unknown name, module that does not import) surface as
    MemplanError when the factory is called.
    """
    if callable(name_or_factory):
        return name_or_factory

    def zoo_factory(batch, **kw):
        return zoo.get_workload(name_or_factory, batch, **kw)

    return zoo_factory
