"""Running a module call again, natively, to recompute what it saved (the hooked executor's regions).

As torch.utils.checkpoint's non-reentrant recompute does: the call's arguments are held from its
forward (`Held.of`, at the module's forward pre-hook), with the RNG and autocast states it ran
under (memplan.exec.run_state); `run_again` runs it from them under saved-tensor hooks of its own,
hands over the storages wanted by their pack index and stops once it has them all, and puts back
the module buffers the run updated (batch norm's running statistics).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .run_state import AutocastState, RngState
from .saved import detached


@dataclass(frozen=True)
class Held:
    """What a region's run needs from its forward call."""

    module: torch.nn.Module  # the module called
    args: tuple  # its positional arguments
    kwargs: dict  # its keyword arguments
    rng: RngState  # the generators' states it ran under
    autocast: AutocastState  # autocast's state it ran under

    @classmethod
    def of(cls, module: torch.nn.Module, args: tuple, kwargs: dict, device: torch.device) -> Held:
        """What a run of this call needs, as its forward begins on `device`."""
        return cls(module=module, args=args, kwargs=kwargs, rng=RngState.of(device),
                   autocast=AutocastState.of(device))


class _RegionDone(Exception):
    """Raised from a run's pack hook once it has every storage wanted (the rest need not run)."""


def run_again(held: Held, first_saved: int, wanted: dict[int, int], restores: bool) -> dict[int, torch.UntypedStorage]:
    """Run the call `held` again until it saved every storage `wanted` (pack index -> storage id;
    its packs are numbered from `first_saved`); returns storage id -> the storage the run made.
    `restores`: the call updates module buffers, which are put back afterwards."""
    fresh: dict[int, torch.UntypedStorage] = {}
    index = [first_saved]

    def pack(t):
        sid = wanted.get(index[0])
        index[0] += 1
        if sid is not None:
            fresh[sid] = t.untyped_storage()
            if len(fresh) == len(wanted):
                raise _RegionDone
        return detached(t)  # held by the run's graph until the run ends, as the simulator counts it

    buffers = [(b, b.detach().clone()) for b in held.module.buffers()] if restores else []
    # arguments cut from the step's graph (as torch.utils.checkpoint's are): a run stopped midway may
    # leave a node behind, which must not hold the step's graph alive
    args, kwargs = _cut((held.args, held.kwargs))
    try:
        with held.rng.restored(), torch.enable_grad(), held.autocast.entered(), \
                torch.autograd.graph.saved_tensors_hooks(pack, _never_unpacked):
            held.module(*args, **kwargs)
    except _RegionDone:
        pass
    finally:
        with torch.no_grad():
            for b, value in buffers:
                b.copy_(value)
    return fresh


def _cut(value, seen: dict | None = None):
    """`value` with every tensor in its tuples, lists and dicts cut from its history, requiring
    grad as it did (so autograd saves what it saved). A tensor passed twice stays one tensor
    (`seen`: id -> its cut): `nn.MultiheadAttention` takes its packed projection only where query,
    key and value are the same object, and a run must save what the forward saved. Written out:
    pytree's map costs about 50 us a call here, more than the module call it prepares."""
    seen = {} if seen is None else seen
    if isinstance(value, torch.Tensor):
        cut = seen.get(id(value))
        if cut is None:
            cut = seen[id(value)] = value.detach().requires_grad_(value.requires_grad)
        return cut
    if type(value) in (tuple, list):
        return type(value)(_cut(v, seen) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_cut(v, seen) for v in value))
    if type(value) is dict:
        return {k: _cut(v, seen) for k, v in value.items()}
    return value


def _never_unpacked(_):
    raise RuntimeError("memplan: a region's run is never differentiated")
