"""One planned step captured as a CUDA graph, then replayed: no host work per op.

PyTorch's whole-network capture (its "CUDA Graphs" notes; torch/cuda/graphs.py) with the plan
inside it. Warm-up steps run eagerly under the plan's executor (hooked or interpreted) on a
side stream; then one step, forward, backward, optimizer step and every action of the step
program (swap-outs and prefetches as copies on the copy lanes into the pinned host slab,
joined with events; releases; recomputations), is captured with `torch.cuda.graph` on that
stream, into the graph's own memory pool. Each later step copies its batch into the static
inputs and replays the graph; its outputs (the loss) are read back after the replay, as
copies. memplan.exec.graph_schedule says, as data, what the graph holds.

NOTE what the capture relies on (cited as "rule N"):
 1. Warm-up and capture run on a side stream, never the default one; lazily made state
    (cuBLAS handles, the optimizer's state, autograd's streams) exists before the capture.
 2. Everything a replay reads from the host is pinned and allocated before the capture: the
    host slab (memplan.exec.runtime) and the static inputs (device copies of the batch).
 3. No host wait inside the capture: a release waits for its swap-out's event on the device
    (memplan.exec.engine, rule 5), and `CaptureEngine` never queries an event recorded in a
    capture nor blocks on one. No stream in the capture waits on an event recorded outside it
    (CUDA forbids it): a ticket from before the capture (an earlier step's swap-out, a lane
    that never joined) is not waited on, and need not be: its copy is done, since the capture
    begins after a device synchronize and each replay is launched behind the work that wrote
    it. Every lane that joined the capture is joined back to the capture stream before it
    ends, so a replay's copies are done before the stream's next work, and an eager step
    after it (a refused call) waits for no event recorded in the capture: their tickets are
    dropped.
 4. Memory: what the step allocates during the capture comes from the graph's private pool
    (or, under the pool allocator, the plan's arena); a block freed during the capture serves
    later requests of the same capture, so the pool holds the step's peak. torch.cuda.graph
    empties the allocator's cache before the capture begins. cuBLAS holds a workspace per
    (handle, stream): those of the streams used before the first warm-up (op timing, eager
    steps) are released then, so the step holds its side stream's only, as its trace counts
    them (memplan.cost.device_memory). A replay allocates
    nothing and uses the same addresses: storages the program frees and allocates again are
    at the addresses of the capture in every replay.
 5. RNG: the default CUDA generator is graph-safe: a replay advances its offset by what the
    captured step drew, so replay k draws what eager step k would. The hooked executor's
    region runs set the generator's state back inside the capture, which PyTorch allows
    while the seed is unchanged (torch.cuda.get/set_rng_state under capture, torch >= 2.10; on an
    older torch memplan.exec.capturable refuses a plan whose recomputations set it).
 6. The optimizer's step is captured: its state lives on the device (memplan.exec.capturable).
 7. A replay overwrites the captured outputs: the caller gets copies.
 8. Nothing recorded in a failed capture ran, but storages the program frees were freed: a
    failed capture restores the persistent storages the program moves (from copies taken
    before it, or for those kept on the host between steps from their host copies), forgets
    the step's other storages, and the step runs eagerly.
 9. A failed capture leaves no capture behind: when the capture broke, CUDAGraph::capture_end
    raises before it tells the allocator the capture ended, so the allocator would keep
    routing to the graph's pool (its memory reserved, frees deferred); the capture uses a pool
    of its own (`graph_pool_handle`), whose routing is ended and which is released, and the
    generator leaves capture mode.
 10. Only a captured step that kept its plan is replayed: one that diverged or left planned
    actions undone is dropped as a failed capture is (rule 8), since every replay would repeat it.
 11. A replay needs the runtime it was captured with: after close() (the slab released, the
    storages back at other addresses) a call is an error and the graph is released.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

from .engine import CudaCopyEngine
from .hostcopy import load
from .owners import resolve_owner
from .residency import Residency
from .storage_views import byte_view

log = logging.getLogger(__name__)

WARMUP_STEPS = 3  # eager steps before the capture (PyTorch's whole-network example warms up 3)


class CaptureEngine(CudaCopyEngine):
    """CUDA copy lanes a capture can hold (rule 3); outside a capture, a CudaCopyEngine."""

    def __init__(self, device=None, cuda=torch.cuda):
        super().__init__(device, cuda)
        self._captured: dict[int, object] = {}  # the tickets recorded in the capture underway, by id
        self._joined: set[str] = set()  # lanes that joined it

    def submit(self, lane, fn, *, after=None):
        if not self.capturing():
            return super().submit(lane, fn, after=after)
        ticket = super().submit(lane, fn, after=self._in_capture(after))  # the lane joins the capture
        self._joined.add(lane)
        self._captured[id(ticket)] = ticket  # held: no other ticket takes its id during the capture
        return ticket

    def wait(self, ticket) -> None:
        super().wait(self._in_capture(ticket) if self.capturing() else ticket)

    def _in_capture(self, ticket):
        """`ticket` if the capture underway recorded it; None for one recorded before it, which a capturing
        stream may not wait on and need not: its copy is done (rule 3)."""
        return ticket if ticket is not None and id(ticket) in self._captured else None

    def begin_capture(self) -> None:
        """A capture begins: no ticket is its yet, no lane has joined it."""
        self._captured.clear()
        self._joined.clear()

    def capturing(self) -> bool:
        """True while the current stream is being captured."""
        return self.cuda.is_available() and self.cuda.is_current_stream_capturing()

    def done(self, ticket) -> bool:
        return True if self.capturing() else super().done(ticket)  # querying a captured event is an error

    def sync(self, ticket) -> None:
        if self.capturing():
            self.wait(ticket)  # the device orders it: the host cannot wait for a captured copy
        else:
            super().sync(ticket)

    def drain(self) -> None:
        if self.capturing():
            self.join()
        else:
            super().drain()

    def join(self) -> None:
        """Make the compute stream wait for every lane that joined the capture (a capture ends only with
        its streams joined; one that never joined it must not be waited on inside it)."""
        current = self.cuda.current_stream(self.device)
        for lane in sorted(self._joined):
            current.wait_stream(self._streams[lane])
        self._joined.clear()


class GraphedStep:
    """Warm up, capture and replay one planned step (see the module docstring).

    Args:
        run_step: runs one eager planned step on the given inputs (its runtime installed) and
            returns the step's outputs.
        runtime: the PlanRuntime the step runs (its copy engine a CaptureEngine).
        device: the CUDA device.
    """

    def __init__(self, run_step: Callable[[tuple], Any], runtime, device: torch.device | str):
        self.run_step = run_step
        self.runtime = runtime
        self.cuda = runtime.engine.cuda  # torch.cuda, or the CPU stand-in that checks its rules
        self.device = torch.device(device)
        self.stream = self.cuda.Stream(self.device)  # warm-up and capture (rule 1)
        self.graph = None  # the CUDAGraph, once captured
        self.static = None  # the captured inputs (rule 2)
        self.outputs = None  # the captured outputs (rule 7)
        self.constants: list = []  # the captured inputs' other values (a graph replays them as captured)
        self.warmed = 0
        self.replays = 0
        self.memory: dict = {}  # "capture" and "replays": allocator peaks

    def warm_up(self, inputs: tuple):
        """One eager step on the side stream (rule 1); before the first, the cuBLAS workspaces of the
        streams used so far go (rule 4)."""
        if self.warmed == 0:
            _clear_cublas_workspaces(self.cuda)
        current = self.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with self.cuda.stream(self.stream):
            out = self.run_step(inputs)
        current.wait_stream(self.stream)
        self.warmed += 1
        return out

    def capture(self, inputs: tuple) -> str:
        """Capture the step with `inputs` as its static inputs; "" when captured, else why not (one line)."""
        self.static = tree_map_only(torch.Tensor, _static_copy, inputs)  # rule 2
        self.constants = constants_of(inputs)
        backup = _backup(self.runtime)
        graph, pool = self.cuda.CUDAGraph(), self.cuda.graph_pool_handle()  # a pool of its own (rule 9)
        self.cuda.synchronize(self.device)
        _reset_peaks(self.cuda, self.device)
        self.runtime.engine.begin_capture()
        try:
            with self.cuda.graph(graph, pool=pool, stream=self.stream):
                outputs = self.run_step(self.static)
                self.runtime.engine.join()  # rule 3
        except Exception as exc:  # noqa: BLE001 - a capture that fails leaves the step eager, said in one line
            self._abandon(backup, pool, broken=True)
            return f"the capture failed: {_first_error(exc)}"
        for entry in self.runtime.runner.entries.values():
            entry.d2h = entry.h2d = None  # events recorded in a capture serve no wait outside it (rule 3)
        left = _left_plan(self.runtime.steps[-1])
        if left:  # rule 10
            graph.reset()
            self._abandon(backup, pool)
            return f"the captured step left its plan ({left})"
        self.graph, self.outputs = graph, outputs
        self.memory["capture"] = _peaks(self.cuda, self.device)
        self.cuda.empty_cache()  # blocks the warm-up cached and the capture freed outside its pool
        _reset_peaks(self.cuda, self.device)
        return ""

    def _abandon(self, backup: list, pool, broken: bool = False) -> None:
        """Nothing of a capture stays: the moved storages as they were (rule 8), no allocator routing to its
        pool nor the pool itself, and (`broken`: a capture that failed) the generator out of capture (rule 9)."""
        _recover(self.runtime, backup)
        if broken:
            _release_generator(self.cuda, self.device)
        _leave_pool(self.cuda, self.device, pool)
        self.cuda.empty_cache()

    def release(self) -> None:
        """Drop the graph and its pool (rule 11)."""
        if self.graph is not None:
            self.graph.reset()
            self.graph = None

    def replay(self, inputs: tuple):
        """Copy `inputs` into the static inputs, replay the step, return copies of its outputs (rule 7)."""
        for static, x in zip(tree_leaves(self.static), tree_leaves(inputs)):
            if isinstance(static, torch.Tensor) and static is not x:
                static.copy_(x, non_blocking=True)
        if self.runtime.program.start_away:
            self.runtime.settle()  # storages brought back between steps (a state_dict) go to the host again
        self.graph.replay()
        self.replays += 1
        peaks = _peaks(self.cuda, self.device)
        self.memory["replays"] = {k: _larger(v, self.memory.get("replays", {}).get(k)) for k, v in peaks.items()}
        return tree_map_only(torch.Tensor, lambda t: t.detach().clone(), self.outputs)

    def report(self) -> dict:
        """JSON-ready: warm-up steps, replays and the allocator's peaks at the capture and over the replays."""
        return {"warmup_steps": self.warmed, "replays": self.replays, "memory": dict(self.memory)}


def constants_of(inputs: tuple) -> list:
    """The inputs' values that are not tensors (a graph holds them as captured)."""
    return [x for x in tree_leaves(inputs) if not isinstance(x, torch.Tensor)]


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


def _backup(runtime) -> list:
    """Host copies of the persistent storages the program moves that are on the device now (rule 8)."""
    runner, out = runtime.runner, []
    for sid, entry in runner.entries.items():
        if runtime.trace.storages[sid].persistent and entry.state == Residency.RESIDENT:
            storage = runner.finder.owned(entry)
            if storage is not None:
                out.append((entry, byte_view(storage).to("cpu", copy=True)))
    return out


def _recover(runtime, backup: list) -> None:
    """After a failed capture: persistent storages back as they were, the step's others forgotten (rule 8)."""
    _synchronize(runtime)
    runner, program = runtime.runner, runtime.program
    saved = {entry.sid: host for entry, host in backup}
    away_at_start = {program.decisions[k].storage for k in program.start_away}
    for sid, entry in runner.entries.items():
        source = saved.get(sid, entry.host_copy if sid in away_at_start else None)
        owner = runner.finder.owners.get(sid)
        t = resolve_owner(owner, runtime.model, runtime.optimizer) if owner is not None else None
        if source is not None and t is not None:
            storage = t.untyped_storage()
            storage.resize_(entry.real_nbytes)
            with torch.no_grad():
                if isinstance(source, torch.Tensor):
                    byte_view(storage).copy_(source)
                else:
                    load(byte_view(storage), source)
        entry.state, entry.storage, entry.d2h, entry.h2d = Residency.RESIDENT, None, None, None
    runner.away.clear()
    _synchronize(runtime)
    runtime.settle()  # the storages kept on the host between steps go back there


def _first_error(exc: BaseException) -> str:
    """The error that broke a capture, in one line: the first of the chain (ending the capture then
    fails only "due to a previous error"), naming the last when it differs."""
    first = exc
    while first.__context__ is not None and first.__context__ is not first:
        first = first.__context__

    def line(e: BaseException) -> str:
        text = str(e).strip().splitlines()
        return f"{type(e).__name__}: {text[0] if text else ''}"

    return line(first) if first is exc else f"{line(first)} (then {line(exc)})"


def _clear_cublas_workspaces(cuda) -> None:
    """Release cuBLAS's workspaces (torch._C's call; the CPU stand-in keeps its own; rule 4)."""
    clear = getattr(cuda, "_cuda_clearCublasWorkspaces", None) or getattr(torch._C, "_cuda_clearCublasWorkspaces",
                                                                           None)
    if clear is not None:
        clear()


def _left_plan(record: dict) -> str:
    """How a step's record says it left its plan ("" if it kept it)."""
    if record.get("diverged"):
        return "it diverged"
    if record.get("unresolved"):
        return f"{record['unresolved']} planned actions found no storage"
    return ""


def _leave_pool(cuda, device: torch.device, pool) -> None:
    """After a failed capture: if the allocator still routes to the capture's `pool` (capture_end raised
    before telling it), end that and release the pool (rule 9); else the dropped graph releases it."""
    memory = cuda.memory
    end = getattr(memory, "_cuda_endAllocateToPool", None) or getattr(memory, "_cuda_endAllocateCurrentStreamToPool",
                                                                      None)  # its name before torch 2.6
    if end is None:
        log.warning("after the failed capture the allocator's routing to its pool could not be ended (torch %s)",
                    torch.__version__)
        return
    index = cuda.current_device() if device.index is None else device.index
    try:
        end(index, pool)
    except RuntimeError:  # "not currently recording to mempool_id": the capture ended
        return
    memory._cuda_releasePool(index, pool)


def _release_generator(cuda, device: torch.device) -> None:
    """A capture that fails leaves the device's default generator in capture mode (PyTorch ends that mode
    only when a capture ends well): every later random op outside a capture would fail ("Offset
    increment outside graph capture"). A fresh copy of its state is out of capture mode."""
    if not cuda.default_generators:  # the CPU stand-in: the CPU generator takes no part in a capture
        return
    generator = cuda.default_generators[cuda.current_device() if device.index is None else device.index]
    try:
        generator.graphsafe_set_state(generator.clone_state())
    except RuntimeError as exc:  # a torch without graph-safe generator states
        log.warning("after the failed capture the CUDA generator could not be reset: %s", exc)


def _synchronize(runtime) -> None:
    """Wait for the runtime's device (a runtime without CUDA lanes: nothing to wait for)."""
    cuda = getattr(runtime.engine, "cuda", None)
    if cuda is not None:
        cuda.synchronize(runtime.engine.device)


def _reset_peaks(cuda, device: torch.device) -> None:
    try:
        cuda.reset_peak_memory_stats(device)
    except RuntimeError:  # a pluggable allocator (the pool) keeps no statistics
        pass


def _peaks(cuda, device: torch.device) -> dict:
    """The allocator's peaks since the last reset (None under a pluggable allocator, which has none)."""
    try:
        return {"allocated_bytes": int(cuda.max_memory_allocated(device)),
                "reserved_bytes": int(cuda.max_memory_reserved(device))}
    except RuntimeError:
        return {"allocated_bytes": None, "reserved_bytes": None}


def _larger(a, b):
    return b if a is None else a if b is None else max(a, b)
