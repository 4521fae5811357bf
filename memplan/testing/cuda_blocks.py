"""What the CUDA stand-in (memplan.testing.cuda_rules) knows of memory: blocks, the accesses streams
made to them, and which tensors an op reads and writes."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..exec.capturable import DATA_SHAPED, HOST_READS

_expired = torch.UntypedStorage._expired
_from_weak = torch.UntypedStorage._new_with_weak_ptr


class Access(NamedTuple):
    """Bytes [lo, hi) of a block, read or written by the `seq`-th piece of work of `stream` (in
    `capture`: work recorded, not run, until a replay)."""

    lo: int
    hi: int
    stream: object
    seq: int
    write: bool
    capture: object = None


class Block:
    """One storage's device memory: the stream it was allocated on, the graph pool it came from
    (None: the ordinary pools), the accesses since, and the streams recorded with record_stream."""

    def __init__(self, storage: torch.UntypedStorage, stream):
        self.handle = storage._weak_ref()
        self.stream = stream
        self.pool: tuple | None = None
        self.nbytes = storage.nbytes()
        self.accesses: list[Access] = []
        self.recorded: set = set()

    def dead(self) -> bool:
        return _expired(self.handle)

    def storage(self) -> torch.UntypedStorage:
        return _from_weak(self.handle)

    def overlapping(self, lo: int, hi: int) -> list[Access]:
        return [a for a in self.accesses if a.lo < hi and lo < a.hi]

    def add(self, access: Access) -> None:
        """Keep `access`; drop those it supersedes (the same stream's on the same bytes, or any a
        write covers: a later access ordered after this one is ordered after them)."""
        self.accesses = [a for a in self.accesses if not (
            access.lo <= a.lo and a.hi <= access.hi and (access.write or a.stream is access.stream))]
        self.accesses.append(access)

    def uncapture(self, capture) -> None:
        """Forget what `capture` recorded: none of it ran."""
        self.accesses = [a for a in self.accesses if a.capture is not capture]

    def forget(self) -> None:
        torch.UntypedStorage._free_weak_ref(self.handle)


def extent(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [lo, hi) of its storage a tensor spans."""
    lo = t.storage_offset() * t.element_size()
    if t.numel() == 0:
        return lo, lo
    return lo, lo + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


def roles(func, args: tuple, kwargs: dict) -> tuple[list, list]:
    """The tensor arguments an op reads and those it writes in place (its schema's mutable ones); a view
    op (a return aliasing an argument, not written) touches no bytes."""
    read, written = [], []
    schema = func._schema
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        return read, written
    for i, a in enumerate(schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(a.name)
        tensors = [value] if isinstance(value, torch.Tensor) else [
            v for v in value if isinstance(v, torch.Tensor)] if isinstance(value, (list, tuple)) else []
        (written if a.alias_info is not None and a.alias_info.is_write else read).extend(tensors)
    return read, written


def host_read(name: str, args: tuple) -> bool:
    """Whether an op makes the host wait for a device value: it reads one (`.item()`), its output's
    size depends on the data, or it indexes with a boolean mask."""
    packet = name.rsplit(".", 1)[0]
    if packet in HOST_READS or packet in DATA_SHAPED:
        return True
    if packet in ("aten.index", "aten.index_put", "aten.index_put_") and len(args) > 1:
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())
    return False
