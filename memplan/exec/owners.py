"""Find the live tensor an owner record names: a parameter, buffer, gradient or optimizer state."""

from __future__ import annotations

import torch

from ..model import Owner
from ..tracing.stepwise import group_params


def resolve_owner(owner: Owner, model: torch.nn.Module | None, optimizer) -> torch.Tensor | None:
    """The tensor `owner` holds now (None when it is gone or there is nothing to look in)."""
    try:
        if owner.kind == "state":
            param = group_params(optimizer.param_groups[owner.group])[owner.index]
            return optimizer.state.get(param, {}).get(owner.key)
        if owner.kind == "buffer":
            return model.get_buffer(owner.name)
        param = model.get_parameter(owner.name)
        return param.grad if owner.kind == "grad" else param
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
