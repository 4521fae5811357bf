"""What one aten call touches: tensors it reads and writes (from its schema), FLOPs, bytes.

The tracer calls `describe` once per dispatched op. Storage identity is left to the
caller: this module only sorts tensors into read / written / fresh-output / view-output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

log = logging.getLogger(__name__)

# Namespaces whose ops only query metadata (prim.device, prim.layout): never recorded.
METADATA_NAMESPACES = frozenset({"prim"})
# Factories that hand out uninitialised memory: they allocate but move no bytes.
UNINITIALISED_FACTORIES = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


@dataclass(frozen=True, kw_only=True)
class OpTensors:
    """The tensors of one call, sorted by role (lists of tensors, possibly repeated)."""

    reads: tuple  # input tensors whose contents the op reads
    written: tuple  # input tensors the op writes in place (in-place self, out= arguments)
    fresh: tuple  # outputs that are new buffers (not aliases of an input)
    is_view: bool  # every output aliases an input and nothing is written: a metadata-only op


def is_recorded(func) -> bool:
    """False for metadata queries (prim ops) that the trace leaves out."""
    return func.namespace not in METADATA_NAMESPACES


def split_tensors(func, args: tuple, kwargs: dict, out) -> OpTensors:
    """Sort the tensors of one call by role using the op's schema alias annotations.

    Args:
        func: the aten OpOverload.
        args, kwargs: its arguments.
        out: what it returned.
    Returns:
        The tensors by role.
    """
    reads, written = [], []
    for arg, value in _bound_arguments(func, args, kwargs):
        tensors = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
        writes = arg.alias_info is not None and arg.alias_info.is_write
        if writes:
            written += tensors
        if not arg.is_out:
            reads += tensors
    fresh, aliased = _outputs(func, out)
    is_view = not written and not fresh and bool(aliased)
    return OpTensors(reads=() if is_view else tuple(reads), written=tuple(written), fresh=tuple(fresh),
                     is_view=is_view)


def flops_of(func, args: tuple, kwargs: dict, out) -> float:
    """FLOPs of one call from torch.utils.flop_counter's registry (0 for unregistered ops)."""
    counter = flop_registry.get(func._overloadpacket)
    if counter is None:
        return 0.0
    try:
        return float(counter(*args, **kwargs, out_val=out))
    except Exception:  # noqa: BLE001 - a counter that cannot handle odd arguments is not fatal
        log.debug("flop counter for %s failed", func, exc_info=True)
        return 0.0


def moves_no_data(func) -> bool:
    """True for ops that allocate without touching the memory (aten.empty and friends)."""
    return func._schema.name.split("::")[-1] in UNINITIALISED_FACTORIES


def bytes_accessed(tensors) -> int:
    """Bytes of the distinct tensors given (a tensor passed twice counts once)."""
    seen, total = set(), 0
    for t in tensors:
        key = (storage_key(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def storage_key(t: torch.Tensor) -> int:
    """Identity of the storage under `t` (its StorageImpl address), for real and fake tensors."""
    return t.untyped_storage()._cdata


def _bound_arguments(func, args: tuple, kwargs: dict):
    """(schema argument, value) pairs for the arguments actually passed."""
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            yield arg, args[i]
        elif arg.name in kwargs:
            yield arg, kwargs[arg.name]


def _outputs(func, out) -> tuple[list, list]:
    """Outputs split into fresh buffers and aliases of inputs (views, in-place results)."""
    returns = func._schema.returns
    values = out if isinstance(out, (tuple, list)) and len(returns) > 1 else (out,)
    fresh, aliased = [], []
    for ret, value in zip(returns, values):
        tensors = [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]
        (aliased if ret.alias_info is not None else fresh).extend(tensors)
    return fresh, aliased
