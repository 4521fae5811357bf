"""Build and drive the C replay allocator (replay.c).

The shared library is compiled at first use with the system C compiler into a cache
directory (see cbuild.py), never into the package tree. The `host` backend uses malloc/free
(for tests on CPU); the `cuda` backend resolves cudaMalloc/cudaFree from the CUDA runtime
loaded in the process and plugs into PyTorch through
`torch.cuda.memory.CUDAPluggableAllocator` and `torch.cuda.MemPool`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MemplanError
from .cbuild import build_library

SOURCE = Path(__file__).with_name("replay.c")
BACKENDS = ("host", "cuda")
STATS_FIELDS = ("planned_hits", "fallbacks", "size_mismatches", "extra_requests", "overlap_conflicts",
                "iterations", "live_bytes", "peak_live_bytes", "fallback_live_bytes", "peak_reserved_bytes")


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in STATS_FIELDS]


def build(backend: str = "host") -> Path:
    """Compile replay.c for `backend` (cached by source hash); returns the .so path.

    Raises:
        MemplanError: no C compiler, or compilation failed.
    """
    if backend not in BACKENDS:
        raise MemplanError(f"unknown replay backend {backend!r}; known: {', '.join(BACKENDS)}")
    flags = ("-DMEMPLAN_HOST_BACKEND",) if backend == "host" else ()
    return build_library(SOURCE, f"memplan_replay_{backend}", flags, ("-ldl", "-lpthread"))


@dataclass(frozen=True, kw_only=True)
class ReplayPlan:
    """The planned allocation sequence of one iteration."""

    pool_bytes: int  # size of the block reserved up front
    sizes: np.ndarray  # int64: planned size of the i-th request
    offsets: np.ndarray  # int64: planned offset of the i-th request

    @classmethod
    def from_result(cls, result) -> "ReplayPlan":
        """From a PoolResult with offsets (buffers are already in allocation order)."""
        if result.offsets is None:
            raise MemplanError(f"allocator {result.allocator!r} has no offsets to replay")
        return cls(pool_bytes=result.footprint_bytes, sizes=result.problem.sizes.astype(np.int64),
                   offsets=np.asarray(result.offsets, np.int64))


class ReplayAllocator:
    """The C allocator loaded in this process (one per backend: its state is global)."""

    def __init__(self, backend: str = "host"):
        self.backend = backend
        self.path = build(backend)
        self.lib = ctypes.CDLL(str(self.path))
        lib = self.lib
        lib.memplan_configure.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64),
                                          ctypes.POINTER(ctypes.c_int64)]
        lib.memplan_configure.restype = ctypes.c_int
        lib.memplan_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.memplan_malloc.restype = ctypes.c_void_p
        lib.memplan_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.memplan_free.restype = None
        lib.memplan_get_stats.argtypes = [ctypes.POINTER(_Stats)]
        lib.memplan_pool_base.restype = ctypes.c_size_t

    def configure(self, plan: ReplayPlan) -> None:
        """Reserve the pool and load the planned sequence.

        Raises:
            MemplanError: the pool block could not be allocated.
        """
        sizes = np.ascontiguousarray(plan.sizes, np.int64)
        offsets = np.ascontiguousarray(plan.offsets, np.int64)
        ptr = ctypes.POINTER(ctypes.c_int64)
        rc = self.lib.memplan_configure(plan.pool_bytes, len(sizes), sizes.ctypes.data_as(ptr),
                                        offsets.ctypes.data_as(ptr))
        if rc != 0:
            raise MemplanError(f"replay allocator: could not reserve a pool of {plan.pool_bytes} bytes")

    def new_iteration(self) -> None:
        """The next request is the first of a new iteration."""
        self.lib.memplan_new_iteration()

    def malloc(self, size: int) -> int:
        """Allocate `size` bytes (host backend: for tests); returns the address."""
        return self.lib.memplan_malloc(size, 0, None) or 0

    def free(self, address: int, size: int) -> None:
        """Free an address returned by `malloc`."""
        self.lib.memplan_free(address, size, 0, None)

    @property
    def pool_base(self) -> int:
        """Address of the reserved block."""
        return int(self.lib.memplan_pool_base())

    def stats(self) -> dict:
        """planned_hits, fallbacks (by cause), live/peak bytes, peak reserved bytes."""
        out = _Stats()
        self.lib.memplan_get_stats(ctypes.byref(out))
        return {name: int(getattr(out, name)) for name in STATS_FIELDS}

    def mem_pool(self):
        """A torch.cuda.MemPool backed by this allocator (cuda backend only).

        Use as `with torch.cuda.use_mem_pool(pool): step()`; call `new_iteration()` before
        each step.
        """
        import torch

        if self.backend != "cuda":
            raise MemplanError("mem_pool() needs the cuda backend")
        pluggable = torch.cuda.memory.CUDAPluggableAllocator(str(self.path), "memplan_malloc", "memplan_free")
        return torch.cuda.MemPool(pluggable.allocator())
