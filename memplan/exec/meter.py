"""An independent memory meter: the bytes of live storages on one device, after every op.

It relies on nothing else in memplan (an import-linter contract keeps it so): it watches
every aten op through its own dispatch mode, remembers a weak reference to every storage on
the device it sees (plus the ones it is told exist before the step: parameters, gradients,
optimizer state, inputs), and after each op sums the current size of those still alive.
Storages freed by the framework drop out when their weak reference expires; storages
resized in place (as the executor does to swap them) count at their current size. On plain
training its peak equals the traced peak load to the byte (tested). Buffers the caller
declares host memory (the executor's host slab) are excluded.

On a GPU the allocator's own counters are the meter: `torch.cuda.max_memory_allocated`
and `max_memory_reserved` since the last reset. A pluggable CUDA allocator (memplan's pool)
has no such counters in torch: then the GPU is metered by the dispatch-level count, as the CPU is.

Enter the meter *before* the executor's mode, so it sees what the executor does (an op
a mode runs inside its handler goes to the modes entered before it).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch
from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves

_expired = torch.UntypedStorage._expired
_from_weak = torch.UntypedStorage._new_with_weak_ptr


class MemoryMeter(TorchDispatchMode):
    """Peak bytes of live storages on `device` (CPU: counted here; CUDA: the allocator's counters, if any).

    Args:
        device: the device whose memory is measured.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        super().__init__()
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda" and _allocator_counts(self.device)  # else: counted here
        self._weak: dict[int, int] = {}  # storage address -> weak pointer
        self._excluded: set[int] = set()
        self.peak_bytes = 0
        self.own_s = 0.0  # seconds spent in the meter's own bookkeeping (a step's time less this is the step's)
        self.active = True  # False: ops pass straight through (a step that is not measured pays no bookkeeping)

    # --- what exists outside the ops --------------------------------------------------------

    def track(self, tensors) -> None:
        """Count the storages of `tensors` (any nesting) from now on."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._see(t)

    def exclude(self, tensors) -> None:
        """Never count the storages of `tensors` (host buffers that live beside the device role)."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._excluded.add(t.untyped_storage()._cdata)

    # --- measuring ---------------------------------------------------------------------------

    def reset_peak(self) -> None:
        """Start a new peak from what is live now."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.peak_bytes = self.live_bytes()
        self.own_s = 0.0

    def live_bytes(self) -> int:
        """Bytes of the live storages now (CUDA: allocated bytes)."""
        if self.cuda:
            return int(torch.cuda.memory_allocated(self.device))
        total, dead = 0, []
        for key, weak in self._weak.items():
            if _expired(weak):
                dead.append(key)
            else:
                total += _from_weak(weak).nbytes()
        for key in dead:
            torch.UntypedStorage._free_weak_ref(self._weak.pop(key))
        return total

    def live_storages(self) -> list[tuple[int, int, int]]:
        """(data pointer, bytes, a new weak pointer the caller frees) of every live storage counted."""
        out = []
        for weak in self._weak.values():
            if not _expired(weak):
                storage = _from_weak(weak)
                out.append((storage.data_ptr(), storage.nbytes(), storage._weak_ref()))
        return out

    def peak(self) -> dict:
        """{"measured_peak_bytes", "measured_peak_reserved_bytes" (CUDA only, else None)} since the last reset."""
        if self.cuda:
            return {"measured_peak_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                    "measured_peak_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device))}
        return {"measured_peak_bytes": int(self.peak_bytes), "measured_peak_reserved_bytes": None}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.active:
            return func(*args, **(kwargs or {}))
        if any(is_traceable_wrapper_subclass(t) for t in tree_leaves((args, kwargs))):
            # A tensor subclass (FSDP2's DTensor): its ops on its local tensors come back here.
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if not self.cuda:
            started = time.perf_counter()
            for t in tree_leaves((args, kwargs, out)):
                if isinstance(t, torch.Tensor):
                    self._see(t)
            self.peak_bytes = max(self.peak_bytes, self.live_bytes())
            self.own_s += time.perf_counter() - started
        return out

    def _see(self, t: torch.Tensor) -> None:
        t = getattr(t, "_local_tensor", t)  # a DTensor holds this rank's shard
        if t.device != self.device:
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self._weak and key not in self._excluded:
            self._weak[key] = storage._weak_ref()

    def close(self) -> None:
        """Drop the weak references."""
        for weak in self._weak.values():
            torch.UntypedStorage._free_weak_ref(weak)
        self._weak.clear()


def _allocator_counts(device: torch.device) -> bool:
    """Whether torch reports the CUDA allocator's counters (a pluggable allocator has none)."""
    try:
        torch.cuda.memory_stats(device)
    except RuntimeError:
        return False
    return True


class AllocatorMeter:
    """Peak bytes on the CPU from the allocator's own stream of allocations and frees, for code
    `MemoryMeter` cannot watch: torch.compile does not compile under a Python dispatch mode,
    and inductor's buffers are allocated below the Python dispatcher.

    `torch.profiler` with `profile_memory` records every allocation and free of the CPU
    allocator with its running total; the peak is what the step starts from (the storages
    `start` tracks: parameters, gradients, optimizer state, inputs) plus the largest total
    since the block began. The profiler reports a free only of a block it saw allocated (in
    any profiled block): a tracked storage that dies unreported in the block is taken to have
    died at its start (zero_grad dropping the last step's gradients). Unlike `MemoryMeter` it
    also counts memory an op allocates and frees inside itself.

    Args:
        start: the meter that tracks what is live when the block starts (None: nothing).
    """

    def __init__(self, start: MemoryMeter | None = None):
        self._start = start
        self.peak_bytes = 0
        self.own_s = 0.0
        self._profile = None
        self._live: list[tuple[int, int, int]] = []  # (data pointer, bytes, weak pointer) live at the start

    def __enter__(self) -> "AllocatorMeter":
        self._live = self._start.live_storages() if self._start is not None else []
        self.peak_bytes = sum(nbytes for _, nbytes, _ in self._live)
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with _silent_stderr():
            self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        with _silent_stderr():
            self._profile.__exit__(*exc)
        if exc[0] is None:
            events = _cpu_allocations(self._profile.profiler.kineto_results.experimental_event_tree())
            reported = _reported_frees(events)
            start = sum(nbytes for ptr, nbytes, weak in self._live if not (_expired(weak) and ptr not in reported))
            before = events[0][1] - events[0][2] if events else 0  # the running total before the block
            self.peak_bytes = start + max([0, *(total - before for _, total, _, _ in events)])
        for _, _, weak in self._live:
            torch.UntypedStorage._free_weak_ref(weak)
        self._live = []

    def peak(self) -> dict:
        """{"measured_peak_bytes", "measured_peak_reserved_bytes": None}, as `MemoryMeter.peak`."""
        return {"measured_peak_bytes": int(self.peak_bytes), "measured_peak_reserved_bytes": None}


@contextlib.contextmanager
def _silent_stderr():
    """File descriptor 2 pointed at /dev/null for the block: the profiler's C++ library prints a
    line at every start and stop (`USDT: ... profiler_start`) that no setting turns off."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _cpu_allocations(roots) -> list[tuple[int, int, int, int]]:
    """The profiled CPU allocations and frees in time order: (time, running total, bytes (negative
    for a free), data pointer)."""
    events, todo = [], list(roots)
    while todo:
        event = todo.pop()
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == torch.device("cpu").type:
            f = event.extra_fields
            events.append((event.start_time_ns, f.total_allocated, f.alloc_size, f.ptr))
        todo.extend(event.children)
    return sorted(events)


def _reported_frees(events) -> set[int]:
    """Pointers whose first event in the block is a free: blocks from before it, whose free was reported."""
    first: dict[int, int] = {}
    for _, _, nbytes, ptr in events:
        first.setdefault(ptr, nbytes)
    return {ptr for ptr, nbytes in first.items() if nbytes < 0}
