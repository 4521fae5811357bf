"""The swap executor: saved-tensor hooks that offload planned tensors and prefetch them back.

At the k-th pack of a step, the executor looks up the trace storage of the k-th pack; if
the plan swaps it, the tensor is copied into a host slab region on the d2h lane and the
pack returns a handle (autograd drops its reference, so the device memory goes back to
the allocator once the copy is done and nobody else holds the tensor). At the plan's
trigger (a module's backward start, see runtime.py) the prefetch is issued on the h2d
lane; unpack only waits for it. A prefetch that was never triggered is issued at unpack
(counted as late), so a mis-mapped trigger costs time, never correctness. A pack whose
size disagrees with the trace (the step diverged) stops swapping for the rest of the step.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import torch

from .compress import Compressed, compress, compressible, decompress
from .engine import CopyEngine
from .schedule import BACKWARD_START, ExecSchedule, SwapSpec
from .slab import ALIGN, HostSlab, Region, align_up

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class SwapStats:
    """Counters of one executor, over all steps."""

    steps: int = 0  # steps begun
    offloaded: int = 0  # tensors swapped out
    offloaded_bytes: int = 0  # device bytes swapped out
    link_bytes: int = 0  # bytes over the host link, both ways (compressed sizes)
    prefetched: int = 0  # prefetches issued at their trigger
    late_prefetches: int = 0  # prefetches issued only at unpack (trigger missed)
    kept_nondense: int = 0  # planned tensors kept because their layout is not dense
    diverged_steps: int = 0  # steps whose packs disagreed with the trace
    compressed: int = 0  # tensors sent compressed


@dataclass(eq=False, kw_only=True)
class _Entry:
    """One offloaded tensor of one step."""

    spec: SwapSpec
    shape: torch.Size
    stride: tuple
    dtype: torch.dtype
    device: torch.device
    numel: int
    region: Region | None = None  # host copy (set by the d2h job)
    packed: dict = field(default_factory=dict)  # compressed layout: bits/values sizes, nnz
    d2h: object = None  # ticket of the swap-out
    h2d: object = None  # ticket of the prefetch
    dev: torch.Tensor | None = None  # device tensor once prefetched
    refs: int = 0  # live handles


class _Handle:
    """What autograd stores instead of an offloaded tensor."""

    __slots__ = ("entry", "owner", "__weakref__")

    def __init__(self, entry: _Entry, owner: "SwapExecutor"):
        self.entry = entry
        self.owner = owner
        entry.refs += 1

    def __del__(self):
        self.owner._drop(self.entry)


class SwapExecutor:
    """Pack/unpack hooks driven by an ExecSchedule.

    Args:
        schedule: the run-time schedule.
        engine: the copy engine (lanes for copies).
        slab: the host slab.
        observer: called as `observer(storage id, tensor)` at every pack that matches the
            trace (the storage swap executor finds activations that way).
    """

    def __init__(self, schedule: ExecSchedule, engine: CopyEngine, slab: HostSlab, observer=None):
        self.schedule = schedule
        self.observer = observer
        self.engine = engine
        self.slab = slab
        self.stats = SwapStats()
        self._lock = threading.Lock()
        self._by_trigger: dict = {}
        for spec in schedule.swaps.values():
            self._by_trigger.setdefault(spec.trigger, []).append(spec.storage)
        self._reset()

    def _reset(self) -> None:
        self._k = 0
        self._entries: dict = {}  # (sid, offset, shape, stride) -> _Entry
        self._by_sid: dict = {}  # sid -> [_Entry]
        self._diverged = False
        self._started_backward = False

    # --- step boundaries ------------------------------------------------------------------

    def begin_step(self) -> None:
        """Start counting packs from zero (call at the start of every iteration)."""
        self.end_step()
        self._reset()
        self.stats.steps += 1

    def end_step(self) -> None:
        """Check the step saw the packs the trace promised."""
        if self.stats.steps and not self._diverged and self._k not in (0, len(self.schedule.pack_sids)):
            log.warning("step saw %d saved-tensor packs, the trace %d: swaps in it may have been skipped",
                        self._k, len(self.schedule.pack_sids))

    # --- hooks ----------------------------------------------------------------------------

    def pack(self, t: torch.Tensor):
        """saved_tensors_hooks pack: offload if planned, else keep the tensor."""
        k = self._k
        self._k += 1
        if self._diverged:
            return t
        if k >= len(self.schedule.pack_sids):
            return self._diverge(f"more packs than the trace's {len(self.schedule.pack_sids)}", t)
        sid = self.schedule.pack_sids[k]
        if self.observer is not None:
            self.observer(sid, t)
        spec = self.schedule.swaps.get(sid)
        if spec is None:
            return t
        if isinstance(t, torch.nn.Parameter) or t.untyped_storage().nbytes() != spec.nbytes:
            return self._diverge(f"pack {k} is not the trace's storage {spec.storage}", t)
        if t.numel() == 0 or not _is_dense(t):
            self.stats.kept_nondense += 1
            return t
        key = (spec.storage, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._offload(t, spec)
            self._entries[key] = entry
            self._by_sid.setdefault(spec.storage, []).append(entry)
        return _Handle(entry, self)

    def unpack(self, packed):
        """saved_tensors_hooks unpack: wait for (or, if late, issue) the prefetch."""
        if not isinstance(packed, _Handle):
            return packed
        self.backward_started()
        entry = packed.entry
        if entry.dev is None:
            self.stats.late_prefetches += 1
            self._prefetch(entry)
        self.engine.wait(entry.h2d)
        return entry.dev

    def fire(self, key) -> None:
        """A trigger point was reached: prefetch every storage planned there."""
        for sid in self._by_trigger.get(key, ()):
            for entry in self._by_sid.get(sid, ()):
                if entry.dev is None:
                    self.stats.prefetched += 1
                    self._prefetch(entry)

    def backward_started(self) -> None:
        """Issue the prefetches planned for the very start of the backward pass."""
        if not self._started_backward:
            self._started_backward = True
            self.fire(BACKWARD_START)

    # --- copies ---------------------------------------------------------------------------

    def _offload(self, t: torch.Tensor, spec: SwapSpec) -> _Entry:
        src = t.detach()
        entry = _Entry(spec=spec, shape=src.shape, stride=src.stride(), dtype=src.dtype, device=src.device,
                       numel=src.numel())
        flat = src.as_strided((src.numel(),), (1,), src.storage_offset())  # dense: the raw span
        use_zvc = spec.compress_ratio is not None and compressible(src)

        def job():
            packed = compress(flat) if use_zvc else None
            raw = flat.numel() * flat.element_size()
            if packed is not None and align_up(packed.bits.numel()) + packed.nbytes - packed.bits.numel() < raw:
                self._store_compressed(entry, packed)
            else:  # not worth it (dense tensor, or too small for the aligned layout): send raw
                nbytes = flat.numel() * flat.element_size()
                entry.region = self.slab.take(nbytes)
                entry.region.data[:nbytes].view(flat.dtype).copy_(flat, non_blocking=True)
                entry.packed = {"nbytes": nbytes}
            with self._lock:
                self.stats.link_bytes += entry.packed["nbytes"]

        entry.d2h = self.engine.submit("d2h", job, keep=(src,))
        if spec.sync:
            self.engine.wait(entry.d2h)
        nbytes = src.numel() * src.element_size()
        with self._lock:
            self.stats.offloaded += 1
            self.stats.offloaded_bytes += nbytes
        return entry

    def _store_compressed(self, entry: _Entry, c: Compressed) -> None:
        bits_at = align_up(c.bits.numel(), ALIGN)
        values_bytes = c.values.numel() * c.values.element_size()
        entry.region = self.slab.take(bits_at + values_bytes)
        data = entry.region.data
        data[: c.bits.numel()].copy_(c.bits, non_blocking=True)
        if values_bytes:
            data[bits_at: bits_at + values_bytes].view(c.values.dtype).copy_(c.values, non_blocking=True)
        entry.packed = {"bits": c.bits.numel(), "bits_at": bits_at, "nnz": c.values.numel(),
                        "values_dtype": c.values.dtype, "nbytes": c.nbytes}
        with self._lock:
            self.stats.compressed += 1
            self.stats.link_bytes += c.nbytes

    def _prefetch(self, entry: _Entry) -> None:
        dev = torch.empty_strided(entry.shape, entry.stride, dtype=entry.dtype, device=entry.device)
        flat = dev.as_strided((entry.numel,), (1,), 0)

        def job():
            data = entry.region.data
            p = entry.packed
            if "bits" in p:
                width = torch.empty((), dtype=p["values_dtype"]).element_size()
                bits = data[: p["bits"]].to(entry.device, non_blocking=True)
                values = data[p["bits_at"]: p["bits_at"] + p["nnz"] * width].view(p["values_dtype"])
                decompress(Compressed(bits=bits, values=values.to(entry.device, non_blocking=True),
                                      numel=entry.numel), flat)
            else:
                flat.copy_(data[: p["nbytes"]].view(entry.dtype), non_blocking=True)
            with self._lock:
                self.stats.link_bytes += p["nbytes"]

        entry.h2d = self.engine.submit("h2d", job, keep=(dev,), after=entry.d2h)
        entry.dev = dev

    def _drop(self, entry: _Entry) -> None:
        entry.refs -= 1
        if entry.refs == 0:
            entry.dev = None
            if entry.region is None and entry.d2h is not None:
                self.engine.wait(entry.d2h)  # CPU: the job may not have taken its region yet
            if entry.region is not None:
                self.slab.give_back(entry.region)
                entry.region = None

    def _diverge(self, why: str, t=None):
        if not self._diverged:
            self._diverged = True
            self.stats.diverged_steps += 1
            log.warning("step diverged from the planned trace (%s): the rest of it runs unplanned", why)
        return t


def _is_dense(t: torch.Tensor) -> bool:
    """True when `t`'s elements fill one gap-free span of memory (any dimension order)."""
    expected = 1
    for d in sorted(range(t.dim()), key=lambda d: (t.stride(d), t.size(d))):
        if t.size(d) != 1 and t.stride(d) != expected:
            return False
        expected *= t.size(d)
    return True
