"""memplan.zoo: the training workloads memplan traces, plans and runs.

``get_workload(name, batch, input_size=None, device="cpu", seed=0, **config)`` builds a
`Workload` (model, optimizer, example inputs, ``step(*inputs) -> loss``, ``make_inputs(batch)``)
for a zoo name (`known_models()`), ``hf:<name>`` (transformers, random init, offline),
``tv:<name>`` (torchvision where it imports) or ``package.module:function`` (the user's own).
"""

from .config import parse_config
from .registry import describe, get_workload, known_models
from .workload import ModelSpec, Workload

__all__ = ["ModelSpec", "Workload", "describe", "get_workload", "known_models", "parse_config"]
