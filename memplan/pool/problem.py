"""A pool problem: buffers with half-open lifetimes and sizes, from a trace, a plan or a CSV.

A buffer is one residency interval of one storage: `[start, end)` in op indices and
`size` bytes. A solution gives every buffer a byte offset; it is valid when no two buffers
alive at the same time share an address. Quality is footprint / peak load (1.0 perfect).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import MemplanError
from ..tracing.importers.minimalloc import read_minimalloc

MINIMALLOC_COLUMNS = ("id", "lower", "upper", "size")

# Roles a buffer plays for the online allocators of paper 001 (vDNN++).
ROLE_PLAIN = 0  # an ordinary allocation
ROLE_OFFLOAD = 1  # the first residency of a storage that is swapped out later (placed high by vdnnpp-highend)
ROLE_PREFETCH = 2  # a residency that starts with a prefetch or a recomputation


@dataclass(frozen=True, kw_only=True, eq=False)
class PoolProblem:
    """Buffers to place in one pool.

    All arrays have one entry per buffer, in allocation order (start, then storage id).
    """

    starts: np.ndarray  # int64: first time step the buffer is alive
    ends: np.ndarray  # int64: first time step it is gone again (half-open)
    sizes: np.ndarray  # int64: bytes
    storages: np.ndarray  # int64: storage id it belongs to (the row index for CSV input)
    names: tuple[str, ...]  # the id written by --offsets-out (minimalloc id or storage id)
    roles: np.ndarray  # int8: ROLE_* per buffer
    source: str = ""  # where it came from, for messages

    def __post_init__(self):
        n = len(self.sizes)
        for name in ("starts", "ends", "storages", "roles"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"pool problem: {name} has {len(getattr(self, name))} entries, expected {n}")
        if n and (np.any(self.ends <= self.starts) or np.any(self.sizes <= 0)):
            raise ValueError("pool problem: every buffer needs end > start and size > 0")

    @property
    def n(self) -> int:
        """Number of buffers."""
        return len(self.sizes)

    @property
    def horizon(self) -> int:
        """One past the last time step any buffer is alive."""
        return int(self.ends.max()) if self.n else 0

    @cached_property
    def peak_load_bytes(self) -> int:
        """Largest sum of sizes of buffers alive at one time: a lower bound on any footprint."""
        if not self.n:
            return 0
        times = np.concatenate([self.starts, self.ends])
        deltas = np.concatenate([self.sizes, -self.sizes])
        # Frees at time t come before allocations at t (half-open lifetimes).
        order = np.lexsort((deltas, times))
        return int(np.cumsum(deltas[order]).max())

    def subset(self, keep: np.ndarray) -> "PoolProblem":
        """The problem restricted to buffers where `keep` (bool mask or index array) selects."""
        return PoolProblem(starts=self.starts[keep], ends=self.ends[keep], sizes=self.sizes[keep],
                           storages=self.storages[keep], names=tuple(np.asarray(self.names, dtype=object)[keep]),
                           roles=self.roles[keep], source=self.source)


def make_problem(starts, ends, sizes, *, storages=None, names=None, roles=None, source: str = "") -> PoolProblem:
    """Build a PoolProblem from plain sequences, sorted into allocation order.

    Args:
        starts, ends, sizes: per buffer, half-open lifetime and bytes.
        storages: storage id per buffer (default: position).
        names: output id per buffer (default: str(storage)).
        roles: ROLE_* per buffer (default ROLE_PLAIN).
        source: a label for messages.
    Returns:
        The problem, buffers ordered by (start, storage id).
    """
    starts = np.asarray(starts, dtype=np.int64)
    n = len(starts)
    storages = np.arange(n, dtype=np.int64) if storages is None else np.asarray(storages, dtype=np.int64)
    names = tuple(str(s) for s in storages) if names is None else tuple(names)
    roles = np.zeros(n, dtype=np.int8) if roles is None else np.asarray(roles, dtype=np.int8)
    order = np.lexsort((storages, starts))
    return PoolProblem(starts=starts[order], ends=np.asarray(ends, dtype=np.int64)[order],
                       sizes=np.asarray(sizes, dtype=np.int64)[order], storages=storages[order],
                       names=tuple(names[i] for i in order), roles=roles[order], source=source)


def read_minimalloc_csv(path: str | os.PathLike) -> PoolProblem:
    """Read a minimalloc CSV (`id,lower,upper,size`, half-open `[lower, upper)`).

    Raises:
        TraceFormatError: naming the file, line and bad field (the importer's checks).
    """
    rows = read_minimalloc(path).storages
    return make_problem([s.alloc_op for s in rows], [s.free_op for s in rows], [s.nbytes for s in rows],
                        names=[s.name for s in rows], source=str(path))


def is_minimalloc_csv(path: str | os.PathLike) -> bool:
    """True when the file starts with the minimalloc CSV header."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.readline()
    except OSError as exc:
        raise MemplanError(f"{path}: cannot read: {exc}") from None
    return tuple(c.strip() for c in head.split(",")[:4]) == MINIMALLOC_COLUMNS


def from_storages(trace) -> PoolProblem:
    """Buffers of a trace with no plan: one per storage with a non-empty lifetime."""
    keep = [s for s in trace.storages if s.nbytes > 0 and s.free_op > s.alloc_op]
    names = [s.name if trace.meta.get("source") == "minimalloc" and s.name else str(s.id) for s in keep]
    return make_problem([s.alloc_op for s in keep], [s.free_op for s in keep], [s.nbytes for s in keep],
                        storages=[s.id for s in keep], names=names, source=str(trace.meta.get("model", "")))
