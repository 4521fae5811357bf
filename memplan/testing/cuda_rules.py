"""CUDA's rules on the CPU: a stand-in for `torch.cuda` that fails where a GPU would fail or race.

The executor's GPU code (memplan.exec.engine's CudaCopyEngine, memplan.exec.graphed) takes its CUDA
runtime as an argument; given a `CudaRules`, it runs on CPU tensors while every stream, event,
capture and allocator operation is checked as CUDA checks it (the CUDA programming guide, "Stream
Capture"; PyTorch's CUDAGraph.cpp and CUDACachingAllocator.cpp). A broken rule raises
`CudaRuleError` at the call a GPU would reject, or at the access a GPU would race on:

 1. Capture isolation: a stream being captured waits only on events recorded in the same capture
    (cudaErrorStreamCaptureIsolation); a stream that waits on a captured event joins the capture.
 2. A capture ends with every stream that joined it joined back to its origin stream
    (cudaErrorStreamCaptureUnjoined), on a side stream, never the default one.
 3. No host synchronization during a capture (a device, stream or event synchronize, an event
    query, an op whose result the host reads: `.item()`, `nonzero`, a boolean-mask index).
 4. No allocation during a capture on a stream outside it (it would not come from the graph's pool).
 5. Ordering: a stream reads or writes bytes another stream wrote (or writes bytes another read)
    only after waiting for that work (an event, `wait_stream`, or a host synchronize): a copy's
    result is used only after its event is waited on.
 6. Cross-stream reuse: a freed block goes back to its allocation stream's pool at once; that
    stream's next allocation (which could be handed the block) comes after every access of other
    streams to it (an event, a host synchronize) unless they were recorded with `record_stream`.
 7. A failed capture (one whose rules broke) ends in error and leaves the allocator routing to its
    pool (`captures_underway`), as CUDAGraph::capture_end does when cudaStreamEndCapture fails; only
    `_cuda_endAllocateToPool` and `_cuda_releasePool` end that.
 8. A replay needs a captured graph, and every block it uses from outside its pool still alive
    where the capture saw it; its accesses count as the replaying stream's.

Ops run at once on the CPU: the stand-in checks the order work was declared in, not its timing.
A replay re-runs nothing (no kernels were recorded): it checks and counts. What only a GPU shows
is on the docs' GPU page (docs/cuda-graphs.md, "What the CPU checks").

    rules = CudaRules()
    with rules:                       # watches every op's reads and writes
        engine = CudaCopyEngine("cpu", cuda=rules)
        ...
"""

from __future__ import annotations

import contextlib
import itertools
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .cuda_blocks import Access, Block, extent, host_read, roles
from .cuda_streams import CUDAGraph, Capture, CudaRuleError, Event, Stream

__all__ = ["CUDAGraph", "CudaRuleError", "CudaRules", "Event", "Stream"]

MATMULS = ("aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten._addmm_activation")  # make a cuBLAS workspace


class CudaRules(TorchDispatchMode):
    """The stand-in CUDA runtime (see the module docstring): `torch.cuda`'s names that memplan uses,
    and, entered as a dispatch mode, the watcher of every op's reads and writes."""

    def __init__(self):
        super().__init__()
        self.streams: list[Stream] = []
        self.default = Stream(self, "default")
        self.current = self.default
        self.host: dict[Stream, int] = {}  # work the host has waited for
        self.blocks: dict[int, Block] = {}  # storage address -> its block
        self.watched: set[int] = set()  # blocks whose free or refill matters (used across streams, or empty)
        self.unordered: dict[Stream, list[Access]] = {}  # per stream, accesses to blocks it freed not yet ordered
        self.capturing: Capture | None = None  # the capture underway (one at a time, as in PyTorch)
        self.captures_underway: list[tuple] = []  # pools the allocator routes a capture's requests to
        self.released_pools: list[tuple] = []
        self.host_syncs: list[str] = []  # what made the host wait, in order
        self.workspaces: set[tuple] = set()  # (thread, stream) pairs holding a cuBLAS workspace
        self.default_generators = ()
        self._names = itertools.count(1)
        self._pools = itertools.count(1)
        self._sweep_at = 1024  # blocks kept before the dead ones are dropped
        self.memory = self  # torch.cuda.memory's private calls live here too

    # --- torch.cuda's names --------------------------------------------------------------------

    def Stream(self, device=None, priority: int = 0) -> Stream:  # noqa: N802 - torch.cuda's name
        return Stream(self, f"side{next(self._names)}")

    def Event(self, **kwargs) -> Event:  # noqa: N802 - torch.cuda's name
        return Event(self, **kwargs)

    def CUDAGraph(self) -> CUDAGraph:  # noqa: N802 - torch.cuda's name
        return CUDAGraph(self)

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def current_stream(self, device=None) -> Stream:
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: Stream):
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def synchronize(self, device=None) -> None:
        self._host_sync("device synchronize", {s: s.seq for s in self.streams})

    def is_current_stream_capturing(self) -> bool:
        return self.current.capture is not None

    def graph_pool_handle(self) -> tuple:
        return (0, next(self._pools))

    @contextlib.contextmanager
    def graph(self, cuda_graph: CUDAGraph, pool: tuple | None = None, stream: Stream | None = None,
              capture_error_mode: str = "global"):
        """torch.cuda.graph: synchronize, empty the cache, capture on `stream` (a side stream)."""
        self.synchronize()
        self.empty_cache()
        with self.stream(stream if stream is not None else self.Stream()):
            cuda_graph.capture_begin(pool, capture_error_mode)
            try:
                yield
            finally:
                cuda_graph.capture_end()

    def empty_cache(self) -> None:
        pass

    def reset_peak_memory_stats(self, device=None) -> None:
        pass

    def max_memory_allocated(self, device=None) -> int:
        return 0

    def max_memory_reserved(self, device=None) -> int:
        return 0

    def record_stream(self, tensor: torch.Tensor, stream: Stream) -> None:
        """`tensor.record_stream(stream)`: its block is not reused before `stream`'s work so far."""
        self._block(tensor.untyped_storage(), self.current).recorded.add(stream)

    # torch._C's private calls the executor makes (memplan.exec.graphed)
    def _cuda_endAllocateToPool(self, device: int, pool: tuple) -> None:  # noqa: N802 - torch's name
        if pool not in self.captures_underway:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.captures_underway.remove(pool)

    def _cuda_releasePool(self, device: int, pool: tuple) -> None:  # noqa: N802 - torch's name
        self.released_pools.append(pool)

    def _cuda_clearCublasWorkspaces(self) -> None:  # noqa: N802 - torch's name
        self.workspaces.clear()

    # --- streams, events, captures --------------------------------------------------------------

    def _tick(self, stream: Stream) -> int:
        """One more piece of work on `stream`, after everything the host has waited for."""
        for s, n in self.host.items():
            if stream.clock.get(s, 0) < n:
                stream.clock[s] = n
        stream.seq += 1
        return stream.seq

    def _record(self, event: Event, stream: Stream) -> None:
        self._poll()
        event.marks = stream._upto()
        event.capture = stream.capture

    def _wait(self, stream: Stream, event: Event) -> None:
        self._poll()
        if event.marks is None:
            return  # never recorded: CUDA treats it as complete
        if stream.capture is not None and event.capture is not stream.capture:
            self._break(stream.capture, f"stream {stream.name} is being captured and waits on an event recorded "
                                        f"outside the capture (cudaErrorStreamCaptureIsolation)")
        if stream.capture is None and event.capture is not None:
            stream.capture = event.capture  # a fork: the stream joins the capture
            event.capture.streams.add(stream)
        self._tick(stream)
        for s, n in event.marks.items():
            if stream.clock.get(s, 0) < n:
                stream.clock[s] = n

    def _no_capture(self, what: str, capture: Capture | None = None) -> None:
        """Rule 3: the host neither waits for nor asks about work while a capture is underway."""
        self._poll()
        underway = capture or self.capturing
        if underway is not None:
            self._break(underway, f"{what} while a stream is being captured: the host cannot wait for captured "
                                  f"work (operation not permitted when stream is capturing)")

    def _host_sync(self, what: str, marks: dict, capture: Capture | None = None) -> None:
        """The host waits for the work `marks` names: every later piece of work comes after it."""
        self._no_capture(what, capture)
        self.host_syncs.append(what)
        for s, n in marks.items():
            if self.host.get(s, 0) < n:
                self.host[s] = n

    def _break(self, capture: Capture, why: str) -> None:
        capture.broken = capture.broken or why
        raise CudaRuleError(why)

    def _begin_capture(self, pool: tuple | None) -> Capture:
        stream = self.current
        if stream is self.default:
            raise CudaRuleError("CUDA graphs must be captured on a non-default stream.")
        capture = Capture(origin=stream, pool=pool if pool is not None else self.graph_pool_handle())
        capture.streams.add(stream)
        stream.capture = self.capturing = capture
        self.captures_underway.append(capture.pool)
        return capture

    def _end_capture(self, capture: Capture) -> None:
        self._poll()
        origin = capture.origin
        if self.current is not origin:
            raise CudaRuleError("Capture must end on the same stream it began on.")
        unjoined = [s.name for s in capture.streams if s is not origin and origin.clock.get(s, 0) < s.seq]
        for s in capture.streams:
            s.capture = None
        self.capturing = None
        for block in self.blocks.values():
            block.uncapture(capture)  # captured work runs only when replayed
        if unjoined and not capture.broken:
            capture.broken = (f"the capture ended with stream {', '.join(sorted(unjoined))} not joined back to "
                              f"its origin (cudaErrorStreamCaptureUnjoined)")
            raise CudaRuleError(capture.broken)
        if capture.broken:  # as CUDAGraph::capture_end: the error comes before the allocator leaves the pool
            raise CudaRuleError("operation failed due to a previous error during capture")
        self.captures_underway.remove(capture.pool)

    def _replay(self, capture: Capture) -> None:
        for handle, ptr in capture.outside.values():
            if torch.UntypedStorage._expired(handle) or torch.UntypedStorage._new_with_weak_ptr(handle).data_ptr() != ptr:
                raise CudaRuleError("the replay uses a block the capture took from outside its pool, freed or moved "
                                    "since (an illegal address on a GPU)")
        stream = self.current
        seq = self._tick(stream)
        for handle, lo, hi, write in capture.accesses.values():
            if not torch.UntypedStorage._expired(handle):
                self._touch(torch.UntypedStorage._new_with_weak_ptr(handle), lo, hi, write, stream, seq)

    # --- blocks: allocation, access, free --------------------------------------------------------

    def _block(self, storage: torch.UntypedStorage, stream: Stream, fresh: bool = False) -> Block:
        """The block of `storage` (`fresh`: an op's new output, an allocation on `stream`)."""
        key = storage._cdata
        block = self.blocks.get(key)
        if block is None or block.dead():  # a new storage (perhaps at a dead one's address)
            if block is not None:
                self._drop(key)
            if len(self.blocks) >= self._sweep_at:
                self._sweep()
            block = self.blocks[key] = Block(storage, stream if fresh else self.default)  # older: the default's
            if fresh:
                self._allocated(block, stream)
        return block

    def _new(self, t: torch.Tensor) -> bool:
        block = self.blocks.get(t.untyped_storage()._cdata)
        return block is None or block.dead()

    def _drop(self, key: int) -> None:
        block = self.blocks.pop(key)
        self.watched.discard(key)
        self._freed(block)
        block.forget()

    def _sweep(self) -> None:
        for key in [k for k, b in self.blocks.items() if b.dead()]:
            self._drop(key)
        self._sweep_at = max(1024, 2 * len(self.blocks))

    def _allocated(self, block: Block, stream: Stream) -> None:
        """`block` got device memory on `stream` (new, or refilled after a free)."""
        self._reuse(stream)
        block.stream, block.pool = stream, None
        if stream.capture is not None:
            block.pool = stream.capture.pool
        elif self.capturing is not None and block.nbytes:
            self._break(self.capturing, f"an allocation on stream {stream.name}, outside the capture, while a stream is "
                                  f"being captured: it would not come from the graph's pool")

    def _touch(self, storage, lo: int, hi: int, write: bool, stream: Stream, seq: int, fresh: bool = False) -> None:
        block = self._block(storage, stream, fresh)
        if lo == hi:
            return
        for a in block.overlapping(lo, hi):
            if a.stream is not stream and (write or a.write) and stream.clock.get(a.stream, 0) < a.seq:
                raise CudaRuleError(
                    f"stream {stream.name} {'writes' if write else 'reads'} bytes stream {a.stream.name} "
                    f"{'wrote' if a.write else 'reads'} without waiting for that work (an event or wait_stream): "
                    f"a GPU would race")
        block.add(Access(lo, hi, stream, seq, write, stream.capture))
        if stream is not block.stream:
            self.watched.add(storage._cdata)
        capture, key = stream.capture, storage._cdata
        if capture is not None and block.pool != capture.pool:
            if key not in capture.outside:
                capture.outside[key] = (storage._weak_ref(), storage.data_ptr())
            capture.accesses.setdefault((key, lo, hi, write), (capture.outside[key][0], lo, hi, write))

    def _poll(self) -> None:
        """Frees and refills of watched blocks since the last look (storages resized by the executor)."""
        for key in list(self.watched):
            block = self.blocks[key]
            if block.dead():
                self._drop(key)
                continue
            now = block.storage().nbytes()
            if now == 0 and block.nbytes:
                self._freed(block)
            elif now and not block.nbytes:
                block.nbytes = now
                self._allocated(block, self.current)

    def _freed(self, block: Block) -> None:
        """Rule 6: a free returns the block to its allocation stream's pool at once; accesses of other streams
        not ordered before that stream's work (nor recorded with record_stream) must be before its next
        allocation, which could be handed this block."""
        home = block.stream
        late = [a for a in block.accesses if a.stream is not home and a.stream not in block.recorded
                and not self._ordered(home, a)]
        self.unordered.setdefault(home, []).extend(late)
        block.accesses, block.recorded, block.nbytes = [], set(), 0

    def _ordered(self, stream: Stream, access: Access) -> bool:
        return max(stream.clock.get(access.stream, 0), self.host.get(access.stream, 0)) >= access.seq

    def _reuse(self, stream: Stream) -> None:
        """Rule 6: `stream` allocates: no block it freed may still be under another stream's access."""
        late = [a for a in self.unordered.pop(stream, ()) if not self._ordered(stream, a)]
        if late:
            raise CudaRuleError(
                f"stream {stream.name} allocates while a block it freed may still be "
                f"{'written' if late[0].write else 'read'} by stream {late[0].stream.name} (no event waited on, no "
                f"record_stream): the caching allocator can hand that block out under the access")

    # --- the dispatch mode -----------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._poll()
        stream = self.current
        name = str(func)
        if host_read(name, args):
            self._host_sync(f"{name} reads a device value on the host", stream._upto())
        read, written = roles(func, args, kwargs)
        out = func(*args, **kwargs)
        seq = self._tick(stream)
        if name.startswith(MATMULS):
            self.workspaces.add((threading.get_ident(), stream))
        for t in read:
            self._touch(t.untyped_storage(), *extent(t), False, stream, seq)
        for t in written:
            self._touch(t.untyped_storage(), *extent(t), True, stream, seq)
        for t in _tensors(out):
            if self._new(t):
                self._touch(t.untyped_storage(), *extent(t), True, stream, seq, fresh=True)
        return out


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
