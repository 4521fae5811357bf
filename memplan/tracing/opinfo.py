"""What one aten call touches: tensors it reads and writes (from its schema), FLOPs, bytes.

The tracer calls `describe` once per dispatched op. Storage identity is left to the
caller: this module only sorts tensors into read / written / fresh-output / view-output.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import flop_registry

from ..model import ConvParams

log = logging.getLogger(__name__)

# Namespaces whose ops only query metadata (prim.device, prim.layout): never recorded.
METADATA_NAMESPACES = frozenset({"prim"})
# Ops that update arguments their schema does not mark as written: batch norm's running
# statistics, in training mode (the schema says `Tensor? running_mean`).
UNMARKED_WRITES = {name: ("running_mean", "running_var")
                   for name in ("aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm")}
# Ops that move no device data and that one run of a step may make where another does not: a
# fake trace lifts constants itself (`lift_fresh`), autograd skips a detach under saved-tensor
# hooks, a real optimizer reads its CPU step counter (`.item()`). The executor lets them pass
# and matches the step's other ops against the trace.
OPTIONAL_OPS = frozenset({"aten.lift_fresh.default", "aten.detach.default", "aten.alias.default",
                          "aten._local_scalar_dense.default"})
# Factories that hand out uninitialised memory: they allocate but move no bytes.
UNINITIALISED_FACTORIES = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


@dataclass(frozen=True, kw_only=True)
class OpTensors:
    """The tensors of one call, sorted by role (lists of tensors, possibly repeated)."""

    reads: tuple  # input tensors the op reads (a view op's input: its storage must be there)
    written: tuple  # input tensors the op writes in place (in-place self, out= arguments)
    fresh: tuple  # outputs that are new buffers (not aliases of an input)
    is_view: bool  # every output aliases an input and nothing is written: moves no data


def leaves(value) -> list:
    """The leaves of an aten call's arguments or results (tuples, lists and dicts of leaves), in
    order: torch's pytree flattens any structure, at several times the cost per call."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in leaves(v)]
    return [value]


def is_recorded(func) -> bool:
    """False for metadata queries (prim ops) that the trace leaves out."""
    return func.namespace not in METADATA_NAMESPACES


def counts_as_op(func, args: tuple, kwargs: dict, out) -> bool:
    """True when the trace records this aten call as an op: a recorded op with a tensor among
    its arguments or results. The executor counts ops with this same test."""
    return is_recorded(func) and any(isinstance(t, torch.Tensor) for t in leaves((args, kwargs, out)))


def storage_roles(func, args: tuple, kwargs: dict, out) -> tuple[list, list]:
    """One tensor per distinct storage the op reads, and per distinct storage it writes (written
    in place first, then new outputs), in the order the tracer numbers `Op.reads`/`Op.writes`.

    The executor pairs them with a traced op's storage ids to find the live storages.
    """
    tensors = split_tensors(func, args, kwargs, out)
    return distinct(tensors.reads), distinct(tensors.written + tensors.fresh)


def distinct(tensors) -> list:
    """One tensor per distinct storage, in first-seen order."""
    seen: dict[int, torch.Tensor] = {}
    for t in tensors:
        seen.setdefault(storage_key(t), t)
    return list(seen.values())


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
    unmarked = _unmarked_writes(func, args, kwargs)
    for arg, value in _bound_arguments(func, args, kwargs):
        tensors = [t for t in leaves(value) if isinstance(t, torch.Tensor)]
        if arg.writes or arg.name in unmarked:
            written += tensors
        if not arg.is_out:
            reads += tensors
    fresh, aliased = _outputs(func, out)
    is_view = not written and not fresh and bool(aliased)
    return OpTensors(reads=tuple(reads), written=tuple(written), fresh=tuple(fresh), is_view=is_view)


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


# The two aten ops every 2-D convolution of a training step goes through, and the positions
# of (input, weight, stride, padding, dilation, transposed, groups) in their arguments;
# convolution_backward's output_mask (grad_input, grad_weight, grad_bias) comes last.
_CONV_ARGS = {"aten::convolution": (0, 1, 3, 4, 5, 6, 8), "aten::convolution_backward": (1, 2, 4, 5, 6, 7, 9, 10)}
_SPATIAL_DIMS = 2


def conv_params(func, args: tuple) -> ConvParams | None:
    """The geometry and kernels of a 2-D, non-transposed convolution call; None for any other op.

    A backward call runs `bwd_data` when it computes the input's gradient and `bwd_filter`
    when it computes the weight's (the bias gradient is a plain reduction, not a kernel).
    """
    where = _CONV_ARGS.get(func._schema.name)
    if where is None or func._overloadname != "default" or len(args) <= max(where):
        return None
    x, weight, stride, padding, dilation, transposed, groups, *mask = (args[i] for i in where)
    if transposed or x.dim() != _SPATIAL_DIMS + 2:
        return None
    kernels = tuple(k for k, on in zip(("bwd_data", "bwd_filter"), mask[0][:2]) if on) if mask else ("fwd",)
    if not kernels:
        return None
    n, c, h, w = (int(v) for v in x.shape)
    k, _, r, s = (int(v) for v in weight.shape)
    return ConvParams(kernels=kernels, n=n, c=c, h=h, w=w, k=k, r=r, s=s, pad_h=int(padding[0]),
                      pad_w=int(padding[1]), stride_h=int(stride[0]), stride_w=int(stride[1]),
                      dil_h=int(dilation[0]), dil_w=int(dilation[1]), groups=int(groups),
                      dtype=str(x.dtype).removeprefix("torch."))


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


def _unmarked_writes(func, args: tuple, kwargs: dict) -> tuple:
    """Names of the arguments `func` writes although its schema does not say so."""
    names = UNMARKED_WRITES.get(func._schema.name)
    if not names:
        return ()
    training = dict((a.name, v) for a, v in _bound_arguments(func, args, kwargs)).get("training", False)
    return names if training else ()


@dataclass(frozen=True)
class _Arg:
    """What the tracer needs of one schema argument."""

    name: str
    kwarg_only: bool
    writes: bool  # the schema marks it written (in-place self, out=)
    is_out: bool


@functools.cache
def _schema(func) -> tuple[tuple[_Arg, ...], tuple[bool, ...]]:
    """An overload's arguments, and per return whether it aliases an input: read from the schema
    once (every read of `func._schema` builds new objects in C++)."""
    schema = func._schema
    arguments = tuple(_Arg(name=a.name, kwarg_only=a.kwarg_only, is_out=a.is_out,
                           writes=a.alias_info is not None and a.alias_info.is_write) for a in schema.arguments)
    return arguments, tuple(r.alias_info is not None for r in schema.returns)


def _bound_arguments(func, args: tuple, kwargs: dict):
    """(schema argument, value) pairs for the arguments actually passed."""
    for i, arg in enumerate(_schema(func)[0]):
        if i < len(args) and not arg.kwarg_only:
            yield arg, args[i]
        elif arg.name in kwargs:
            yield arg, kwargs[arg.name]


def _outputs(func, out) -> tuple[list, list]:
    """Outputs split into fresh buffers and aliases of inputs (views, in-place results)."""
    aliases = _schema(func)[1]
    values = out if isinstance(out, (tuple, list)) and len(aliases) > 1 else (out,)
    fresh, aliased = [], []
    for is_alias, value in zip(aliases, values):
        tensors = [t for t in leaves(value) if isinstance(t, torch.Tensor)]
        (aliased if is_alias else fresh).extend(tensors)
    return fresh, aliased
