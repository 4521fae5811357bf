"""memplan.zoo: the training workloads memplan traces, plans and runs.

``get_workload(name, batch, input_size=None, device="cpu", seed=0, **config)`` builds a
`Workload` (model, optimizer, example inputs, ``step(*inputs) -> loss``, ``make_inputs(batch)``)
for a zoo name (`known_models()`), ``hf:<name>`` (transformers, random init, offline),
``tv:<name>`` (torchvision where it imports) or ``package.module:function`` (the user's own).
Names are imported lazily: the models import torch, and `memplan.zoo.config` (the CLI's
``key=value`` parsing) is read by commands that import none.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS = {
    "ModelSpec": "memplan.zoo.workload",
    "Workload": "memplan.zoo.workload",
    "describe": "memplan.zoo.registry",
    "get_workload": "memplan.zoo.registry",
    "known_models": "memplan.zoo.registry",
    "parse_config": "memplan.zoo.config",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
