"""Build and drive the C replay allocator (replay.c): SmartPool's runtime.

The shared library is compiled at first use with the system C compiler into a cache
directory (see cbuild.py), never into the package tree. The `host` backend uses malloc/free
(tests on CPU); the `cuda` backend becomes PyTorch's CUDA allocator for the whole process
(`install_cuda_allocator`), serving planned slots from one reserved block and everything else
from a stream-ordered heap (cudaMallocAsync). replay.c's NOTE says why it is safe.

Why not `torch.cuda.MemPool(CUDAPluggableAllocator(...))`: a MemPool's allocator only supplies
segments (c10/cuda/CUDACachingAllocator.cpp, `allocPrimitive` asks it for `p.alloc_size`, a
rounded segment) that the caching allocator then splits and caches itself, so no tensor can be
put at a planned offset; `use_mem_pool` also routes only the calling thread, and autograd runs
backward on its own. `torch.cuda.memory.change_current_allocator` sends every request, of every
thread, with its exact size and stream, to the pluggable allocator
(torch/csrc/cuda/CUDAPluggableAllocator.cpp), but only before the process's first CUDA
allocation; and torch's memory statistics are then unavailable, so the allocator counts its own.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import MemplanError
from .cbuild import build_library

SOURCE = Path(__file__).with_name("replay.c")
BACKENDS = ("host", "cuda")
STATS_FIELDS = ("requests", "served", "served_bytes", "small", "unplanned", "unplanned_bytes", "conflicts",
                "other_stream",
                "outside", "missed_slots", "iterations", "live_bytes", "peak_live_bytes", "heap_live_bytes",
                "peak_heap_live_bytes", "alloc_ns", "free_ns")
MISS_FIELDS = ("request", "size", "op", "slot", "slot_size", "kind")
MISS_KINDS = {1: "unplanned", 2: "conflict", 3: "other_stream", 4: "never_requested"}
MISS_LOG_CAP = 64  # replay.c's LOG_CAP


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in STATS_FIELDS]


class _Miss(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in MISS_FIELDS]


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
    """The planned requests of one iteration, in request order (so by op)."""

    pool_bytes: int  # size of the block reserved up front
    sizes: np.ndarray  # int64: planned size of each slot
    offsets: np.ndarray  # int64: its offset in the block
    ops: np.ndarray  # int64: the op whose run requests it (non-decreasing)
    storages: np.ndarray | None = None  # int64: the trace storage each slot holds (for reports)

    @classmethod
    def from_result(cls, result) -> "ReplayPlan":
        """From a PoolResult with offsets (buffers are already in allocation order; a buffer's
        start is the op that requests it)."""
        if result.offsets is None:
            raise MemplanError(f"allocator {result.allocator!r} has no offsets to replay")
        p = result.problem
        return cls(pool_bytes=result.footprint_bytes, sizes=p.sizes.astype(np.int64),
                   offsets=np.asarray(result.offsets, np.int64), ops=p.starts.astype(np.int64), storages=p.storages)


class ReplayAllocator:
    """The C allocator loaded in this process (one per backend: its state is global).

    Requests are matched to slots only between `begin_iteration` and `end_iteration`, by the
    op published in `op_clock` (its `value`); the first iteration after `configure` is the
    verified one (`misses()`).
    """

    def __init__(self, backend: str = "host"):
        self.backend = backend
        self.path = build(backend)
        self.lib = lib = ctypes.CDLL(str(self.path))
        i64p = ctypes.POINTER(ctypes.c_int64)
        lib.memplan_configure.argtypes = [ctypes.c_int64, ctypes.c_int64, i64p, i64p, i64p, ctypes.c_int64]
        lib.memplan_configure.restype = ctypes.c_int
        lib.memplan_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.memplan_malloc.restype = ctypes.c_void_p
        lib.memplan_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        lib.memplan_free.restype = None
        lib.memplan_begin_iteration.argtypes = [ctypes.c_void_p]
        lib.memplan_get_stats.argtypes = [ctypes.POINTER(_Stats)]
        lib.memplan_get_misses.argtypes = [ctypes.POINTER(_Miss), ctypes.c_int64]
        lib.memplan_get_misses.restype = ctypes.c_int64
        lib.memplan_heap_reserved.argtypes = [ctypes.c_int]
        lib.memplan_heap_reserved.restype = ctypes.c_int64
        lib.memplan_load_cudart.argtypes = [ctypes.c_char_p]
        lib.memplan_load_cudart.restype = ctypes.c_int
        lib.memplan_pool_base.restype = ctypes.c_size_t
        self.plan: ReplayPlan | None = None
        self.op_clock = ctypes.c_int64.in_dll(lib, "memplan_op")  # set .value to the op running now

    def configure(self, plan: ReplayPlan) -> None:
        """Reserve the pool and load the planned sequence (counters start again).

        Raises:
            MemplanError: the block could not be reserved, or a block of the previous pool is live.
        """
        columns = [np.ascontiguousarray(a, np.int64) for a in (plan.sizes, plan.offsets, plan.ops)]
        ptr = ctypes.POINTER(ctypes.c_int64)
        n_ops = int(columns[2].max()) + 1 if len(columns[2]) else 0
        rc = self.lib.memplan_configure(plan.pool_bytes, len(columns[0]), *(c.ctypes.data_as(ptr) for c in columns),
                                        n_ops)
        if rc == 3:
            raise MemplanError("replay allocator: the plan's slots are not in op order")
        if rc == 2:
            raise MemplanError("replay allocator: a block of the previous pool is still in use")
        if rc != 0:
            raise MemplanError(f"replay allocator: could not reserve a pool of {plan.pool_bytes} bytes")
        self.plan = plan

    def begin_iteration(self, stream: int = 0) -> None:
        """Arm: requests on `stream` (a cudaStream_t value; 0 is the default stream) are
        matched to the plan from slot 0 on."""
        self.lib.memplan_begin_iteration(stream or None)

    def end_iteration(self) -> None:
        """Disarm: count the slots the iteration never requested; later requests go to the heap."""
        self.lib.memplan_end_iteration()

    def reset_peaks(self) -> None:
        """Peaks (live, heap live, heap reserved) start again from the current values."""
        self.lib.memplan_reset_peaks()

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate `size` bytes as PyTorch would ask (host backend: for tests); returns the address."""
        return self.lib.memplan_malloc(size, 0, stream or None) or 0

    def free(self, address: int, size: int, stream: int = 0) -> None:
        """Free an address returned by `malloc` (`size` and `stream` as it was allocated)."""
        self.lib.memplan_free(address, size, 0, stream or None)

    @property
    def pool_base(self) -> int:
        """Address of the reserved block."""
        return int(self.lib.memplan_pool_base())

    def stats(self) -> dict:
        """The C counters (STATS_FIELDS), plus `fallbacks` (armed requests at or above the
        smallest slot that the pool did not serve), `pool_bytes`, and the heap's reserved bytes
        now and at most since the last peak reset (cuda: the device memory pool's own counters;
        host: its live bytes)."""
        out = _Stats()
        self.lib.memplan_get_stats(ctypes.byref(out))
        values = {name: int(getattr(out, name)) for name in STATS_FIELDS}
        values["fallbacks"] = values["unplanned"] + values["conflicts"] + values["other_stream"]
        values["pool_bytes"] = self.plan.pool_bytes if self.plan is not None else 0
        values["heap_reserved_bytes"] = int(self.lib.memplan_heap_reserved(0))
        values["peak_heap_reserved_bytes"] = int(self.lib.memplan_heap_reserved(1))
        return values

    def misses(self) -> list[dict]:
        """The verified iteration's mismatches (at most MISS_LOG_CAP), in the order they happened:
        request index and size (-1 and 0 for a slot never requested), op, slot and its size (-1
        for a request), kind."""
        buf = (_Miss * MISS_LOG_CAP)()
        n = self.lib.memplan_get_misses(buf, MISS_LOG_CAP)
        rows = [{name: int(getattr(buf[i], name)) for name in MISS_FIELDS} for i in range(n)]
        for row in rows:
            row["kind"] = MISS_KINDS[row["kind"]]
        return rows


_INSTALLED: ReplayAllocator | None = None


def installed_cuda_allocator() -> ReplayAllocator | None:
    """The replay allocator serving this process's CUDA memory, if it was installed."""
    return _INSTALLED


def install_cuda_allocator() -> ReplayAllocator:
    """Make the replay allocator PyTorch's CUDA allocator for this process (idempotent).

    Until a plan is configured and an iteration armed, it serves every request from its
    stream-ordered heap.

    Raises:
        MemplanError: no CUDA, no C compiler, no CUDA runtime in the process, or CUDA memory
            was already allocated (PyTorch cannot swap an allocator in use).
    """
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    if not torch.cuda.is_available():
        raise MemplanError("the pool allocator needs a CUDA device")
    alloc = ReplayAllocator("cuda")
    if alloc.lib.memplan_load_cudart(_loaded_cudart()) != 0:
        raise MemplanError("the pool allocator found no CUDA runtime (libcudart) in this process")
    pluggable = torch.cuda.memory.CUDAPluggableAllocator(str(alloc.path), "memplan_malloc", "memplan_free")
    try:
        torch.cuda.memory.change_current_allocator(pluggable)
    except RuntimeError as exc:
        raise MemplanError("the pool allocator must be installed before the first CUDA allocation of the "
                           f"process ({str(exc).strip().splitlines()[0]})") from None
    _INSTALLED = alloc
    return alloc


def _loaded_cudart() -> bytes | None:
    """Path of the libcudart this process loaded (PyTorch's), or None to search the global scope."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libcudart.so" in path:
                    return path.encode()
    except OSError:
        pass
    return None
